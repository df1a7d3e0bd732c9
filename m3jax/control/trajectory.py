"""The full record of one question's control episode, in the form the RL learner trains on.

WHY token-level: the learner needs the exact sampled token ids, which of them the policy generated (the loss
mask) and their log-probs under the sampling distribution (the "old" log-probs of the PPO ratio). Recording them
at sampling time avoids the reference's re-render of the conversation, which silently changes the trained tokens
(§5.6: earlier thinking is dropped by the Qwen3 template). Per-round records carry what the evaluation and the
reward shaping need (actions, queries, retrieved clips, empty searches, format errors).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from jaxtyping import Bool, Float, Int

from m3jax.control.parsing import Action, Route


@dataclasses.dataclass
class RoundRecord:
  """One round: what the policy said and what the memory answered."""
  action: Action
  content: str | None          # the answer / the query; None for a format error
  text: str                    # the decoded generated text of the turn
  route: Route | None = None   # for searches that ran
  retrieved_clips: list[int] = dataclasses.field(default_factory=list)
  result_text: str = ""        # the user message appended after the turn ("" when the episode ended)
  num_generated: int = 0
  finish_reason: str = ""

  @property
  def empty_search(self) -> bool:
    """A search turn (or format error) whose result carried no memory, as the reward shaping counts it."""
    return self.action != "answer" and not self.retrieved_clips


@dataclasses.dataclass
class Trajectory:
  """Everything about one question's episode. Token arrays are aligned: position t holds token t of the whole
  conversation, `generated[t]` says the policy sampled it, `logprobs[t]` is its log-prob and `entropies[t]` its
  distribution's entropy where the sampler recorded it (0 elsewhere)."""
  question_id: str
  question: str
  ground_truth: str
  graph_key: str
  before_clip: int | None = None
  question_types: list[str] = dataclasses.field(default_factory=list)
  multiple_choice: bool = False
  token_ids: Int[np.ndarray, "L"] = dataclasses.field(default_factory=lambda: np.zeros((0,), np.int32))
  generated: Bool[np.ndarray, "L"] = dataclasses.field(default_factory=lambda: np.zeros((0,), bool))
  logprobs: Float[np.ndarray, "L"] = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
  entropies: Float[np.ndarray, "L"] = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
  rounds: list[RoundRecord] = dataclasses.field(default_factory=list)
  response: str | None = None  # the final answer; None when the episode ended without [Answer]
  current_clips: list[int] = dataclasses.field(default_factory=list)
  extra: dict[str, Any] = dataclasses.field(default_factory=dict)

  @property
  def finished(self) -> bool:
    return self.response is not None

  @property
  def num_searches(self) -> int:
    return sum(r.action == "search" for r in self.rounds)

  @property
  def num_format_errors(self) -> int:
    return sum(r.action == "format_error" for r in self.rounds)

  @property
  def num_empty_searches(self) -> int:
    return sum(r.empty_search for r in self.rounds if r.result_text)

  def append_tokens(self, ids: list[int], generated: bool, logprobs: np.ndarray | None = None,
                    entropies: np.ndarray | None = None) -> None:
    """Appends context (`generated=False`) or sampled tokens with their log-probs (and entropies, when
    recorded: one per token, or none)."""
    ids_arr = np.asarray(ids, np.int32)
    if generated:
      if logprobs is None or len(logprobs) != len(ids_arr):
        raise ValueError(f"generated tokens need one log-prob each: {len(ids_arr)} ids, "
                         f"{None if logprobs is None else len(logprobs)} log-probs")
      lp = np.asarray(logprobs, np.float32)
    else:
      lp = np.zeros((len(ids_arr),), np.float32)
    ent = np.zeros((len(ids_arr),), np.float32)
    if generated and entropies is not None and len(entropies):
      if len(entropies) != len(ids_arr):
        raise ValueError(f"{len(ids_arr)} generated ids but {len(entropies)} entropies")
      ent = np.asarray(entropies, np.float32)
    self.token_ids = np.concatenate([self.token_ids, ids_arr])
    self.generated = np.concatenate([self.generated, np.full((len(ids_arr),), generated)])
    self.logprobs = np.concatenate([self.logprobs, lp])
    self.entropies = np.concatenate([self.entropies, ent])

  def to_json(self) -> dict[str, Any]:
    """A JSON-able dict (the eval JSONL line); arrays become lists."""
    out = dataclasses.asdict(self)
    out["token_ids"] = self.token_ids.tolist()
    out["generated"] = self.generated.astype(np.int8).tolist()
    out["logprobs"] = [round(float(x), 6) for x in self.logprobs]
    if self.entropies.any():  # recorded for RL (TAURA) only: evaluation records stay as they were
      out["entropies"] = [round(float(x), 6) for x in self.entropies]
    else:
      del out["entropies"]
    out["finished"] = self.finished
    return out

  @classmethod
  def from_json(cls, data: dict[str, Any]) -> "Trajectory":
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in data.items() if k in fields}
    kwargs["rounds"] = [RoundRecord(**r) for r in data.get("rounds", [])]
    kwargs["token_ids"] = np.asarray(data.get("token_ids", []), np.int32)
    kwargs["generated"] = np.asarray(data.get("generated", []), bool)
    kwargs["logprobs"] = np.asarray(data.get("logprobs", []), np.float32)
    kwargs["entropies"] = np.asarray(data.get("entropies", np.zeros(len(kwargs["logprobs"]))), np.float32)
    return cls(**kwargs)
