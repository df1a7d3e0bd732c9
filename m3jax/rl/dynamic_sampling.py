"""DAPO dynamic sampling: train only on groups whose OUTCOME rewards differ, refill until the batch is full.

A group whose G trajectories all got the same outcome has zero GRPO advantage and only dilutes the token
mean. The reference filters on the total reward (bonus included, §5.5), so a group where every answer was
wrong but one trajectory searched more survives and trains on pure shaping; here the filter looks at the
outcome only. Unlike the reference, generation rounds are capped (a task the policy always or never solves
cannot stall training), and surplus groups are dropped unless `carry_over` is set, so by default every
trained trajectory came from the current policy.

Pass-rate selection (`skip_after` > 0): a round of G samples per question is spent for nothing on a question the
policy always or never solves. `PassRates` keeps each question's recent outcomes over earlier rollouts; a
question whose last `skip_after` outcomes were all equal is skipped when drawn, for `skip_for` steps (the policy
moves, so a skipped question comes back). Each round then draws just enough questions for the groups still
missing at the yield the last rounds had (`round_size`), up to `oversample` × the batch, instead of a full batch
per round and a second round for the shortfall.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np


class DynamicSamplingError(ValueError):
  """Bad dynamic-sampling settings."""


@dataclasses.dataclass(frozen=True)
class DynamicSamplingConfig:
  enabled: bool = True
  max_rounds: int = 4  # generation rounds per training batch
  carry_over: bool = False  # keep surplus groups for the next batch (stale, as the reference does)
  skip_after: int = 0  # > 0: skip questions whose last this-many outcomes were all equal (0 = draw every question)
  skip_for: int = 10   # training steps a saturated question stays skipped
  oversample: float = 1.0  # a round draws up to this × batch questions, sized by the recent yield (1 = a batch)

  def __post_init__(self):
    if self.max_rounds < 1:
      raise DynamicSamplingError(f"max_rounds={self.max_rounds} must be >= 1")
    if self.skip_after < 0 or self.skip_for < 1 or self.oversample < 1:
      raise DynamicSamplingError(f"skip_after >= 0, skip_for >= 1 and oversample >= 1 are required; got "
                                 f"{self.skip_after}, {self.skip_for}, {self.oversample}")


class PassRates:
  """Each question's recent outcomes (question id -> last outcomes, newest last) and when it saturated."""

  def __init__(self, keep: int):
    self.keep = max(int(keep), 1)
    self.outcomes: dict[str, list[float]] = {}
    self.saturated_at: dict[str, int] = {}

  def record(self, question_id: str, outcomes: Sequence[float], step: int) -> None:
    last = (self.outcomes.get(question_id, []) + [float(o) for o in outcomes])[-self.keep:]
    self.outcomes[question_id] = last
    if len(last) == self.keep and min(last) == max(last):
      self.saturated_at[question_id] = step
    else:
      self.saturated_at.pop(question_id, None)

  def skips(self, question_id: str, step: int, skip_for: int) -> bool:
    at = self.saturated_at.get(question_id)
    return at is not None and step - at < skip_for

  def state(self) -> dict[str, Any]:
    return {"outcomes": self.outcomes, "saturated_at": self.saturated_at}

  def restore(self, state: dict[str, Any]) -> None:
    self.outcomes = {k: list(v) for k, v in state["outcomes"].items()}
    self.saturated_at = {k: int(v) for k, v in state["saturated_at"].items()}


@dataclasses.dataclass
class Group:
  """G trajectories of one question; `payload` is whatever the rollout produced, `outcomes` is [G]."""

  payload: Any
  outcomes: np.ndarray
  question_id: str = ""  # the question's id, for pass rates ("" = not tracked)


def is_informative(outcomes: np.ndarray) -> bool:
  """Mixed outcomes (for 0/1 rewards: 0 < ΣR < G). A size-1 group is kept, as in the reference."""
  outcomes = np.asarray(outcomes)
  return outcomes.size == 1 or bool(outcomes.max() != outcomes.min())


class DynamicBatcher:
  """Calls `generate(n)` (one rollout round of n questions → list of groups) until `batch_groups` informative
  groups exist. `multiple`: round sizes are rounded up to it (the number of processes sharing a round)."""

  def __init__(self, cfg: DynamicSamplingConfig, batch_groups: int, multiple: int = 1):
    if batch_groups < 1:
      raise DynamicSamplingError(f"batch_groups={batch_groups} must be >= 1")
    self.cfg = cfg
    self.batch_groups = batch_groups
    self.multiple = multiple
    self._buffer: list[Group] = []
    self.rates = PassRates(cfg.skip_after)
    self.recent_yield: float | None = None  # informative share of the last fill's groups

  def round_size(self, missing: int) -> int:
    """Questions to draw for `missing` groups: a batch without oversampling (or before any yield is known), else
    missing / recent yield, between `missing` and `oversample` × the batch."""
    if self.cfg.oversample <= 1 or not self.cfg.enabled or self.recent_yield is None:
      return self.batch_groups
    cap = math.ceil(self.cfg.oversample * self.batch_groups)
    n = min(cap, max(missing, math.ceil(missing / max(self.recent_yield, 1e-6))))
    return -(-n // self.multiple) * self.multiple

  def state(self) -> dict[str, Any]:
    """What a resumed run needs to draw and size rounds as the uninterrupted one (carried-over groups aside)."""
    return {"rates": self.rates.state(), "recent_yield": self.recent_yield}

  def restore(self, state: dict[str, Any]) -> None:
    self.rates.restore(state["rates"])
    self.recent_yield = state["recent_yield"]

  def skips(self, question_id: str, step: int) -> bool:
    """Whether a drawn question is skipped at `step` (it saturated within the last `skip_for` steps)."""
    return self.cfg.skip_after > 0 and self.rates.skips(question_id, step, self.cfg.skip_for)

  def fill(self, generate: Callable[[int], Sequence[Group]], step: int = 0) -> tuple[list[Group], dict[str, float]]:
    """Returns up to `batch_groups` groups (fewer only when the round cap is hit) and yield statistics. Groups
    whose payload has a `question_id` feed the pass rates."""
    kept = list(self._buffer)
    stale = len(kept)
    rounds = generated = informative = 0
    while len(kept) < self.batch_groups and rounds < self.cfg.max_rounds:
      groups = list(generate(self.round_size(self.batch_groups - len(kept))))
      rounds += 1
      generated += len(groups)
      good = [g for g in groups if not self.cfg.enabled or is_informative(g.outcomes)]
      informative += len(good)
      kept.extend(good)
      for g in groups:
        if g.question_id:
          self.rates.record(g.question_id, g.outcomes, step)
    if generated:
      self.recent_yield = informative / generated
    batch, rest = kept[:self.batch_groups], kept[self.batch_groups:]
    self._buffer = rest if self.cfg.carry_over else []
    stats = {
        "ds/rounds": float(rounds), "ds/generated_groups": float(generated),
        "ds/kept_groups": float(informative), "ds/yield": informative / max(generated, 1),
        "ds/batch_groups": float(len(batch)), "ds/hit_cap": float(len(batch) < self.batch_groups),
        "ds/stale_groups": float(min(stale, len(batch))), "ds/dropped_groups": float(len(rest) * (not self.cfg.carry_over)),
    }
    return batch, stats
