"""The controller's search tools over memory graphs: `search_clip` and `search_node` (reference §3).

`MemorySearcher.search(requests)` answers a batch of questions over a batch of graphs with one embedder call
(all back-translated variants, deduplicated and cached) and one jitted kernel call (`search_kernel`) over the
graphs the batch touches; graphs big enough (or configured) to use a ScaNN index are answered from the index's
candidates instead. Output text is identical in format to the reference: `Searched knowledge: {json}` with
face/voice tags translated to characters, equivalence lines hidden, and the empty-result sentence. Differences
from the reference, on purpose: whole-tag (not substring) id replacement, and clips already returned to a
question are excluded before top-k with backfill (`exclusion='reference'` reproduces the reference, which loses
them).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Literal, Sequence

import jax
import numpy as np

from m3jax.memory import tags
from m3jax.memory.arrays import next_pow2
from m3jax.memory.graph import FACE, FLAG_HIDDEN, VOICE, MemoryGraph
from m3jax.memory.search_config import SearchConfig  # noqa: F401  (callers import it from here)
from m3jax.memory.search_kernel import search_batch

EMPTY_RESULT = "\n(The search result is empty. Please try searching from another perspective.)"
_NO_BOUND = np.iinfo(np.int32).max


class SearchError(ValueError):
  """A malformed search request."""


@dataclasses.dataclass(frozen=True)
class SearchRequest:
  graph_index: int
  query: str
  route: Literal["clip", "node"] = "clip"
  before_clip: int | None = None
  exclude_clips: tuple[int, ...] = ()
  context: str = ""  # the question this search serves: the node route ranks by query + context (node_context)


@dataclasses.dataclass
class SearchResult:
  text: str                          # what the controller sees
  clips: list[int]                   # clip ids whose memories are in `memories` (ascending)
  memories: dict[str, list[str]]     # "CLIP_k" -> translated sentences


def format_result(memories: dict[str, list[str]]) -> str:
  text = "Searched knowledge: " + json.dumps(memories, ensure_ascii=False)
  return text + EMPTY_RESULT if not memories else text


@dataclasses.dataclass
class _Prepared:
  """Host-side view of one request: variants, related people, view bounds, characters."""
  variants: list[str]
  related: list[int]
  cut: int
  before: int
  reverse: dict[str, str]


class MemorySearcher:
  """Batched search over a fixed list of graphs (graphs may keep growing; device copies sync incrementally)."""

  def __init__(self, graphs: Sequence[MemoryGraph], embed_fn: Callable[[Sequence[str]], np.ndarray],
               config: SearchConfig = SearchConfig()):
    if not graphs:
      raise SearchError("MemorySearcher needs at least one graph")
    self.graphs = list(graphs)
    self.embed_fn = embed_fn
    self.config = config
    self._emb_cache: dict[str, np.ndarray] = {}
    self._text_cache: dict[tuple, str] = {}

  # --------------------------------------------------------------------------------------------- public
  def search(self, requests: Sequence[SearchRequest]) -> list[SearchResult]:
    for r in requests:
      self._validate(r)
    prepared = [self._prepare(r) for r in requests]
    self._embed_all([v for p in prepared for v in p.variants])
    results: list[SearchResult | None] = [None] * len(requests)
    exact = [i for i, r in enumerate(requests) if not self._uses_scann(self.graphs[r.graph_index])]
    if exact:
      for i, hit in zip(exact, self._run_exact([requests[i] for i in exact], [prepared[i] for i in exact])):
        results[i] = self._assemble(requests[i], prepared[i], *hit)
    for i, r in enumerate(requests):
      if results[i] is None:
        results[i] = self._assemble(r, prepared[i], *self._run_scann(r, prepared[i]))
    return results

  # -------------------------------------------------------------------------------------------- helpers
  def _validate(self, r: SearchRequest) -> None:
    if not 0 <= r.graph_index < len(self.graphs):
      raise SearchError(f"graph_index {r.graph_index} out of range [0, {len(self.graphs)})")
    if r.route not in ("clip", "node"):
      raise SearchError(f"route must be 'clip' or 'node', got {r.route!r}")
    if not isinstance(r.query, str):
      raise SearchError(f"query must be a string, got {type(r.query).__name__}")

  def _uses_scann(self, g: MemoryGraph) -> bool:
    c = self.config
    if c.backend == "scann" and g.index is None:
      raise SearchError("backend='scann' but the graph has no ScaNN index (attach one with index.attach_scann)")
    return g.index is not None and (c.backend == "scann" or c.backend == "auto" and g.num_text >= c.scann_min_texts)

  def _prepare(self, r: SearchRequest) -> _Prepared:
    g = self.graphs[r.graph_index]
    chars = g.characters(r.before_clip, self.config.ablation)
    cut = g.cut_for(r.before_clip)
    related: list[int] = []
    for kind, k in tags.parse_entities(r.query):
      if kind == "character":
        related += [int(m.split("_")[1]) for m in chars.mappings.get(f"character_{k}", [])]
      elif k <= cut and g.kind(k) == (FACE if kind == "face" else VOICE):
        related.append(k)
    query = r.query
    if self.config.node_context and r.route == "node" and r.context:
      query = f"{r.query.rstrip(' ?.')}? {r.context}"
    variants = tags.back_translate(query, chars.mappings, self.config.max_variants, self.config.seed)
    before = _NO_BOUND if r.before_clip is None else int(r.before_clip)
    return _Prepared(variants, list(dict.fromkeys(related)), cut, before, chars.reverse)

  def _embed_all(self, texts: list[str]) -> None:
    todo = list(dict.fromkeys(t for t in texts if t not in self._emb_cache))
    if not todo:
      return
    emb = np.asarray(self.embed_fn(todo), np.float32)
    if emb.ndim != 2 or emb.shape[0] != len(todo):
      raise SearchError(f"embed_fn returned shape {emb.shape} for {len(todo)} texts")
    if len(self._emb_cache) + len(todo) > self.config.embed_cache_size:
      self._emb_cache.clear()
    self._emb_cache.update(zip(todo, emb))

  def _device_graph(self, g: MemoryGraph) -> tuple:
    """The device columns the kernel reads of one graph (synced incrementally, never copied or padded)."""
    return (g.text_emb.device(), g.text_clip.device(), g.text_node.device(), g.text_flags.device(),
            g.edge_text.device(), g.edge_entity.device(), g.edge_weight.device())

  def _run_exact(self, requests: list[SearchRequest], prepared: list[_Prepared]):
    """All requests in one kernel call, grouped by (graph, route); returns (clips, node rows) per request.

    The call holds only the graphs the requests touch, ordered by their shapes. WHY: the kernel unrolls over the
    graphs it is given and compiles once per set of shapes, so handing it every graph the searcher holds made a
    searcher over RL's 144 graphs compile for ~40 s at each new request shape while a batch touched 4 of them;
    ordered by shape, batches over different graphs of the same shapes share one compiled kernel."""
    c = self.config
    dim = self.graphs[0].config.text_dim
    n_k = next_pow2(max(len(p.related) for p in prepared), 1)
    n_x = next_pow2(max(len(r.exclude_clips) for r in requests), 1)
    device = {gi: self._device_graph(self.graphs[gi]) for gi in sorted({r.graph_index for r in requests})}
    touched = sorted(device, key=lambda gi: ([a.shape for a in device[gi]], gi))
    slot = {gi: s for s, gi in enumerate(touched)}
    where: dict[int, tuple[int, int]] = {}
    blocks = {}
    for route in ("clip", "node"):
      groups: list[list[int]] = [[] for _ in touched]
      for i, r in enumerate(requests):
        if r.route == route:
          groups[slot[r.graph_index]].append(i)
      n_r = next_pow2(max(len(gr) for gr in groups)) if any(groups) else 0
      n_q = next_pow2(max(sum(len(prepared[i].variants) for i in gr) for gr in groups), 1)
      n_g = len(touched)
      q = np.zeros((n_g, n_q, dim), np.float32)
      owner = np.full((n_g, n_q), n_r, np.int32)                    # padding variants belong to no request
      related = np.full((n_g, n_r, n_k), -1, np.int32)
      cut, before = np.full((n_g, n_r), -1, np.int32), np.zeros((n_g, n_r), np.int32)
      exclude = np.full((n_g, n_r, n_x), -1, np.int32)
      for gi, group in enumerate(groups):
        if not group:
          continue
        where.update((i, (gi, ri)) for ri, i in enumerate(group))
        ps = [prepared[i] for i in group]
        counts = [len(p.variants) for p in ps]
        q[gi, : sum(counts)] = [self._emb_cache[v] for p in ps for v in p.variants]
        owner[gi, : sum(counts)] = np.repeat(np.arange(len(group), dtype=np.int32), counts)
        related[gi, : len(group)] = [p.related + [-1] * (n_k - len(p.related)) for p in ps]
        cut[gi, : len(group)] = [min(p.cut, _NO_BOUND) for p in ps]
        before[gi, : len(group)] = [p.before for p in ps]
        exclude[gi, : len(group)] = [list(requests[i].exclude_clips) + [-1] * (n_x - len(requests[i].exclude_clips))
                                     for i in group]
      blocks[route] = (q, owner, related, cut, before) + ((exclude,) if route == "clip" else ())
    blocks = jax.device_put(blocks)                       # one transfer call for every request array
    n_clips = next_pow2(max(g.max_clip for g in self.graphs) + 1)
    clip_out, node_out = search_batch(blocks["clip"], blocks["node"], tuple(device[gi] for gi in touched),
                                      n_clips=n_clips, clip_k=min(c.clip_topk, n_clips), node_k=c.node_topk,
                                      clip_mode=c.clip_mode,
                                      exclude_first=c.exclusion == "backfill", no_semantic=c.ablation == "no_semantic",
                                      threshold=float(c.threshold),
                                      approx=c.tpu_approx_topk and jax.default_backend() == "tpu")
    clip_ids, clip_valid = (np.asarray(a).tolist() for a in clip_out) if clip_out else ([], [])
    node_rows, node_scores = (np.asarray(a).tolist() for a in node_out) if node_out else ([], [])
    hits = []
    for i, r in enumerate(requests):
      gi, ri = where[i]
      if r.route == "clip":
        hits.append((sorted(x for x, ok in zip(clip_ids[gi][ri], clip_valid[gi][ri]) if ok), []))
      else:
        hits.append(([], [x for x, s in zip(node_rows[gi][ri], node_scores[gi][ri]) if s > -np.inf]))
    return hits

  def _run_scann(self, r: SearchRequest, p: _Prepared):
    from m3jax.memory.index import approximate_hits
    return approximate_hits(self.graphs[r.graph_index], np.stack([self._emb_cache[v] for v in p.variants]),
                            p.related, p.cut, p.before, r.exclude_clips, self.config)

  def _cached(self, key: tuple, make: Callable[[], object]):
    hit = self._text_cache.get(key)
    if hit is None:
      if len(self._text_cache) >= self.config.embed_cache_size:
        self._text_cache.clear()
      hit = self._text_cache[key] = make()
    return hit

  def _translated(self, graph_index: int, p: _Prepared, slot: int) -> str:
    """A sentence with its tags translated for the view (cached: questions keep hitting the same memories)."""
    g = self.graphs[graph_index]
    return self._cached((graph_index, g.version, p.cut, slot), lambda: tags.translate(g.text_of(slot), p.reverse))

  def _clip_sentences(self, graph_index: int, p: _Prepared, clip: int) -> tuple[list[str], str]:
    """A clip's visible memories (equivalence lines hidden, translated) and their `"CLIP_k": [...]` JSON
    fragment, cached per view: questions keep returning the same clips."""
    g = self.graphs[graph_index]
    episodic_only = self.config.ablation == "no_semantic"

    def make():
      texts = [self._translated(graph_index, p, s) for s in g.clip_memories(clip, p.cut, episodic_only)
               if not g.text_flags.data[s] & FLAG_HIDDEN]
      return texts, f'"CLIP_{clip}": ' + json.dumps(texts, ensure_ascii=False)
    return self._cached((graph_index, g.version, p.cut, "clip", clip), make)

  def _assemble(self, r: SearchRequest, p: _Prepared, clips: list[int], rows: list[int]) -> SearchResult:
    g = self.graphs[r.graph_index]
    if r.route == "clip":        # the text is assembled from cached fragments: identical to json.dumps(memories)
      parts = [self._clip_sentences(r.graph_index, p, c) for c in clips]
      memories = {f"CLIP_{c}": list(texts) for c, (texts, _) in zip(clips, parts)}
      text = "Searched knowledge: {" + ", ".join(frag for _, frag in parts) + "}"
      return SearchResult(text if clips else text + EMPTY_RESULT, list(clips), memories)
    by_clip: dict[int, list[str]] = {}
    for s in rows[: self.config.node_topk]:
      by_clip.setdefault(int(g.text_clip.data[s]), []).append(self._translated(r.graph_index, p, s))
    memories = {f"CLIP_{c}": by_clip[c] for c in sorted(by_clip) if by_clip[c]}
    out_clips = sorted(int(k.split("_")[1]) for k in memories)
    return SearchResult(format_result(memories), out_clips, memories)
