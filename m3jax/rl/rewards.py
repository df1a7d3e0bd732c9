"""Trajectory rewards: judge outcome + the reference's shaping bonuses + DAPO's overlong penalty (§5.3–5.4).

Every component is returned separately so it can be logged; `total` is what the advantage sees and
`outcome` alone is what dynamic sampling filters on. The outcome is the verdict of the judge `RewardConfig.judge`
names (the RL program makes it and passes each question's distractors to it).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


class RewardError(ValueError):
  """Inconsistent reward inputs or settings."""


@dataclasses.dataclass(frozen=True)
class RewardConfig:
  """Shaping values are the reference's (`consumer` bonus); overlong shaping is off unless max tokens is set."""

  shaping: bool = True  # the reference's `encourage_search` (yaml default True)
  character_penalty: float = -0.2  # per "<character" occurrence in the final answer
  format_error_penalty: float = -0.3  # per non-final turn that could not be parsed
  search_bonus: float = 0.1  # per non-final, non-answer turn
  empty_search_penalty: float = -0.15  # per non-final search that returned nothing
  # added when the final answer is judged wrong and is not a decline ("The memory does not say."): a guess then
  # scores below a decline, as the task asks ("say it does not know rather than quote a random memory"). Not
  # the reference's (its questions are all answerable); 0 keeps its rewards
  wrong_answer_penalty: float = 0.0
  overlong_max_tokens: int | None = None  # DAPO soft overlong punishment on generated-token counts
  overlong_buffer: int = 0
  overlong_factor: float = 1.0
  # the judge of `outcome`, by name (`judges.make_judge`: strict, contains, llm, ...; RLConfig.judge overrides it
  # when set). WHY strict: a policy paid by `contains` learned to list candidates and hedge yes/no answers
  judge: str = "strict"

  def __post_init__(self):
    if self.wrong_answer_penalty > 0:
      raise RewardError(f"wrong_answer_penalty={self.wrong_answer_penalty} must be <= 0 (a penalty)")
    if self.overlong_max_tokens is not None:
      if not 0 <= self.overlong_buffer <= self.overlong_max_tokens:
        raise RewardError(f"overlong_buffer={self.overlong_buffer} must be in [0, overlong_max_tokens]")


@dataclasses.dataclass(frozen=True)
class EpisodeStats:
  """What shaping needs to know about one trajectory (filled by `rollout.episode_stats`)."""

  answer: str | None  # None: never answered
  format_errors: int
  searches: int  # non-final turns that were not an answer
  empty_searches: int
  generated_tokens: int
  declined: bool = False  # the answer says the memory does not say (`judges.is_decline`)


def overlong_penalty(lengths: np.ndarray, max_tokens: int, buffer: int, factor: float) -> np.ndarray:
  """0 up to max−buffer tokens, then linear down to −factor at max, −factor beyond (DAPO eq. 13)."""
  lengths = np.asarray(lengths, np.float64)
  start = max_tokens - buffer
  if buffer == 0:
    return np.where(lengths > max_tokens, -factor, 0.0)
  ramp = (start - lengths) / buffer * factor
  return np.where(lengths <= start, 0.0, np.where(lengths <= max_tokens, ramp, -factor))


def reward_components(outcomes: Sequence[float], episodes: Sequence[EpisodeStats],
                      cfg: RewardConfig) -> dict[str, np.ndarray]:
  """Per-trajectory reward components (float64 [N]) and their sum `total`."""
  outcome = np.asarray(outcomes, np.float64)
  if outcome.shape != (len(episodes),):
    raise RewardError(f"{outcome.shape} outcomes for {len(episodes)} episodes")
  zeros = np.zeros_like(outcome)
  on = 1.0 if cfg.shaping else 0.0
  character = np.array([(e.answer or "").count("<character") for e in episodes], np.float64)
  parts = {
      "outcome": outcome,
      "character": cfg.character_penalty * character,
      "format": cfg.format_error_penalty * np.array([e.format_errors for e in episodes], np.float64),
      "search": on * cfg.search_bonus * np.array([e.searches for e in episodes], np.float64),
      "wrong_answer": cfg.wrong_answer_penalty * np.array(
          [o <= 0 and e.answer is not None and not e.declined for o, e in zip(outcome, episodes)], np.float64),
      "empty_search": on * cfg.empty_search_penalty * np.array([e.empty_searches for e in episodes], np.float64),
      "overlong": zeros if cfg.overlong_max_tokens is None else overlong_penalty(
          np.array([e.generated_tokens for e in episodes]), cfg.overlong_max_tokens, cfg.overlong_buffer,
          cfg.overlong_factor),
  }
  parts["total"] = sum(parts.values())
  return parts
