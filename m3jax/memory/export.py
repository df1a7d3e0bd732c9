"""Readable JSON export of a memory graph (for inspection; not a persistence format).

Nodes in the reference's vocabulary (`img`, `voice`, `episodic`, `semantic`), alive edges with weights, and the
characters of the chosen view. Embeddings are summarised by their count; face crops by their count.
"""

from __future__ import annotations


from m3jax.memory.graph_view import GraphView
from m3jax.memory.schema import FACE, REFERENCE_TYPE, VOICE


def to_json(g: GraphView, before_clip: int | None = None) -> dict:
  cut = g.cut_for(before_clip)
  nodes = []
  for nid in range(min(cut + 1, g.next_node_id)):
    kind = g.kind(nid)
    if kind == 0:
      continue
    item = {"id": nid, "type": REFERENCE_TYPE[kind]}
    if kind in (FACE, VOICE):
      bank = g.faces if kind == FACE else g.voices
      item["num_embeddings"] = int(bank.count.data[g.node_slot.data[nid]])
      item["num_contents"] = len(g.contents[nid])
      if kind == VOICE:
        item["asr"] = g.contents[nid]
    else:
      item["clip"] = int(g.node_clip.data[nid])
      item["text"] = g.contents[nid][0]
    nodes.append(item)
  edges = [{"text": int(g.text_node.data[t]), "entity": int(e), "weight": float(w)}
           for t, e, w in zip(g.edge_text.valid, g.edge_entity.valid, g.edge_weight.valid)
           if w > 0 and g.text_node.data[t] <= cut and e <= cut]
  chars = g.characters(before_clip)
  return {"format": "m3jax.memory_graph.export", "before_clip": before_clip, "config": {"mode": g.config.mode},
          "nodes": nodes, "edges": edges, "characters": chars.mappings}
