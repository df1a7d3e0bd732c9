"""The paper's memory: the entity-centric multimodal graph (faces, voices, episodic and semantic text with
consolidation and equivalences) behind the batched search tools. Options: any `GraphConfig` field (`mode`,
thresholds, dims) and any `SearchConfig` field (`ablation`, top-k, threshold), e.g. `mode="reference"` or
`ablation="no_semantic"`."""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Any, Sequence

from m3jax.memory.designs.base import ClipPerception, DesignError, EmbedFn, MemoryDesign
from m3jax.memory.graph import GraphConfig, GraphError, MemoryGraph
from m3jax.memory.search import MemorySearcher, SearchConfig, SearchRequest, SearchResult
from m3jax.memory.designs import register
from m3jax.memory.store import load_graph, save_graph

_GRAPH = {f.name for f in dataclasses.fields(GraphConfig)}
_SEARCH = {f.name for f in dataclasses.fields(SearchConfig)}


@register
class M3Graph(MemoryDesign):
  name = "m3_graph"

  def __init__(self, embed_fn: EmbedFn, **options: Any):
    super().__init__(embed_fn, **options)
    unknown = sorted(set(options) - _GRAPH - _SEARCH)
    if unknown:
      raise DesignError(f"m3_graph: unknown options {unknown} (GraphConfig or SearchConfig fields)")
    try:
      self.graph_config = GraphConfig(**{k: v for k, v in options.items() if k in _GRAPH})
      self.search_config = SearchConfig(**{k: v for k, v in options.items() if k in _SEARCH})
    except (TypeError, ValueError) as e:
      raise DesignError(f"m3_graph: {e}") from None
    self.graph = MemoryGraph(self.graph_config)
    self._searcher: MemorySearcher | None = None

  def update(self, clip: ClipPerception) -> None:
    for kind, emb in clip.new_entities:
      self.graph.add_entity(kind, emb)
    try:
      self.graph.add_clip(clip.clip_id, list(clip.episodic), list(clip.semantic), self.embed_fn)
    except GraphError as e:
      raise DesignError(f"m3_graph: {e}") from None

  def retrieve(self, query: str, route: str = "clip", before_clip: int | None = None,
               exclude_clips: Sequence[int] = ()) -> SearchResult:
    if self._searcher is None:
      self._searcher = MemorySearcher([self.graph], self.embed_fn, self.search_config)
    return self._searcher.search([SearchRequest(0, query, route, before_clip, tuple(exclude_clips))])[0]

  @classmethod
  def batch_searcher(cls, designs: Sequence["M3Graph"]) -> MemorySearcher | None:
    """One MemorySearcher (one embedder call, one kernel call per batch) when the designs search alike."""
    configs = {d.search_config for d in designs}
    if len(configs) != 1 or len({id(d.embed_fn) for d in designs}) != 1:
      return None
    return MemorySearcher([d.graph for d in designs], designs[0].embed_fn, configs.pop())

  def save_state(self, path: pathlib.Path) -> None:
    save_graph(self.graph, path / "graph")

  def load_state(self, path: pathlib.Path) -> None:
    self.graph = load_graph(path / "graph")
    if self.graph.config != self.graph_config:
      raise DesignError(f"saved graph at {path} has {self.graph.config}, the design's options say "
                        f"{self.graph_config}")
