"""Behaviour-cloning warm start for DAPO: imitate a hindsight expert that follows the control protocol.

WHY: DAPO's dynamic sampling keeps only groups with mixed outcomes, so a policy that never answers correctly gets
no gradient at all. The shipped SmolLM2-135M controller is such a policy (0/32 held-out, greedy or sampled, free
or constrained to the action format: it writes code, restates the instruction or answers "{content}"). A few
supervised steps on protocol-following trajectories give DAPO a start with some successes to reinforce.

The expert plays the real protocol against the real searcher, so its trajectories have exactly the LLM policy's
token layout (same ChatML pieces, same `generated` mask, end-of-turn token included). It searches the way the
instruction recommends (`expert_turn`) and answers with the ground truth once the retrieved memories contain it
(normalised containment, the `contains` judge's rule); the last round always answers. It sees the ground truth — that is what makes it an expert — so warm-start
questions must come from training graphs only (`RLProgram` draws them from its training records).
"""

from __future__ import annotations

import dataclasses
import re
import time
from typing import Sequence

import numpy as np
from tqdm import tqdm

from m3jax import checkpoint
from m3jax.chunks import ChunkBudget
from m3jax.control.controller import Controller, Question
from m3jax.eval.judges import normalize_answer
from m3jax.control.policy import ChatTokenizer, Turn, continuation_text
from m3jax.control.answer import CHARACTER_TAG_RE, named_people
from m3jax.control.prompts import END_OF_TURN, INSTRUCTION, SEARCH_RESULT_PREFIX, Message, render_chatml
from m3jax.data.questions import NOT_IN_MEMORY
from m3jax.rl import rollout
from m3jax.rl.learner import Learner

_INSTRUCTION_START = INSTRUCTION.split("{content}")[0]  # where the round suffix begins in a user message
EXPERT_STYLES = ("hindsight", "ladder", "direct")
_NAME_OF_RE = re.compile(CHARACTER_TAG_RE.pattern + r"'s name is ([A-Z][a-z]+)")


def expert_turn(question: Question, seen: str, round_index: int, max_rounds: int, asked: Sequence[str],
                style: str = "hindsight") -> str:
  """The expert's turn text given everything retrieved so far (`seen`) and its previous queries (`asked`).

  Memories name people only by id, so a query with a name finds little: the expert first asks for the id of a
  person the question names, then searches with the id in place of the name, and looks up the name of an id
  when the answer is a person — the route the instruction itself recommends.

  `style="hindsight"` (the first shipped adapter's teacher) answers as soon as any result holds the truth and
  otherwise repeats its last query until the last round, where it answers the truth: its stopping rule rests on
  knowledge a student cannot see, so the student learnt to answer after one search, found or not (held-out:
  1.3 searches per question, a guess whenever that search missed). `style="ladder"` and `style="direct"` are
  teachers a student can imitate (`ladder_turn`, `direct_turn`)."""
  if style == "ladder":
    return ladder_turn(question, seen, round_index, max_rounds, asked)
  if style == "direct":
    return direct_turn(question, seen, round_index, max_rounds, asked)
  found = _found(question.answer, seen)
  if round_index == max_rounds - 1 or (round_index > 0 and found):
    return f"Action: [Answer]\nContent: {question.answer}"
  candidates = _lookups(question.question, seen) + _name_lookups(seen)
  fresh = [q for q in candidates if q not in asked]
  return f"Action: [Search]\nContent: {(fresh or candidates)[0]}"


