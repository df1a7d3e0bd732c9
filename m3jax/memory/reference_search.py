"""A plain per-query Python/numpy port of the reference retrieval, run on the reference's own dict graph.

It follows `mmagent/videograph.py` and `mmagent/retrieve.py` as specified (reference §1.6, §1.7, §3): edge
scans for connected nodes, union-find characters from a Python `set` of statement ids, per-variant embedding
calls, one numpy matrix per query. Two deliberate deviations keep it comparable with m3jax: whole-tag id
replacement (the reference's substring replacement is a bug), and optional backfill of excluded clips. It is
the parity oracle for the tests and the "reference" side of `bench/retrieval.py`; m3jax code never calls it.
"""

from __future__ import annotations

import json
import pathlib
from typing import Callable, Sequence

import numpy as np

from m3jax.memory import tags
from m3jax.memory.reference_pickle import read_reference
from m3jax.memory.search import format_result


def load(path: str | pathlib.Path):
  return read_reference(pathlib.Path(path).read_bytes())


def connected(g, node_id: int, types: Sequence[str]) -> list[int]:
  """The reference's `get_connected_nodes`: a scan over every edge key."""
  return [b for (a, b) in g.edges if a == node_id and g.nodes[b].type in types]


def truncate(g, clip_id: int) -> None:
  """`truncate_memory_by_clip(clip_id, refresh=False)`: no-op when that clip has no text node."""
  last = None
  for nid in g.text_nodes:
    if g.nodes[nid].metadata["timestamp"] == clip_id:
      last = nid
  if last is None:
    return
  for nid in [n for n in g.nodes if n > last]:
    del g.nodes[nid]
  g.edges = {k: w for k, w in g.edges.items() if k[0] <= last and k[1] <= last}
  g.text_nodes = [n for n in g.text_nodes if n <= last]
  g.text_nodes_by_clip = {c: v for c, v in g.text_nodes_by_clip.items() if c <= clip_id}
  g.event_sequence_by_clip = {c: v for c, v in g.event_sequence_by_clip.items() if c <= clip_id}


def _entities(g, text: str) -> list[str]:
  out = []
  for kind, k in tags.parse_entities(text):
    if kind == "face" and k in g.nodes and g.nodes[k].type == "img" or \
       kind == "voice" and k in g.nodes and g.nodes[k].type == "voice":
      out.append(f"{kind}_{k}")
  return out


def refresh_equivalences(g) -> None:
  """Union-find characters as the reference computes them (voice pass, face pass, `set` order)."""
  def is_eq(n):
    return g.nodes[n].metadata["contents"][0].lower().startswith("equivalence")
  voice_eqs: list[int] = []
  for nid, n in g.nodes.items():
    if n.type != "voice":
      continue
    best, best_w = None, -1.0
    for s in connected(g, nid, ["semantic"]):
      if not is_eq(s):
        continue
      if any(e.startswith("face") for e in _entities(g, g.nodes[s].metadata["contents"][0])):
        if g.edges[(nid, s)] > best_w:
          best, best_w = s, g.edges[(nid, s)]
      else:
        voice_eqs.append(s)
    if best is not None:
      voice_eqs.append(best)
  img_eqs = [s for nid, n in g.nodes.items() if n.type == "img" for s in connected(g, nid, ["semantic"]) if is_eq(s)]
  parent: dict[str, str] = {}

  def find(x):
    parent.setdefault(x, x)
    while parent[x] != x:
      x = parent[x]
    return x
  for s in list(set(voice_eqs + img_eqs)):
    ents = _entities(g, g.nodes[s].metadata["contents"][0])
    for other in ents[1:]:
      ra, rb = find(ents[0]), find(other)
      if ra != rb:
        parent[rb] = ra
  g.character_mappings, g.reverse_character_mappings = {}, {}
  names: dict[str, str] = {}
  for tag in list(parent):
    root = find(tag)
    if root not in names:
      names[root] = f"character_{len(names)}"
      g.character_mappings[names[root]] = []
    g.character_mappings[names[root]].append(tag)
    g.reverse_character_mappings[tag] = names[root]
  for nid, n in g.nodes.items():
    tag = f"{'face' if n.type == 'img' else 'voice'}_{nid}"
    if n.type in ("img", "voice") and tag not in g.reverse_character_mappings:
      name = f"character_{len(g.character_mappings)}"
      g.character_mappings[name] = [tag]
      g.reverse_character_mappings[tag] = name


