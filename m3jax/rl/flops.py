"""Model FLOPs of a learner update: what the step must compute, to set its time against the machine's matmul rate.

WHY analytic: XLA's cost analysis counts a `lax.scan`/`while` body once, whatever its trip count, so it misses
most of a scanned-layer decoder. The count follows the MFU convention (PaLM, MaxText): useful work only, so
rematerialised forwards, padding and masked-out vocabulary work are not counted, and an implementation that
computes less than this (skipped sequence chunks) shows a higher rate rather than a smaller count.

Per real token (a row's first `length` positions) and layer, forward: the projections 2·d·(H·hd + 2·KV·hd)
+ 2·H·hd·d + 2·3·d·ff (gated MLP), and causal attention 4·H·hd·(t+1) at position t (QKᵀ and AV). The vocabulary
projection 2·d·V is counted at trained tokens only (mask = 1): the log-probs are needed nowhere else.
Backward: input gradients cost as much as the forward, weight gradients as much again for trained weights, and
attention (no weights) needs gradients for Q, K and V: 2× its forward. Full fine-tuning: 2× forward. LoRA: the
frozen projections and vocabulary need input gradients only (1×), plus each adapter's forward (2·r·(d_in + d_out)
per token on every targeted projection) and its 2× backward.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from m3jax.models.decoder import DecoderConfig


def _projection_shapes(cfg: DecoderConfig) -> dict[str, tuple[int, int]]:
  d, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
  ff = cfg.intermediate_size
  return {"q": (d, q), "k": (d, kv), "v": (d, kv), "o": (q, d), "gate": (d, ff), "up": (d, ff), "down": (ff, d)}


def learner_step_flops(cfg: DecoderConfig, lengths: Sequence[int], trained_tokens: int, lora_rank: int = 0,
                       lora_targets: Sequence[str] = ()) -> dict[str, float]:
  """Model FLOPs of one forward + backward over rows of `lengths` real tokens, `trained_tokens` of them trained
  (the mask's sum). Returns forward, backward and total FLOPs and the real token count."""
  lengths = np.asarray(lengths, np.float64)
  tokens = float(lengths.sum())
  shapes = _projection_shapes(cfg)
  proj = 2.0 * sum(a * b for a, b in shapes.values()) * cfg.num_layers * tokens
  # sum over rows of sum_{t<T} (t + 1) = T (T + 1) / 2 attended positions
  attn = 4.0 * cfg.num_heads * cfg.head_dim * cfg.num_layers * float((lengths * (lengths + 1) / 2).sum())
  vocab = 2.0 * cfg.hidden_size * cfg.vocab_size * float(trained_tokens)
  adapters = 2.0 * lora_rank * sum(sum(shapes[t]) for t in lora_targets) * cfg.num_layers * tokens
  forward = proj + attn + vocab + adapters
  weights = 1.0 if lora_rank else 2.0  # frozen under LoRA: input gradients only
  backward = weights * (proj + vocab) + 2.0 * attn + 2.0 * adapters
  return {"forward": forward, "backward": backward, "total": forward + backward, "tokens": tokens}


def rollout_flops(cfg: DecoderConfig, tokens: int, attended: int, logit_rows: int) -> float:
  """Model FLOPs of a forward pass over `tokens` tokens that together attend `attended` positions and produce
  `logit_rows` rows of vocabulary logits: a prefill (one logit row per prefilled row) or decode steps (one per
  sampled row-step, `tokens` = row-steps; `attended` 0 when unknown: the weights' FLOPs alone)."""
  proj = 2.0 * sum(a * b for a, b in _projection_shapes(cfg).values()) * cfg.num_layers * tokens
  attn = 4.0 * cfg.num_heads * cfg.head_dim * cfg.num_layers * float(attended)
  return proj + attn + 2.0 * cfg.hidden_size * cfg.vocab_size * float(logit_rows)


def decode_weight_bytes(cfg: DecoderConfig, itemsize: int = 4) -> int:
  """Bytes of the weights one decode step must read: every layer's projections and the vocabulary matrix."""
  return itemsize * (sum(a * b for a, b in _projection_shapes(cfg).values()) * cfg.num_layers
                     + cfg.hidden_size * cfg.vocab_size)
