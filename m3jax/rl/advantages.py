"""Outcome advantages: GRPO group normalisation and TAURA per-turn entropy rescaling.

Trajectories of one question are stored contiguously: rows `[g·G, (g+1)·G)` form group g, so a group is a
reshape, not a scatter (static shapes, no host-side dictionaries keyed by uid as in the reference).
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Float, Int


class AdvantageError(ValueError):
  """Rewards do not form whole groups, or a TAURA input is inconsistent."""


def grpo_advantages(rewards: Float[Array, "N"], group_size: int, *, eps: float = 1e-6,
                    norm_by_std: bool = True) -> Float[Array, "N"]:
  """(R − mean_group) / (std_group + eps), unbiased std (N−1) as in the reference.

  A group of one has zero advantage: R − mean is 0, and its std (undefined with N−1) is taken as 1. One sample
  says nothing about how good an action is relative to the policy's others, so it must not push the policy (the
  raw reward would act as a REINFORCE signal with no baseline); only the KL term still acts on such rows.
  """
  rewards = jnp.asarray(rewards, jnp.float32)
  if group_size < 1 or rewards.shape[0] % group_size:
    raise AdvantageError(f"{rewards.shape[0]} rewards do not split into groups of {group_size}")
  r = rewards.reshape(-1, group_size)
  if group_size == 1:
    return jnp.zeros_like(rewards)
  centered = r - r.mean(axis=1, keepdims=True)
  if norm_by_std:
    centered = centered / (r.std(axis=1, ddof=1, keepdims=True) + eps)
  return centered.reshape(-1)


def turn_entropy_weights(entropy: Float[Array, "N T"], turn_ids: Int[Array, "N T"], num_turns: int, *,
                         eps: float = 1e-6, max_weight: float | None = None) -> Float[Array, "N T"]:
  """TAURA per-token weight: the token's turn mean entropy divided by the trajectory's mean over its turns.

  A turn where the policy was uncertain (high mean token entropy, typically the "what to search next"
  decisions) gets weight > 1, routine turns < 1; the weights of a trajectory's turns average to 1, so the total
  credit of a trajectory is unchanged. `turn_ids[n, t]` is the turn index of a generated token, −1 elsewhere;
  `max_weight` optionally caps the weight. Entropy is a detached statistic of the behaviour policy.
  """
  turn_ids = jnp.asarray(turn_ids)
  if entropy.shape != turn_ids.shape:
    raise AdvantageError(f"entropy {entropy.shape} and turn_ids {turn_ids.shape} differ in shape")
  onehot = (turn_ids[..., None] == jnp.arange(num_turns)).astype(jnp.float32)  # [N, T, K]
  count = onehot.sum(axis=1)  # [N, K]
  turn_h = jnp.einsum("ntk,nt->nk", onehot, entropy.astype(jnp.float32)) / jnp.maximum(count, 1.0)
  present = (count > 0).astype(jnp.float32)
  mean_h = (turn_h * present).sum(-1, keepdims=True) / jnp.maximum(present.sum(-1, keepdims=True), 1.0)
  w = present * turn_h / (mean_h + eps)
  if max_weight is not None:
    w = jnp.minimum(w, max_weight)
  return jnp.einsum("ntk,nk->nt", onehot, w)


def token_advantages(seq_adv: Float[Array, "N"], mask: Float[Array, "N T"], *,
                     entropy: Float[Array, "N T"] | None = None, turn_ids: Int[Array, "N T"] | None = None,
                     num_turns: int = 0, max_weight: float | None = None) -> Float[Array, "N T"]:
  """Broadcasts sequence advantages to generated tokens (GRPO), optionally rescaled per turn (TAURA)."""
  adv = jnp.asarray(seq_adv, jnp.float32)[:, None] * jnp.asarray(mask, jnp.float32)
  if entropy is None:
    return adv
  if turn_ids is None or num_turns < 1:
    raise AdvantageError("TAURA needs turn_ids and num_turns >= 1")
  return adv * turn_entropy_weights(entropy, turn_ids, num_turns, max_weight=max_weight)
