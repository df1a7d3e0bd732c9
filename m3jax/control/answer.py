"""Answering questions about a memorized video: the LLM controller, or a deterministic rule-based baseline.

Both go through the memory's search tools only (`MemorySearcher`), never around them. The rule path follows the
protocol the controller is instructed to use: resolve a name with "What is the character id of NAME", search with
the character id, and turn ids back into names with "What is the name of <character_k>". It answers "who said X"
with the name of the speaker of the best-matching memory and any other question with the best-matching memory
itself (ids replaced by names): the floor a trained controller must beat, and a working path when the embedded
135M controller is too weak. It declines with `NOT_IN_MEMORY` when retrieval has nothing to go on: the search
returns no memory, or the question names people and none of them has an id in the memory.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from typing import Callable, Sequence

import numpy as np

from m3jax.control.controller import Question
from m3jax.control.trajectory import Trajectory
from m3jax.data.episodes import Episode
from m3jax.data.questions import NOT_IN_MEMORY
from m3jax.memory.search import MemorySearcher, SearchConfig, SearchRequest

# The search settings of every answering path (`m3jax ask`, the demo, the memory service): the reference
# control's tools (clip route: top-2 clips scoring >= 0.5; node route: top-20 memories, no threshold). Answers
# without an LLM retrieve through the node route, as the reference's character-id searches do: a question's
# words rarely reach the clip threshold against memories that name people by tag ("<face_3> likes tea.").
ASK_SEARCH = SearchConfig()
RETRIEVAL_ROUTE = "node"
_WHO_RE = re.compile(r"^\s*who\s+(?:said|says|mentioned|told)\s+(?:that\s+)?(.*?)\??\s*$", re.IGNORECASE)
CHARACTER_TAG_RE = re.compile(r"<(character_\d+|face_\d+|voice_\d+)>")
_ASKS_PERSON_RE = re.compile(r"^\s*who", re.IGNORECASE)
_CAPITAL_RE = re.compile(r"\b([A-Z][a-z]+)\b")
_OPENING_RE = re.compile(r"\s*([A-Z][a-z]+)\b")
_POSSESSIVE_OPENING_RE = re.compile(r"\s*[A-Z][a-z]+'s\b")
_PRESENT_RE = re.compile(r"^\s*<[^<>]+> is present\.?\s*$")
_PERSON_WHO_RE = re.compile(r"\bthe (?:person|one) who (.+?) (?=will|go|goes|does|did|is|lives|works|put)\b")
_NOT_NAMES = {"What", "Where", "Who", "Which", "When", "Why", "How", "Is", "Does", "Did", "Do", "The", "In", "I"}


def named_people(question: str) -> list[str]:
  """The names a question surely mentions, in order: capitalised words that are not question words, after the
  first, and the first when it is possessive ("Victoria's drink of choice?"); any other first word is
  `opening_name`'s to judge."""
  words = _CAPITAL_RE.findall(question)
  first = [words[0]] if words and _POSSESSIVE_OPENING_RE.match(question) else []
  return list(dict.fromkeys(n for n in first + words[1:] if n not in _NOT_NAMES))


def opening_name(question: str) -> str | None:
  """The question's first word when it may be a name ("Victoria lost track of the camera; where is it now?"):
  capitalised, not a question word, not named again later. Sentence case capitalises any first word ("Tomorrow,
  who ..."), so a caller takes it for a name only when the memory knows it."""
  m = _OPENING_RE.match(question)
  word = m.group(1) if m else None
  return word if word and word not in _NOT_NAMES and word not in named_people(question) else None


def _strip_tags(text: str) -> str:
  return " ".join(CHARACTER_TAG_RE.sub(" ", text).split())


