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

import re
from typing import Sequence

import numpy as np

from m3jax.agent.control import Question
from m3jax.agent.judges import normalize_answer
from m3jax.agent.policy import ChatTokenizer, Turn, continuation_text
from m3jax.agent.answer import CHARACTER_TAG_RE, named_people
from m3jax.agent.prompts import END_OF_TURN, INSTRUCTION, Message, render_chatml

_INSTRUCTION_START = INSTRUCTION.split("{content}")[0]  # where the round suffix begins in a user message
_NAME_OF_RE = re.compile(CHARACTER_TAG_RE.pattern + r"'s name is ([A-Z][a-z]+)")


def expert_turn(question: Question, seen: str, round_index: int, max_rounds: int, asked: Sequence[str]) -> str:
  """The expert's turn text given everything retrieved so far (`seen`) and its previous queries (`asked`).

  Memories name people only by id, so a query with a name finds little: the expert first asks for the id of a
  person the question names, then searches with the id in place of the name, and looks up the name of an id
  when the answer is a person — the route the instruction itself recommends."""
  gold = normalize_answer(question.answer)
  found = bool(gold) and f" {gold} " in f" {normalize_answer(seen)} "
  if round_index == max_rounds - 1 or (round_index > 0 and found):
    return f"Action: [Answer]\nContent: {question.answer}"
  ids = {name: tag for tag, name in _NAME_OF_RE.findall(seen)}
  names = named_people(question.question)
  candidates = []
  for name in names:
    if name not in ids:
      candidates.append(f"What is the character id of {name}")
  query = question.question
  for name in names:
    if name in ids:
      query = re.sub(rf"\b{re.escape(name)}\b", f"<{ids[name]}>", query)
  candidates.append(query)
  candidates += [f"What is the name of <{tag}>" for tag in dict.fromkeys(CHARACTER_TAG_RE.findall(seen))
                 if tag not in ids.values()]
  fresh = [q for q in candidates if q not in asked]
  return f"Action: [Search]\nContent: {(fresh or candidates)[0]}"


class ExpertPolicy:
  """A `Policy` that emits `expert_turn` texts as token ids of `tokenizer` (one instance per controller run)."""

  def __init__(self, questions: Sequence[Question], tokenizer: ChatTokenizer, max_rounds: int):
    self.questions, self.tokenizer, self.max_rounds = list(questions), tokenizer, max_rounds
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
    text = expert_turn(self.questions[row], self._seen[row], self._round, self.max_rounds, self._asked[row])
    if text.startswith("Action: [Search]"):
      self._asked[row].append(text.split("Content: ", 1)[1])
    ids = self.tokenizer.encode(text, add_special_tokens=False) + list(self.end_ids)
    return Turn(text=text + END_OF_TURN, context_ids=context, gen_ids=ids,
                logprobs=np.zeros((len(ids),), np.float32), finish_reason="stop")
