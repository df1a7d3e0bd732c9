"""The batched, incremental control loop (reference §4): reason, search the memory, answer within 5 rounds.

All unfinished questions of a batch (over any number of graphs) advance together: one policy call per round
generates every active row's turn, then one searcher call runs every row's query. Nothing is re-rendered: the
policy appends each tool result to its row (KV continuation for the LLM policy). Every token, mask bit and
log-prob lands in the question's `Trajectory`.

Protocol details kept from the reference: the instruction (plus the last-round suffix) is appended to the user
message before each generation; "character id" in the query selects the node route; the clip route excludes clips
already returned to this question (`current_clips`, filtered after top-k by the searcher); `before_clip` is passed
with every search; a format error is an empty search; no search runs after the last round (the training loop's
behaviour; the inference script's last-round search is wasted work), so a last-round [Search] leaves the
question unanswered.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol, Sequence

from m3jax.agent.parsing import parse_turn, route_for
from m3jax.agent.policy import Policy, Turn
from m3jax.agent.prompts import FIRST_USER_MESSAGE, round_suffix, search_result_message, system_message
from m3jax.agent.trajectory import RoundRecord, Trajectory
from m3jax.memory.search import SearchRequest, SearchResult


class Searcher(Protocol):
  """The memory's search-tool seam (`m3jax.memory.search.MemorySearcher` implements it)."""

  def search(self, requests: list[SearchRequest]) -> list[SearchResult]:
    ...


@dataclasses.dataclass(frozen=True)
class ControlConfig:
  """Loop limits. Retrieval parameters (top-k, threshold) belong to the searcher's own config.
  `inter_turn_instruction=False` leaves the per-round instruction out of every tool-result message (the paper's
  ablation); the first user message keeps it, so the policy still learns the format once."""
  max_rounds: int = 5
  inter_turn_instruction: bool = True

  def __post_init__(self):
    if self.max_rounds < 1:
      raise ValueError(f"ControlConfig.max_rounds must be >= 1, got {self.max_rounds}")


@dataclasses.dataclass(frozen=True)
class Question:
  """One question bound to a memory graph (`graph_index` into the searcher's graphs)."""
  question_id: str
  question: str
  answer: str
  graph_index: int
  graph_key: str = ""
  before_clip: int | None = None
  question_types: tuple[str, ...] = ()
  multiple_choice: bool = False


class Controller:
  """Runs batches of questions through a policy and a searcher."""

  def __init__(self, policy: Policy, searcher: Searcher, config: ControlConfig = ControlConfig()):
    self.policy = policy
    self.searcher = searcher
    self.config = config

  def run(self, questions: Sequence[Question]) -> list[Trajectory]:
    """Answers all `questions` together; returns one trajectory per question, in order."""
    if not questions:
      return []
    rounds = self.config.max_rounds
    trajs = [Trajectory(question_id=q.question_id, question=q.question, ground_truth=q.answer,
                        graph_key=q.graph_key, before_clip=q.before_clip, question_types=list(q.question_types),
                        multiple_choice=q.multiple_choice) for q in questions]
    conversations = [[system_message(q.question),
                      {"role": "user", "content": FIRST_USER_MESSAGE + round_suffix(0, rounds, q.multiple_choice)}]
                     for q in questions]
    active = list(range(len(questions)))
    turns = _checked(self.policy.begin(conversations), len(active))
    for round_index in range(rounds):
      if round_index > 0:
        turns = _checked(self.policy.step(active, messages), len(active))
      active, messages = self._consume(questions, trajs, active, turns, round_index)
      if not active:
        break
    return trajs

  def _consume(self, questions: Sequence[Question], trajs: list[Trajectory], active: list[int], turns: list[Turn],
               round_index: int) -> tuple[list[int], list[str]]:
    """Records the turns, runs every requested search in one call, and builds the next user messages."""
    last = round_index == self.config.max_rounds - 1
    continuing: list[int] = []
    results: dict[int, dict[str, list[str]]] = {}
    requests: list[SearchRequest] = []
    request_rows: list[int] = []
    for row, turn in zip(active, turns):
      traj = trajs[row]
      traj.append_tokens(turn.context_ids, generated=False)
      traj.append_tokens(turn.gen_ids, generated=True, logprobs=turn.logprobs)
      parsed = parse_turn(turn.text)
      traj.rounds.append(RoundRecord(action=parsed.action, content=parsed.content, text=turn.text,
                                     num_generated=len(turn.gen_ids), finish_reason=turn.finish_reason))
      if parsed.action == "answer":
        traj.response = parsed.content
        continue
      if last:
        continue
      continuing.append(row)
      if parsed.action == "format_error":
        results[row] = {}
        continue
      q = questions[row]
      route = route_for(parsed.content)
      traj.rounds[-1].route = route
      requests.append(SearchRequest(graph_index=q.graph_index, query=parsed.content, route=route,
                                    before_clip=q.before_clip,
                                    exclude_clips=tuple(traj.current_clips) if route == "clip" else ()))
      request_rows.append(row)
    if requests:
      found = self.searcher.search(requests)
      if len(found) != len(requests):
        raise ValueError(f"searcher returned {len(found)} results for {len(requests)} requests")
      for row, request, result in zip(request_rows, requests, found):
        clips = sorted(int(c) for c in result.clips)
        trajs[row].rounds[-1].retrieved_clips = clips
        if request.route == "clip":
          trajs[row].current_clips.extend(c for c in clips if c not in trajs[row].current_clips)
        results[row] = dict(result.memories)
    messages = []
    for row in continuing:
      text = search_result_message(results[row])
      trajs[row].rounds[-1].result_text = text
      suffix = round_suffix(round_index + 1, self.config.max_rounds, questions[row].multiple_choice)
      messages.append(text + suffix if self.config.inter_turn_instruction else text)
    return continuing, messages


def _checked(turns: list[Turn], expected: int) -> list[Turn]:
  if len(turns) != expected:
    raise ValueError(f"policy returned {len(turns)} turns for {expected} active conversations")
  return turns
