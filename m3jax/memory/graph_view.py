"""What the graph's helper modules (characters, consolidate, export, index) read and write of a `MemoryGraph`.

A protocol, so those modules need not import graph.py, which imports them: the graph is one concept split over
files, and the import graph stays a tree (tests/test_layering.py forbids circles, type-only ones included).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np

from m3jax.memory.arrays import GrowableArray


class GraphView(Protocol):
  config: Any                               # the graph's `GraphConfig`
  node_kind: GrowableArray                  # per node: FACE / VOICE / EPISODIC / SEMANTIC
  node_clip: GrowableArray
  node_slot: GrowableArray                  # a node's row in its kind's table
  faces: Any                                # `identity.EntityBank`s
  voices: Any
  contents: list[list[str]]
  text_emb: GrowableArray
  text_node: GrowableArray
  text_clip: GrowableArray
  text_flags: GrowableArray
  text_entities: dict[int, tuple[int, ...]]
  edge_text: GrowableArray
  edge_entity: GrowableArray
  edge_weight: GrowableArray
  entity_edges: dict[int, list[int]]       # entity id -> its edge rows
  text_edges: dict[int, list[int]]         # text slot -> its edge rows
  equivalences: list[int]
  index: Any

  @property
  def next_node_id(self) -> int: ...

  @property
  def num_text(self) -> int: ...

  def kind(self, node_id: int) -> int: ...

  def cut_for(self, before_clip: int | None) -> int: ...

  def characters(self, before_clip: int | None = None, ablation: str = "none", mode: str | None = None) -> Any: ...

  def bump_text_edges(self, slot: int, delta: float) -> None: ...

  def _add_text(self, kind: int, text: str, emb: np.ndarray, clip: int, entities: Sequence[int]) -> int: ...
