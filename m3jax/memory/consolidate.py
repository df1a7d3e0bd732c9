"""Semantic consolidation: a statement already known is reinforced instead of duplicated (reference §1.5).

For a new semantic statement naming people E (in text order), the candidates are the semantic nodes alive-linked
to E[0] whose own entity list contains every member of E. A candidate with cosine > 0.85 to the new statement is
reinforced; one with cosine < 0 (a contradiction, e.g. "<face_3> does not have the voice <voice_33>") is
weakened; edges whose weight reaches <= 0 die. Only if no candidate triggered is a new node created. A
statement naming nobody is always a new isolated node. The candidate scan uses the entity's adjacency list and
one small matmul, so inserting into a large graph costs O(degree), not O(edges) as the reference's full edge scans.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from m3jax.memory.graph_view import GraphView
from m3jax.memory.schema import FLAG_SEMANTIC, SEMANTIC


def candidates(graph: GraphView, entities: Sequence[int]) -> np.ndarray:
  """Text slots of semantic nodes alive-linked to entities[0] (vectorised over the entity's adjacency)."""
  rows = np.asarray(graph.entity_edges.get(entities[0], ()), np.int64)
  rows = rows[graph.edge_weight.data[rows] > 0]
  slots = graph.edge_text.data[rows]
  return slots[(graph.text_flags.data[slots] & FLAG_SEMANTIC) != 0]


def insert_semantic(graph: GraphView, text: str, emb: np.ndarray, clip: int,
                    entities: Sequence[int]) -> int | None:
  """Consolidates one semantic statement; returns the new node id, or None if it reinforced/weakened others."""
  if entities:
    cands = candidates(graph, entities)
    c = graph.config
    cos = graph.text_emb.data[cands] @ emb
    hot = (cos > c.positive_threshold) | (cos < c.negative_threshold)
    need = set(entities)
    triggered = False
    for slot, s in zip(cands[hot].tolist(), cos[hot].tolist()):   # only statements that would trigger
      if need.issubset(graph.text_entities[slot]):
        if s > c.positive_threshold:
          graph.bump_text_edges(slot, +c.weight_step)
        else:
          graph.bump_text_edges(slot, -c.weight_step)
        triggered = True
    if triggered:
      return None
  return graph._add_text(SEMANTIC, text, emb, clip, entities)
