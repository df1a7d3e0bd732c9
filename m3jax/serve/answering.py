"""Answering a batch of questions over many spaces: through the control agent, or retrieval-only.

`retrieval` mode (no LLM configured) runs each question once through the search `m3jax ask` uses and returns
the retrieved memories with `answer = None` and `mode = "retrieval_only"`: it is not an answer, and the API
says so. `controller` mode runs `m3jax.control.controller.Controller` with the LLM policy over all the batch's
spaces at once (one policy batch per round, one search call per round), returning its answer and trajectory;
with a slot policy and `ServeConfig.join_running` it runs as one long-lived stream (`ControllerAnswerer.stream`)
that questions join while others are being answered.
Either way one search call covers every space of the batch (one kernel call), made under the spaces' locks, so a
concurrent clip insert is never seen half-done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Callable, Sequence

import numpy as np

from m3jax.control.answer import RETRIEVAL_ROUTE
from m3jax.memory.search import MemorySearcher, SearchConfig, SearchRequest, SearchResult
from m3jax.serve.spaces import Space, SpaceStore


@dataclasses.dataclass(frozen=True)
class AskItem:
  space: Space
  question: str
  before_clip: int | None = None


class SharedEmbedCache:
  """One embedder front for every space's searcher: a batch's questions are embedded in one call."""

  def __init__(self, embed_fn: Callable[[Sequence[str]], np.ndarray], capacity: int = 65536):
    self.embed_fn, self.capacity = embed_fn, capacity
    self._cache: dict[str, np.ndarray] = {}
    self._lock = threading.Lock()               # request threads and the batcher embed concurrently

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    with self._lock:
      todo = list(dict.fromkeys(t for t in texts if t not in self._cache))
      if todo:
        emb = np.asarray(self.embed_fn(todo), np.float32)
        if len(self._cache) + len(todo) > self.capacity:
          self._cache.clear()
        self._cache.update(zip(todo, emb))
      rows = [self._cache[t] for t in texts]
    return np.stack(rows) if rows else np.zeros((0, 0), np.float32)


class SpacesSearcher:
  """The controller's `Searcher` over the spaces of one batch: graph_index i is `spaces[i]`. Every request of
  the batch, whatever its space, goes to ONE `MemorySearcher` call (one embedder call, one kernel call over all
  the spaces' graphs), made while holding every space's lock."""

  def __init__(self, spaces: Sequence[Space], embed_fn: Callable[[Sequence[str]], np.ndarray],
               config: SearchConfig):
    # WHY sorted by the graphs' device shapes: the jitted kernel is specialised on the tuple of graph shapes, so
    # batches over the same mix of shapes reuse one compilation whatever order their spaces arrived in
    order = sorted(range(len(spaces)), key=lambda i: (_shape_key(spaces[i].graph), spaces[i].id))
    self.spaces = [spaces[i] for i in order]
    self._position = {orig: pos for pos, orig in enumerate(order)}
    self.embed_fn, self.config = embed_fn, config

  def search(self, requests: list[SearchRequest]) -> list[SearchResult]:
    with contextlib.ExitStack() as locks:
      for space in sorted(self.spaces, key=lambda s: s.id):   # one global order: no lock-order deadlock
        locks.enter_context(space.lock)
      searcher = MemorySearcher([s.graph for s in self.spaces], self.embed_fn, self.config)
      return searcher.search([dataclasses.replace(r, graph_index=self._position[r.graph_index]) for r in requests])


def _shape_key(g) -> tuple[int, ...]:
  return (g.text_emb.capacity, g.edge_text.capacity)


def _group(items: Sequence[AskItem]) -> tuple[list[Space], list[int]]:
  spaces: list[Space] = []
  index: dict[str, int] = {}
  where = []
  for it in items:
    if it.space.id not in index:
      index[it.space.id] = len(spaces)
      spaces.append(it.space)
    where.append(index[it.space.id])
  return spaces, where


class RetrievalAnswerer:
  """One search per question, through the route and settings `m3jax ask` retrieves with (`RETRIEVAL_ROUTE`,
  the store's search config); the memories are returned as they are (no generated answer)."""

  def __init__(self, store: SpaceStore):
    self.store = store

  def __call__(self, items: Sequence[AskItem]) -> list[dict | Exception]:
    spaces, where = _group(items)
    requests = [SearchRequest(graph_index=gi, query=it.question, route=RETRIEVAL_ROUTE, before_clip=it.before_clip)
                for it, gi in zip(items, where)]
    results = SpacesSearcher(spaces, self.store.embed_fn, self.store.search_config).search(requests)
    return [{"mode": "retrieval_only", "answer": None,
             "note": "no control agent configured: these are the retrieved memories, not an answer",
             "trajectory": [{"round": 0, "action": "search", "query": it.question, "route": RETRIEVAL_ROUTE,
                             "retrieved_clips": [int(c) for c in res.clips], "memories": res.memories}]}
            for it, res in zip(items, results)]


class ControllerAnswerer:
  """The M3-Agent control loop (a policy + memory search) over the batch's spaces; a slot policy (the LLM's) runs
  a batch through `slots` continuously refilled KV-cache rows (`Controller.run(slots=...)`)."""

  def __init__(self, policy, max_rounds: int, store: SpaceStore, slots: int = 16):
    from m3jax.control.controller import ControlConfig
    self.policy, self.store, self.slots = policy, store, slots
    self.control_config = ControlConfig(max_rounds=max_rounds)

  @classmethod
  def from_llm(cls, llm: str, max_new_tokens: int, max_rounds: int, store: SpaceStore, seed: int = 0,
               adapter: str | None = None, slots: int = 16) -> "ControllerAnswerer":
    """With the LLM policy (`m3jax.models.llm.load_llm` name or path): with `adapter` (a LoRA adapter file, ""
    = the shipped one) the trained controller, greedy with the protocol its adapter records; without, the
    prompted model with the reference's control sampling."""
    from m3jax.control.build import build_policy, control_sampling, load_controller

    loaded = load_controller(llm, adapter or None, trained=adapter is not None, max_new_tokens=max_new_tokens)
    sampling = control_sampling(loaded.tokenizer, loaded.max_new_tokens, greedy=loaded.greedy, seed=seed)
    out = cls(build_policy(loaded.model, loaded.tokenizer, sampling), max_rounds, store, slots)
    if adapter is not None:
      out.control_config = loaded.control
    return out

  @property
  def streams(self) -> bool:
    """Whether questions can join running ones (`stream`): a slot policy with slots configured."""
    return bool(self.slots) and hasattr(self.policy, "advance")

  def __call__(self, items: Sequence[AskItem]) -> list[dict | Exception]:
    from m3jax.control.controller import Controller
    spaces, where = _group(items)
    questions = [_question(i, it, gi) for i, (it, gi) in enumerate(zip(items, where))]
    searcher = SpacesSearcher(spaces, self.store.embed_fn, self.store.search_config)
    slots = min(self.slots, len(questions)) if self.streams else None
    return [_answer_json(t) for t in Controller(self.policy, searcher, self.control_config).run(questions, slots)]

  def stream(self, take: Callable, finish: Callable) -> None:
    """The control loop as a stream (`Controller.run_stream`, for `batching.JoiningBatcher`): `take(n, idle)`
    hands over `(key, AskItem)` pairs, `finish(key, answer)` gets each answer as soon as its trajectory ends."""
    from m3jax.control.controller import Controller
    spaces = _RunningSpaces(self.store.embed_fn, self.store.search_config)
    index: dict = {}

    def take_questions(n: int, idle: bool):
      got = take(n, idle)
      if got is None:
        return None
      for key, it in got:
        index[key] = spaces.enter(it.space)
      return [(key, _question(key, it, index[key])) for key, it in got]

    def done(key, traj) -> None:
      spaces.leave(index.pop(key))
      finish(key, _answer_json(traj))

    Controller(self.policy, spaces, self.control_config).run_stream(take_questions, done, self.slots)


def _question(key, item: AskItem, graph_index: int):
  """The controller's question for an ask on the graph at `graph_index` of the call's searcher."""
  from m3jax.control.controller import Question
  return Question(question_id=str(key), question=item.question, answer="", graph_index=graph_index,
                  graph_key=item.space.id, before_clip=item.before_clip)


class _RunningSpaces:
  """The `Searcher` of a stream: graph_index k is a space some running question asks about (held while one does,
  so a long-lived stream keeps no space alive). Each search call runs over the spaces its requests name, through
  `SpacesSearcher` (one kernel call, under those spaces' locks)."""

  def __init__(self, embed_fn: Callable[[Sequence[str]], np.ndarray], config: SearchConfig):
    self.embed_fn, self.config = embed_fn, config
    self.spaces: dict[int, Space] = {}
    self._index: dict[int, int] = {}  # id(space) -> graph_index (the space is held in `spaces`: ids stay unique)
    self._users: dict[int, int] = {}
    self._next = 0

  def enter(self, space: Space) -> int:
    k = self._index.get(id(space))
    if k is None:
      k = self._index[id(space)] = self._next
      self.spaces[k], self._next = space, self._next + 1
    self._users[k] = self._users.get(k, 0) + 1
    return k

  def leave(self, k: int) -> None:
    self._users[k] -= 1
    if not self._users[k]:
      del self._users[k], self._index[id(self.spaces.pop(k))]

  def search(self, requests: list[SearchRequest]) -> list[SearchResult]:
    named = sorted({r.graph_index for r in requests})
    position = {k: i for i, k in enumerate(named)}
    searcher = SpacesSearcher([self.spaces[k] for k in named], self.embed_fn, self.config)
    return searcher.search([dataclasses.replace(r, graph_index=position[r.graph_index]) for r in requests])


def _answer_json(t) -> dict:
  return {"mode": "controller", "answer": t.response,
          "trajectory": [{"round": i, "action": r.action, "query": r.content, "route": r.route,
                          "retrieved_clips": list(r.retrieved_clips), "result": r.result_text}
                         for i, r in enumerate(t.rounds)]}