def search(g, query: str, current_clips: list[int], embed: Callable[[Sequence[str]], np.ndarray], topk: int = 5,
           mode: str = "max", threshold: float = 0.0, mem_wise: bool = False, before_clip: int | None = None,
           backfill: bool = False) -> dict[str, list[str]]:
  """The reference `search` (clip route, or node route with `mem_wise=True`); extends `current_clips`."""
  variants = tags.back_translate(query, g.character_mappings)
  related: list[int] = []
  for kind, k in tags.parse_entities(query):
    if kind == "character":
      related += [int(m.split("_")[1]) for m in g.character_mappings.get(f"character_{k}", [])]
    elif f"{kind}_{k}" in g.reverse_character_mappings:
      related.append(k)
  q = np.stack([embed([v])[0] for v in variants])
  if related:
    cands = list(dict.fromkeys(t for e in related for t in connected(g, e, ["episodic", "semantic"])))
  else:
    cands = list(g.text_nodes)
  scores: dict[int, float] = {}
  if cands:
    emb = np.array([g.nodes[n].embeddings[0] for n in cands])
    sims = (q @ emb.T).max(axis=0)
    scores = dict(zip(cands, sims.tolist()))
  reverse = g.reverse_character_mappings
  if mem_wise:
    out: dict[int, list[str]] = {}
    n_out = 0
    for nid in sorted(scores, key=lambda n: -scores[n]):
      clip = g.nodes[nid].metadata["timestamp"]
      text = g.nodes[nid].metadata["contents"][0]
      if before_clip is not None and clip > before_clip or tags.is_hidden(text):
        continue
      out.setdefault(clip, []).append(tags.translate(text, reverse))
      n_out += 1
      if n_out >= topk:
        break
    return {f"CLIP_{c}": out[c] for c in sorted(out) if out[c]}
  clip_scores: dict[int, list[float]] = {}
  for nid, s in scores.items():
    clip_scores.setdefault(g.nodes[nid].metadata["timestamp"], []).append(s)
  agg = {c: (max(v) if mode == "max" else sum(v) if mode == "sum" else sum(v) / len(v)) for c, v in clip_scores.items()}
  ranked = sorted(sorted(agg), key=lambda c: -agg[c])
  ranked = [c for c in ranked if agg[c] >= threshold and (before_clip is None or c <= before_clip)]
  if backfill:
    ranked = [c for c in ranked if c not in current_clips]
  new = [c for c in ranked[:topk] if c not in current_clips]
  current_clips.extend(new)
  memories = {}
  for c in sorted(new):
    texts = [g.nodes[n].metadata["contents"][0] for n in g.text_nodes_by_clip.get(c, [])]
    memories[f"CLIP_{c}"] = [tags.translate(t, reverse) for t in texts if not tags.is_hidden(t)]
  return memories


def answer(path_or_graph, query: str, route: str, before_clip: int | None, current_clips: list[int],
           embed: Callable[[Sequence[str]], np.ndarray], reload: bool = True, backfill: bool = False) -> str:
  """One controller search as the reference control loop does it (reload, truncate, refresh, search)."""
  g = load(path_or_graph) if reload else path_or_graph
  if before_clip is not None:
    truncate(g, before_clip)
  refresh_equivalences(g)
  if route == "node":
    mem = search(g, query, [], embed, topk=20, mem_wise=True, before_clip=before_clip)
  else:
    mem = search(g, query, current_clips, embed, topk=2, mode="max", threshold=0.5, before_clip=before_clip,
                 backfill=backfill)
  return format_result(mem)


def fixture_queries(path: str | pathlib.Path) -> list[dict]:
  return json.loads(pathlib.Path(path).read_text())["queries"]