def ladder_turn(question: Question, seen: str, round_index: int, max_rounds: int, asked: Sequence[str]) -> str:
  """A teacher whose decisions follow from what the student sees. It resolves the named people to ids, then
  searches the question with the ids in place (the fact search) — in key words as well when that finds nothing —
  and, when the answer is a person, looks up the names of the ids it has seen; it never repeats a query. After
  the fact search it answers: the truth for an answerable question (the evidence is then in view: an episode's
  few clips are all retrieved by then, and a move or a yes/no is read, not quoted), `NOT_IN_MEMORY` for an
  unanswerable one or when no search returned anything. So the student learns one search route and a reading
  decision at its end, answer or decline, instead of guessing after whichever search came first. Measured on top
  of the shipped adapter it declined more unanswerable questions but also more answerable ones, since the fact
  search after an id lookup often comes back empty (clips already retrieved are excluded): see the controller's
  MODEL_CARD.md."""
  lookups = _lookups(question.question, seen)
  fact = lookups[-1]
  fact_done = fact in asked or _keywords(fact) in asked
  retrieved = seen.count(SEARCH_RESULT_PREFIX) > seen.count(SEARCH_RESULT_PREFIX + "{}")  # some memory seen
  unanswerable = question.answer == NOT_IN_MEMORY
  needs_name = not unanswerable and not _found(question.answer, seen) and bool(_name_lookups(seen))
  ladder = lookups + ([_keywords(fact)] if fact_done and not retrieved else []) + (
      _name_lookups(seen) if fact_done and needs_name else [])
  fresh = [q for q in dict.fromkeys(ladder) if q and q not in asked]
  if fresh and round_index < max_rounds - 1:
    return f"Action: [Search]\nContent: {fresh[0]}"
  answer = NOT_IN_MEMORY if unanswerable or not retrieved else question.answer
  return f"Action: [Answer]\nContent: {answer}"


def direct_turn(question: Question, seen: str, round_index: int, max_rounds: int, asked: Sequence[str]) -> str:
  """Answers right after the first search that returned memories (the truth, or NOT_IN_MEMORY for an unanswerable
  question), so the reading decision is made on the result in view; an empty result is retried in key words
  once, then declined; a person's name is looked up first when the answer is a person not yet named. Measured on
  top of the stage-1 adapter (15 steps, the shipped controller's stage 2): held-out 0.573 against its 0.500,
  unanswerable questions declined 6/10 against 2/10 (the controller's MODEL_CARD.md)."""
  retrieved = seen.count(SEARCH_RESULT_PREFIX) > seen.count(SEARCH_RESULT_PREFIX + "{}")
  unanswerable = question.answer == NOT_IN_MEMORY
  first = _lookups(question.question, seen)[0]
  names = [q for q in _name_lookups(seen) if q not in asked]
  if retrieved and not unanswerable and not _found(question.answer, seen) and names and round_index < max_rounds - 1:
    return f"Action: [Search]\nContent: {names[0]}"
  if retrieved or round_index == max_rounds - 1 or (asked and _keywords(first) in asked):
    return f"Action: [Answer]\nContent: {NOT_IN_MEMORY if unanswerable or not retrieved else question.answer}"
  query = first if not asked else _keywords(asked[-1])
  return f"Action: [Search]\nContent: {query}"


def _found(answer: str, seen: str) -> bool:
  gold = normalize_answer(answer)
  return bool(gold) and f" {gold} " in f" {normalize_answer(seen)} "


def _lookups(question: str, seen: str) -> list[str]:
  """Id lookups for the named people without a known id, then the question with the known ids in place."""
  ids = {name: tag for tag, name in _NAME_OF_RE.findall(seen)}
  names = named_people(question)
  out = [f"What is the character id of {name}" for name in names if name not in ids]
  for name in names:
    if name in ids:
      question = re.sub(rf"\b{re.escape(name)}\b", f"<{ids[name]}>", question)
  return out + [question]


def _name_lookups(seen: str) -> list[str]:
  ids = {tag for tag, _ in _NAME_OF_RE.findall(seen)}
  return [f"What is the name of <{tag}>" for tag in dict.fromkeys(CHARACTER_TAG_RE.findall(seen)) if tag not in ids]


_STOP = set("what who whom whose where which when why how does do did is are was were will would should could can "
            "the a an of to in on for at i you me my your it its this that there here and or if else apart from "
            "with by about".split())


def _keywords(query: str) -> str:
  """The query's content words (ids and names kept): a short query a sentence embedding matches against memory
  lines better than the question form, which often scores below the search threshold."""
  words = re.findall(r"<[^>]+>|[A-Za-z']+", query)
  return " ".join(w for w in words if w.lower() not in _STOP)


