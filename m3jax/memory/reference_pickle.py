"""Import of the released reference memory graphs (pickles of `videograph.VideoGraph`) without the reference code.

`pickle.load` would import and call whatever a file names. The unpickler here resolves exactly two globals,
`videograph.VideoGraph` and `videograph.VideoGraph.Node`, to inert placeholder classes (objects are rebuilt by
`__new__` + `__dict__` update), and refuses every other global, so a crafted file cannot run code. The data
(builtin dicts, lists, floats) is then validated and copied into a `MemoryGraph` with the same node ids.
"""

from __future__ import annotations

import io
import pathlib
import pickle

import numpy as np

from m3jax.memory.graph import EPISODIC, FACE, SEMANTIC, VOICE, GraphConfig, GraphError, MemoryGraph


class UnsafePickleError(GraphError):
  """The pickle names something other than the reference graph classes."""


class _VideoGraph:
  """Inert stand-in for `videograph.VideoGraph` (data only)."""


class _Node:
  """Inert stand-in for `videograph.VideoGraph.Node` (data only)."""


_ALLOWED = {("videograph", "VideoGraph"): _VideoGraph, ("videograph", "VideoGraph.Node"): _Node}


class RestrictedUnpickler(pickle.Unpickler):
  def find_class(self, module: str, name: str):
    cls = _ALLOWED.get((module, name))
    if cls is None:
      raise UnsafePickleError(f"refusing to load global {module}.{name}: only videograph.VideoGraph and "
                              "videograph.VideoGraph.Node are allowed in a reference memory graph")
    return cls

  def persistent_load(self, pid):
    raise UnsafePickleError("persistent ids are not allowed in a reference memory graph")


def read_reference(data: bytes) -> _VideoGraph:
  try:
    obj = RestrictedUnpickler(io.BytesIO(data)).load()
  except UnsafePickleError:
    raise
  except Exception as e:  # truncated or garbled bytes
    raise GraphError(f"not a readable reference memory graph pickle: {type(e).__name__}: {e}") from None
  if not isinstance(obj, _VideoGraph) or not isinstance(getattr(obj, "nodes", None), dict):
    raise GraphError("pickle does not hold a videograph.VideoGraph with a `nodes` dict")
  return obj


_TYPES = {"img": FACE, "voice": VOICE, "episodic": EPISODIC, "semantic": SEMANTIC}


def load_reference_pickle(path: str | pathlib.Path, config: GraphConfig | None = None) -> MemoryGraph:
  """Reads a reference pickle into a MemoryGraph (ids, text order, edges and weights preserved)."""
  ref = read_reference(pathlib.Path(path).read_bytes())
  nodes = ref.nodes
  dims = {}
  for n in nodes.values():
    if not isinstance(n, _Node) or getattr(n, "type", None) not in _TYPES:
      raise GraphError(f"node {getattr(n, 'id', '?')} has an unknown type {getattr(n, 'type', None)!r}")
    if n.embeddings:
      dims.setdefault(n.type, len(n.embeddings[0]))
  if config is None:
    config = GraphConfig(text_dim=dims.get("episodic", dims.get("semantic", 384)), face_dim=dims.get("img", 512),
                         voice_dim=dims.get("voice", 192),
                         max_face_embeddings=int(getattr(ref, "max_img_embeddings", 10)),
                         max_voice_embeddings=int(getattr(ref, "max_audio_embeddings", 20)),
                         face_threshold=float(getattr(ref, "img_matching_threshold", 0.3)),
                         voice_threshold=float(getattr(ref, "audio_matching_threshold", 0.6)), mode="reference")
  g = MemoryGraph(config)
  n_ids = max(int(getattr(ref, "next_node_id", 0)), max(nodes, default=-1) + 1)
  for _ in range(n_ids):            # ids deleted in the reference file stay empty (kind 0)
    g._new_node(0, -1, -1, [])
  for nid in sorted(nodes):
    n = nodes[nid]
    kind = _TYPES[n.type]
    if kind in (FACE, VOICE):
      bank = g.faces if kind == FACE else g.voices
      emb = np.asarray(n.embeddings, np.float32)
      if emb.ndim != 2 or emb.shape[1] != bank.dim or not 0 < len(emb) <= bank.max_embeddings:
        raise GraphError(f"node {nid}: embeddings of shape {emb.shape} do not fit [<= {bank.max_embeddings}, "
                         f"{bank.dim}]")
      _place(g, nid, kind, bank.add(nid, emb), -1, list(n.metadata.get("contents", [])))
  text_rank = {nid: i for i, nid in enumerate(getattr(ref, "text_nodes", []))}
  # text rows ordered by clip, then insertion: the search kernel relies on clip-sorted rows (the reference
  # driver may have processed clips out of order)
  texts = sorted((nid for nid, n in nodes.items() if _TYPES[n.type] in (EPISODIC, SEMANTIC)),
                 key=lambda nid: (int(nodes[nid].metadata["timestamp"]), text_rank.get(nid, len(text_rank)), nid))
  for nid in texts:
    n = nodes[nid]
    emb = np.asarray(n.embeddings, np.float32).reshape(-1)
    if emb.shape != (g.config.text_dim,):
      raise GraphError(f"text node {nid}: embedding of shape {emb.shape}, expected ({g.config.text_dim},)")
    text, clip = str(n.metadata["contents"][0]), int(n.metadata["timestamp"])
    slot = g.append_text_row(_TYPES[n.type], text, emb, clip, nid, g.entity_ids(text, expand_characters=False))
    _place(g, nid, _TYPES[n.type], slot, clip, [text])
  slot_of = {nid: int(g.node_slot.data[nid]) for nid in texts}
  by_clip = getattr(ref, "text_nodes_by_clip", {}) or {}
  g.clip_texts = {int(c): [slot_of[n] for n in by_clip[c] if n in slot_of] for c in sorted(by_clip)}
  listed = {s for v in g.clip_texts.values() for s in v}
  for nid, slot in slot_of.items():
    if slot not in listed:
      g.clip_texts.setdefault(int(g.node_clip.data[nid]), []).append(slot)
  edges = [(int(g.node_slot.data[a]), b, float(w)) for (a, b), w in ref.edges.items()
           if g.kind(a) in (EPISODIC, SEMANTIC) and g.kind(b) in (FACE, VOICE) and w > 0]
  for slot, entity, w in sorted(edges, key=lambda e: e[0]):     # edge rows sorted by text row, as when inserting
    g.set_edge(slot, entity, w)
  g._touch()
  return g


def _place(g: MemoryGraph, nid: int, kind: int, slot: int, clip: int, contents: list[str]) -> None:
  g.node_kind.set(nid, kind)
  g.node_slot.set(nid, slot)
  g.node_clip.set(nid, clip)
  g.contents[nid] = contents