class RuleAnswerer:
  """Deterministic answers from the top search hits of one graph (see module docstring)."""

  def __init__(self, graphs, embed_fn: Callable[[Sequence[str]], np.ndarray], candidates: int = 6,
               search: SearchConfig = ASK_SEARCH):
    """`search`: the tools' settings (an ablation such as `no_semantic` applies to every search it runs)."""
    self.embed_fn = embed_fn
    self.searcher = MemorySearcher(graphs, embed_fn, dataclasses.replace(search, node_topk=candidates))
    self.names_searcher = MemorySearcher(graphs, embed_fn, dataclasses.replace(search, node_topk=5))

  def _top(self, q: Question, query: str, k: int = 1, tagged: bool = False) -> str | None:
    """The best `k` memories for the query, joined. The search (restricted to the people the query names)
    returns candidates; they are re-ranked by similarity with the people's tags removed from both sides, so a
    short tag-dominated line ("<character_0> is present.") cannot outrank what that person said. `tagged`: only
    memories that name someone (a "who" question needs a person: an untagged conclusion such as the house rule
    "In this house, the milk goes in the fridge door." matches "who gave the house rule about the milk" best and
    names nobody)."""
    r = self.searcher.search([SearchRequest(q.graph_index, query, RETRIEVAL_ROUTE, q.before_clip)])[0]
    cands = [s for sentences in r.memories.values() for s in sentences
             if not _PRESENT_RE.match(s) and (not tagged or CHARACTER_TAG_RE.search(s))]
    if not cands:
      return None
    emb = self.embed_fn([_strip_tags(query)] + [_strip_tags(s) for s in cands])
    order = np.argsort(-(emb[1:] @ emb[0]), kind="stable")
    return " ".join(cands[i] for i in order[:k])

  def _name_of(self, q: Question, tag: str) -> str | None:
    return self._first_match(q, f"What is the name of <{tag}>", "clip",
                             rf"<{re.escape(tag)}>'s name is ([A-Z][a-z]+)")

  def _id_of(self, q: Question, name: str) -> str | None:
    return self._first_match(q, f"What is the character id of {name}", "node",
                             rf"<(character_\d+|face_\d+|voice_\d+)>'s name is {re.escape(name)}\b")

  def _first_match(self, q: Question, query: str, route: str, pattern: str) -> str | None:
    """The first group of `pattern` in the memories one search returns (name <-> id resolution)."""
    r = self.names_searcher.search([SearchRequest(q.graph_index, query, route, q.before_clip)])[0]
    pat = re.compile(pattern)
    for sentences in r.memories.values():
      for s in sentences:
        m = pat.search(s)
        if m:
          return m.group(1)
    return None

  def with_names(self, q: Question, text: str) -> str:
    """`text` with each person's tag replaced by the name the memory gives it (kept where it gives none)."""
    return CHARACTER_TAG_RE.sub(lambda m: self._name_of(q, m.group(1)) or m.group(0), text)

  def answer_one(self, q: Question) -> str:
    who = _WHO_RE.match(q.question)
    if who:
      hit = self._top(q, who.group(1), tagged=True)
      if hit is None:
        return NOT_IN_MEMORY
      tag = CHARACTER_TAG_RE.search(hit).group(1)
      return self._name_of(q, tag) or f"<{tag}>"
    query = q.question
    hop = _PERSON_WHO_RE.search(query)
    if hop:  # multi-hop: first find who matches the description, then ask about that person
      hit = self._top(q, hop.group(1), tagged=True)
      m = CHARACTER_TAG_RE.search(hit or "")
      if m:
        query = query[:hop.start()] + f"<{m.group(1)}> " + query[hop.end():]
    names = named_people(q.question)
    opening = opening_name(q.question)
    resolved = 0
    for name in ([opening] if opening else []) + names:
      tag = self._id_of(q, name)
      if tag is not None:
        query = re.sub(rf"\b{re.escape(name)}\b", f"<{tag}>", query)
        resolved += 1
    if names and not resolved and not hop:  # about someone the memory has no name for
      return NOT_IN_MEMORY
    # two-part questions take two memories; a "who"/"whose" question is answered by a memory naming someone
    hit = self._top(q, query, 2 if " and " in q.question else 1, tagged=bool(_ASKS_PERSON_RE.match(q.question)))
    return self.with_names(q, hit) if hit else NOT_IN_MEMORY

  def answer(self, questions: Sequence[Question]) -> list[str]:
    return [self.answer_one(q) for q in questions]


