"""The batched, incremental control loop (reference §4): reason, search the memory, answer within 5 rounds.

All unfinished questions of a batch (over any number of graphs) advance together: one policy call per round
generates every active row's turn, then one searcher call runs every row's query. Nothing is re-rendered: the
policy appends each tool result to its row (KV continuation for the LLM policy). Every token, mask bit and
log-prob lands in the question's `Trajectory`.

Continuous batching (`run(questions, slots=N)`, a `SlotPolicy`): N slots of one KV cache; whenever a question
answers (or runs out of rounds) a waiting question takes its slot in the very next call, so a batch no longer
waits for its slowest question and the KV memory is bounded by N, however many questions there are. One call
mixes rows at different rounds. A question's trajectory does not depend on its neighbours: greedy, it equals the
static loop's (up to float rounding across batch shapes). `run_stream` is the same loop fed while it runs: a
question that arrives mid-run takes the next free slot (serve's `/ask` joins running questions this way). The
engine's scheduler (`m3jax.engine.slots.run_slots`) owns the slots; the controller says what a row does.

Protocol details kept from the reference: the instruction (plus the last-round suffix) is appended to the user
message before each generation; "character id" in the query selects the node route; the clip route excludes clips
already returned to this question (`current_clips`, filtered after top-k by the searcher); `before_clip` is passed
with every search; a format error is an empty search; no search runs after the last round (the training loop's
behaviour; the inference script's last-round search is wasted work), so a last-round [Search] leaves the
question unanswered.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Callable, Hashable, Mapping, Protocol, Sequence

from m3jax.control.parsing import parse_turn, route_for
from m3jax.control.policy import Policy, Turn
from m3jax.control.prompts import FIRST_USER_MESSAGE, round_suffix, search_result_message, system_message
from m3jax.control.trajectory import RoundRecord, Trajectory
from m3jax.engine.slots import run_slots
from m3jax.memory.search import SearchRequest, SearchResult


class Searcher(Protocol):
  """The memory's search-tool seam (`m3jax.memory.search.MemorySearcher` implements it)."""

  def search(self, requests: list[SearchRequest]) -> list[SearchResult]:
    ...