class ExpertPolicy:
  """A `Policy` that emits `expert_turn` texts as token ids of `tokenizer` (one instance per controller run)."""

  def __init__(self, questions: Sequence[Question], tokenizer: ChatTokenizer, max_rounds: int,
               style: str = "hindsight"):
    if style not in EXPERT_STYLES:
      raise ValueError(f"expert style {style!r}; expected one of {EXPERT_STYLES}")
    self.questions, self.tokenizer, self.max_rounds, self.style = list(questions), tokenizer, max_rounds, style
    self.end_ids = tokenizer.encode(END_OF_TURN, add_special_tokens=False)
    self._seen = [""] * len(self.questions)
    self._asked: list[list[str]] = [[] for _ in self.questions]
    self._round = 0

  def begin(self, conversations: Sequence[Sequence[Message]]) -> list[Turn]:
    if len(conversations) != len(self.questions):
      raise ValueError(f"{len(conversations)} conversations for {len(self.questions)} questions")
    self._round = 0
    contexts = [self.tokenizer.encode(render_chatml(c), add_special_tokens=False) for c in conversations]
    return [self._turn(row, ctx) for row, ctx in enumerate(contexts)]

  def step(self, rows: Sequence[int], user_messages: Sequence[str]) -> list[Turn]:
    self._round += 1
    turns = []
    for row, message in zip(rows, user_messages):
      self._seen[row] += " " + message.split(_INSTRUCTION_START, 1)[0]  # the tool result, not the instruction
      ctx = self.tokenizer.encode(continuation_text("stop", message), add_special_tokens=False)
      turns.append(self._turn(row, ctx))
    return turns

  def _turn(self, row: int, context: list[int]) -> Turn:
    text = expert_turn(self.questions[row], self._seen[row], self._round, self.max_rounds, self._asked[row],
                       self.style)
    if text.startswith("Action: [Search]"):
      self._asked[row].append(text.split("Content: ", 1)[1])
    ids = self.tokenizer.encode(text, add_special_tokens=False) + list(self.end_ids)
    return Turn(text=text + END_OF_TURN, context_ids=context, gen_ids=ids,
                logprobs=np.zeros((len(ids),), np.float32), finish_reason="stop")

def clone(program, ckpt: checkpoint.Checkpointer | None = None,
          budget: ChunkBudget | None = None) -> list[dict[str, float]]:
  """`warm_start_steps` behaviour-cloning steps on expert trajectories of training questions (in a seeded
  order), then a fresh DAPO learner on the cloned parameters. Returns one metrics dict per step.

  With `ckpt`, the cloner's state is saved after every step and a restart continues from the newest one: every
  step is a pure function of (seed, step), so the result equals an uninterrupted warm start's. With `budget`,
  a chunk that runs out stops between steps (fewer than `warm_start_steps` dicts come back, and the DAPO
  learner is left as it was)."""
  c = program.cfg
  if not c.warm_start_steps:
    return []
  loss = dataclasses.replace(c.learner.loss, objective="nll", kl_coef=0.0)
  optim = dataclasses.replace(c.learner.optim, lr=c.warm_start_lr, schedule="constant", warmup_steps=0)
  cloner = Learner(program.model, dataclasses.replace(c.learner, loss=loss, optim=optim, epochs=1, mini_batches=1),
                   mesh=program.mesh)
  order = np.random.default_rng(c.seed + 1).permutation(len(program.train_records))
  n = c.warm_start_questions
  history, start = [], 0
  if ckpt is not None and ckpt.latest_step() is not None:
    state, meta = ckpt.restore(cloner.state())
    cloner.restore(state)
    start, history = int(meta["step"]), list(meta["history"])
  for step in tqdm(range(start, c.warm_start_steps), initial=start, total=c.warm_start_steps,
                   desc="warm start", unit="step", disable=program.process != 0):
    if budget is not None and program._chunk_over(budget):
      program.progress = f"warm start {step}/{c.warm_start_steps}"
      return history
    t0 = time.perf_counter()
    records = [program.train_records[order[(step * n + i) % len(order)]] for i in range(n)]
    questions = rollout.group_questions(records, 1)
    expert = ExpertPolicy(questions, program.tokenizer, c.max_rounds, c.warm_start_expert)
    trajs = Controller(expert, program.searcher, c.control).run(questions)
    batch, stats = rollout.build_batch(trajs, n, seq_bucket=c.seq_bucket, max_len=c.max_seq_len,
                                       pad_id=program.pad_id)
    batch["advantages"] = np.zeros_like(batch["mask"])
    del batch["turn_ids"], batch["entropy"]
    metrics = cloner.update(batch, seed=step)[0]
    metrics.update(stats, time_s=time.perf_counter() - t0)
    history.append(metrics)
    if ckpt is not None:
      ckpt.save(step + 1, cloner.state(), {"step": step + 1, "history": history})
    if budget is not None:
      budget.step_done()
  program.learner = Learner(program.model, c.learner, mesh=program.mesh, ref_model=program.ref_model)
  return history