class LLMAnswerer:
  """The reference control loop (`Controller`) on a local LLM policy; returns the final answers."""

  def __init__(self, graphs, embed_fn: Callable[[Sequence[str]], np.ndarray], llm="smollm2-135m-instruct",
               max_new_tokens: int = 192, seed: int = 0, constrain_actions: bool = False, searcher=None,
               control=None, greedy: bool = False, adapter: str | pathlib.Path | None = None,
               resolve_names: bool = True, slots: int | None = 16, min_searches: int = 0,
               search: SearchConfig = ASK_SEARCH):
    """`llm`: a load_llm name/path or a loaded (model, tokenizer) pair. `constrain_actions`: decode every turn
    inside the action format (`ActionConstraints`) — for a weak controller such as the embedded 135M model; a
    trained controller runs free. `searcher`: the search tools (default: the graphs' `MemorySearcher` with
    `search`'s settings; any `controller.Searcher`, e.g. a memory design's). `control`: the loop's `ControlConfig`.
    `adapter`: a LoRA adapter file on top of `llm` ("" = the shipped one; `build.load_controller`: greedy, with
    the protocol the adapter records).
    `resolve_names`: a final answer that names someone by id ("<character_1>") gets the name the memory gives
    that id, looked up as the rules answerer does. WHY: the protocol lets the controller search "What is the
    name of <character_i>" itself, but the shipped 135M controller sometimes answers with the id, and a user
    asked "who" wants a name. Off for the raw protocol, and without `graphs` (a memory design with no entity
    graph has no names to look up).
    `slots`: continuous batching over at most this many KV-cache rows (a question's slot passes to the next
    waiting question as soon as it answers; memory stays bounded however many questions one call asks); None
    runs every question of a call as one static batch.
    `min_searches`: the first that many rounds may only search (`ActionConstraints`), the rest as
    `constrain_actions` says."""
    from m3jax.control.build import build_policy, control_sampling, load_controller
    from m3jax.control.controller import Controller

    loaded = load_controller(llm, adapter, trained=adapter is not None, max_new_tokens=max_new_tokens,
                             control=control, greedy=greedy)
    sampling = control_sampling(loaded.tokenizer, loaded.max_new_tokens, greedy=loaded.greedy, seed=seed)
    control = loaded.control
    if not 0 <= min_searches < control.max_rounds:
      raise ValueError(f"min_searches={min_searches}: must be in 0..{control.max_rounds - 1} (this protocol's "
                       f"{control.max_rounds} rounds; the last has to be able to answer)")
    self.policy = build_policy(loaded.model, loaded.tokenizer, sampling,
                               constrain_rounds=control.max_rounds if constrain_actions else None,
                               min_searches=min_searches)
    self.controller = Controller(self.policy, searcher or MemorySearcher(graphs, embed_fn, search), control)
    self.namer = RuleAnswerer(graphs, embed_fn, search=search) if resolve_names and graphs else None
    self.trajectories, self.slots = [], slots

  def answer(self, questions: Sequence[Question],
             on_answer: Callable[[int, str, Trajectory], None] | None = None) -> list[str]:
    """The final answers, in order; `on_answer(index, answer, trajectory)` hears of each as it ends (with slots;
    a static batch's all end together)."""
    def final(q: Question, traj: Trajectory) -> str:
      text = (traj.response or "").strip()
      return self.namer.with_names(q, text) if self.namer is not None else text

    hear = None if on_answer is None else (lambda i, t: on_answer(i, final(questions[i], t), t))
    self.trajectories = self.controller.run(questions, slots=min(self.slots, len(questions)) if self.slots else None,
                                            on_finish=hear if self.slots else None)
    answers = [final(q, t) for q, t in zip(questions, self.trajectories)]
    if hear is not None and not self.slots:
      for i, t in enumerate(self.trajectories):
        hear(i, t)
    return answers


def episode_questions(ep: Episode) -> list[Question]:
  return [Question(q["question_id"], q["question"], q["answer"], 0, graph_key=ep.id, before_clip=q["before_clip"],
                   question_types=tuple(q["type"])) for q in ep.qa_list]


ANSWERERS = ("trained", "untrained", "rules")


def make_answerer(kind: str, graphs, embed_fn, llm: str = "smollm2-135m-instruct",
                  adapter: str | pathlib.Path | None = None, max_new_tokens: int = 48, min_searches: int = 0,
                  search: SearchConfig = ASK_SEARCH):
  """An answerer of `ANSWERERS` over `graphs`; `embed_fn` is the text embedder they were memorized with.
  rules: the deterministic retrieval baseline; untrained: the base prompted, turns constrained to the action
  format; trained: the base plus `adapter` (default: the shipped controller), free-form and greedy.
  `min_searches` (LLM answerers): the first that many rounds may only search. `search`: the tools' settings."""
  from m3jax.control.build import trained_adapter_path
  if kind not in ANSWERERS:
    raise ValueError(f"answerer {kind!r}; expected one of {ANSWERERS}")
  if kind == "rules":
    return RuleAnswerer(graphs, embed_fn, search=search)
  if kind == "untrained":
    return LLMAnswerer(graphs, embed_fn, llm, max_new_tokens=max_new_tokens, constrain_actions=True,
                       min_searches=min_searches, search=search)
  return LLMAnswerer(graphs, embed_fn, llm, adapter=trained_adapter_path(adapter), min_searches=min_searches,
                     search=search)