@dataclasses.dataclass(frozen=True)
class ControlConfig:
  """Loop limits and the protocol's per-round instruction. Retrieval parameters (top-k, threshold) belong to the
  searcher's own config.

  `inter_turn_instruction=False` leaves the instruction out of every tool-result message (the first user message
  keeps it, and the last round keeps its must-answer suffix): the paper's "no inter-turn instruction" ablation,
  and the protocol the shipped controller is trained with, where the repeated ~220-token instruction would be
  more than a third of every trajectory's tokens on a 2-core CPU for nothing a fine-tuned policy reads."""
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

  def run(self, questions: Sequence[Question], slots: int | None = None,
          on_finish: Callable[[int, Trajectory], None] | None = None) -> list[Trajectory]:
    """Answers all `questions`; returns one trajectory per question, in order. Without `slots` they run as one
    static batch; with `slots` (a `SlotPolicy`), through that many continuously refilled slots, and
    `on_finish(index, trajectory)` hears of each question as it ends (a long evaluation keeps what is done when
    it is stopped)."""
    if not questions:
      return []
    if slots is not None:
      waiting = collections.deque(enumerate(questions))
      done: dict[int, Trajectory] = {}

      def finish(i: int, traj: Trajectory) -> None:
        done[i] = traj
        if on_finish is not None:
          on_finish(i, traj)
      self.run_stream(lambda n, idle: [waiting.popleft() for _ in range(min(n, len(waiting)))] or None,
                      finish, slots)
      return [done[i] for i in range(len(questions))]
    trajs = [_trajectory(q) for q in questions]
    active = list(range(len(questions)))
    turns = _checked(self.policy.begin([self._conversation(q) for q in questions]), len(active))
    for round_index in range(self.config.max_rounds):
      if round_index > 0:
        turns = _checked(self.policy.step(active, messages), len(active))
      active, messages = self._consume(questions, trajs, active, turns, [round_index] * len(active))
      if not active:
        break
    return trajs

  def run_stream(self, take: Callable[[int, bool], list[tuple[Hashable, Question]] | None],
                 finish: Callable[[Hashable, Trajectory], None], slots: int) -> None:
    """Continuous batching fed while it runs (a `SlotPolicy`), so a question that arrives mid-run joins the next
    call instead of waiting for the running ones (serve's request-level joining). Before each call,
    `take(free_slots, idle)` hands over up to `free_slots` new `(key, question)` pairs; `idle` says no question
    is running, so it may block until one arrives. It returns None to stop (honoured when idle; otherwise once
    the running questions end). `finish(key, trajectory)` is called as soon as a question's trajectory ends. A
    question's trajectory does not depend on when it joined: greedy, it equals the static loop's."""
    if not hasattr(self.policy, "advance"):
      raise ValueError(f"continuous batching needs a slot policy (open/advance); {type(self.policy).__name__} "
                       "has none")
    running: dict[int, _Running] = {}  # by slot

    def step(starts: Sequence[tuple[int, int, Question]], continues: Sequence[int]) -> dict[int, Trajectory]:
      opened = []
      for slot, episode, q in starts:
        running[slot] = _Running(q, _trajectory(q))
        opened.append((slot, episode, self._conversation(q)))
      rows = [slot for slot, _, _ in starts] + list(continues)
      turns = _checked(self.policy.advance(opened, [(slot, running[slot].message) for slot in continues]), len(rows))
      continuing, messages = self._consume({s: running[s].question for s in rows},
                                           {s: running[s].trajectory for s in rows}, rows, turns,
                                           [running[s].round for s in rows])
      for slot, message in zip(continuing, messages):
        running[slot].message, running[slot].round = message, running[slot].round + 1
      going_on = set(continuing)
      return {slot: running.pop(slot).trajectory for slot in rows if slot not in going_on}

    # the policy may round `slots` up (its batch bucket): every slot it has is used
    run_slots(self.policy.open(slots), take, step, finish)

  def _conversation(self, q: Question) -> list[dict[str, str]]:
    return [system_message(q.question),
            {"role": "user", "content": FIRST_USER_MESSAGE + round_suffix(0, self.config.max_rounds, q.multiple_choice)}]

  def _consume(self, questions: Mapping[int, Question] | Sequence[Question],
               trajs: Mapping[int, Trajectory] | Sequence[Trajectory], active: list[int], turns: list[Turn],
               round_indices: list[int]) -> tuple[list[int], list[str]]:
    """Records the turns (row `active[i]` at round `round_indices[i]`), runs every requested search in one call,
    and builds the next user messages."""
    continuing: list[int] = []
    results: dict[int, dict[str, list[str]]] = {}
    requests: list[SearchRequest] = []
    request_rows: list[int] = []
    next_round = dict(zip(active, (r + 1 for r in round_indices)))
    for row, turn, round_index in zip(active, turns, round_indices):
      last = round_index == self.config.max_rounds - 1
      traj = trajs[row]
      traj.append_tokens(turn.context_ids, generated=False)
      traj.append_tokens(turn.gen_ids, generated=True, logprobs=turn.logprobs, entropies=turn.entropies)
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
                                    exclude_clips=tuple(traj.current_clips) if route == "clip" else (),
                                    context=q.question))
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
      messages.append(text + round_suffix(next_round[row], self.config.max_rounds, questions[row].multiple_choice,
                                          self.config.inter_turn_instruction))
    return continuing, messages


@dataclasses.dataclass
class _Running:
  """A question in a slot: its trajectory so far, the round it is at and the user message its next turn reads."""
  question: Question
  trajectory: Trajectory
  round: int = 0
  message: str = ""


def _trajectory(q: Question) -> Trajectory:
  return Trajectory(question_id=q.question_id, question=q.question, ground_truth=q.answer, graph_key=q.graph_key,
                    before_clip=q.before_clip, question_types=list(q.question_types),
                    multiple_choice=q.multiple_choice)


def _checked(turns: list[Turn], expected: int) -> list[Turn]:
  if len(turns) != expected:
    raise ValueError(f"policy returned {len(turns)} turns for {expected} active conversations")
  return turns
