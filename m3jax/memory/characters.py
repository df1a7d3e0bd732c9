"""Characters: people formed from "Equivalence: <face_a>, <voice_b>" statements that still have edges.

Two voting rules:
* `reference` — what the public code effectively does (its voice-side collision filter is undone by the face
  pass, §1.6): the connected components of every surviving equivalence statement. Numbering reproduces the
  reference exactly: statements are walked in the iteration order of a Python `set` of their node ids (int
  hashing is not randomised, so this is independent of PYTHONHASHSEED), each statement unions its first tag
  with the others, characters are numbered by first appearance of a tag, and the remaining faces and voices
  become singleton characters in node-id order.
* `paper` — each voice joins only the face of its highest-weight statement (ties: the lower statement id);
  statements are walked in ascending id, so the numbering is deterministic by construction.
Ablations: `no_equivalence` (and `no_semantic`, which deletes the statements) make every face and voice its own
character, in node order.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from m3jax.memory.graph_view import GraphView
from m3jax.memory.schema import FACE, VOICE


@dataclasses.dataclass(frozen=True)
class CharacterMap:
  mappings: dict[str, list[str]]   # "character_k" -> ["face_i", "voice_j", ...]
  reverse: dict[str, str]          # "face_i" -> "character_k"


def _tag(graph: GraphView, node_id: int) -> str:
  return f"{'face' if graph.kind(node_id) == FACE else 'voice'}_{node_id}"


def _alive_statements(graph: GraphView, cut: int) -> dict[int, dict[int, float]]:
  """Equivalence statement slot -> {entity id: weight} over alive edges inside the view."""
  out: dict[int, dict[int, float]] = {}
  for slot in graph.equivalences:
    if graph.text_node.data[slot] > cut:
      continue
    edges = {int(graph.edge_entity.data[r]): float(graph.edge_weight.data[r])
             for r in graph.text_edges.get(slot, []) if graph.edge_weight.data[r] > 0}
    edges = {e: w for e, w in edges.items() if e <= cut}
    if edges:
      out[slot] = edges
  return out


def _select(graph: GraphView, statements: dict[int, dict[int, float]], mode: str, cut: int) -> list[int]:
  """Statement slots to union, in the order that fixes the numbering."""
  entity_ids = np.nonzero(graph.node_kind.valid[: cut + 1])[0]
  by_entity: dict[int, list[int]] = {}
  for slot, edges in statements.items():
    for e in edges:
      by_entity.setdefault(e, []).append(slot)
  voice_pass: list[int] = []
  for v in (int(i) for i in entity_ids if graph.node_kind.data[i] == VOICE):
    best, best_w = None, -np.inf
    for slot in sorted(by_entity.get(v, [])):
      if any(graph.kind(e) == FACE for e in graph.text_entities[slot]):
        if statements[slot][v] > best_w:
          best, best_w = slot, statements[slot][v]
      else:
        voice_pass.append(slot)
    if best is not None:
      voice_pass.append(best)
  if mode == "paper":
    return sorted(set(voice_pass))
  face_pass = [s for f in entity_ids if graph.node_kind.data[f] == FACE for s in by_entity.get(int(f), [])]
  return list(set([graph.text_node.data[s].item() for s in voice_pass + face_pass]))


def build(graph: GraphView, cut: int, mode: str, ablation: str) -> CharacterMap:
  parent: dict[str, str] = {}

  def find(x: str) -> str:
    parent.setdefault(x, x)
    root = x
    while parent[root] != root:
      root = parent[root]
    while parent[x] != root:
      parent[x], x = root, parent[x]
    return root

  if ablation == "none":
    order = _select(graph, _alive_statements(graph, cut), mode, cut)
    if mode == "reference":    # the set above holds node ids; map back to slots
      order = [int(graph.node_slot.data[n]) for n in order]
    for slot in order:
      ents = [_tag(graph, e) for e in graph.text_entities[slot] if e <= cut]
      if len(ents) >= 2:
        for other in ents[1:]:
          ra, rb = find(ents[0]), find(other)
          if ra != rb:
            parent[rb] = ra
  mappings: dict[str, list[str]] = {}
  reverse: dict[str, str] = {}
  root_name: dict[str, str] = {}
  for tag in list(parent):
    root = find(tag)
    if root not in root_name:
      root_name[root] = f"character_{len(root_name)}"
      mappings[root_name[root]] = []
    mappings[root_name[root]].append(tag)
    reverse[tag] = root_name[root]
  kinds = graph.node_kind.valid[: cut + 1]
  for node_id in np.nonzero((kinds == FACE) | (kinds == VOICE))[0]:
    tag = _tag(graph, int(node_id))
    if tag not in reverse:
      name = f"character_{len(mappings)}"
      mappings[name] = [tag]
      reverse[tag] = name
  return CharacterMap(mappings, reverse)
