"""DAPO dynamic sampling: train only on groups whose OUTCOME rewards differ, refill until the batch is full.

A group whose G trajectories all got the same outcome has zero GRPO advantage and only dilutes the token
mean. The reference filters on the total reward (bonus included, §5.5), so a group where every answer was
wrong but one trajectory searched more survives and trains on pure shaping; here the filter looks at the
outcome only. Unlike the reference, generation rounds are capped (a task the policy always or never solves
cannot stall training), and surplus groups are dropped unless `carry_over` is set, so by default every
trained trajectory came from the current policy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import numpy as np


class DynamicSamplingError(ValueError):
  """Bad dynamic-sampling settings."""


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
  enabled: bool = True
  max_rounds: int = 4  # generation rounds per training batch
  carry_over: bool = False  # keep surplus groups for the next batch (stale, as the reference does)

  def __post_init__(self):
    if self.max_rounds < 1:
      raise DynamicSamplingError(f"max_rounds={self.max_rounds} must be >= 1")


@dataclasses.dataclass
class Group:
  """G trajectories of one question; `payload` is whatever the rollout produced, `outcomes` is [G]."""

  payload: Any
  outcomes: np.ndarray


def is_informative(outcomes: np.ndarray) -> bool:
  """Mixed outcomes (for 0/1 rewards: 0 < ΣR < G). A size-1 group is kept, as in the reference."""
  outcomes = np.asarray(outcomes)
  return outcomes.size == 1 or bool(outcomes.max() != outcomes.min())


class DynamicBatcher:
  """Calls `generate()` (one rollout round → list of groups) until `batch_groups` informative groups exist."""

  def __init__(self, cfg: DynamicSamplingConfig, batch_groups: int):
    if batch_groups < 1:
      raise DynamicSamplingError(f"batch_groups={batch_groups} must be >= 1")
    self.cfg = cfg
    self.batch_groups = batch_groups
    self._buffer: list[Group] = []

  def fill(self, generate: Callable[[], Sequence[Group]]) -> tuple[list[Group], dict[str, float]]:
    """Returns up to `batch_groups` groups (fewer only when the round cap is hit) and yield statistics."""
    kept = list(self._buffer)
    stale = len(kept)
    rounds = generated = informative = 0
    while len(kept) < self.batch_groups and rounds < self.cfg.max_rounds:
      groups = list(generate())
      rounds += 1
      generated += len(groups)
      good = [g for g in groups if not self.cfg.enabled or is_informative(g.outcomes)]
      informative += len(good)
      kept.extend(good)
    batch, rest = kept[:self.batch_groups], kept[self.batch_groups:]
    self._buffer = rest if self.cfg.carry_over else []
    stats = {
        "ds/rounds": float(rounds), "ds/generated_groups": float(generated),
        "ds/kept_groups": float(informative), "ds/yield": informative / max(generated, 1),
        "ds/batch_groups": float(len(batch)), "ds/hit_cap": float(len(batch) < self.batch_groups),
        "ds/stale_groups": float(min(stale, len(batch))), "ds/dropped_groups": float(len(rest) * (not self.cfg.carry_over)),
    }
    return batch, stats
