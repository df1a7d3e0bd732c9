"""A plain per-query Python/numpy port of the reference retrieval, run on the reference's own dict graph.

It follows `mmagent/videograph.py` and `mmagent/retrieve.py` as specified (reference §1.4, §1.6, §1.7, §3): tag
parsing, edge scans for connected nodes, union-find characters from a Python `set` of statement ids, per-variant
embedding calls, one numpy matrix per query, the `Searched knowledge: ` message. Two deliberate deviations keep it
comparable with m3jax: whole-tag id replacement (the reference's substring replacement is a bug), and optional
backfill of excluded clips.

It is the parity oracle of the search and graph tests and the "reference" side of `bench/retrieval.py` and
`bench/control.py`, so it imports nothing from `m3jax`: a bug in m3jax's tag handling, pickle reading or result
formatting cannot hide by reaching the oracle too. It lives with the tests because no m3jax code calls it.
"""

from __future__ import annotations

import itertools
import json
import pathlib
import pickle
import re
from typing import Callable, Sequence

import numpy as np

_ENTITY_RE = re.compile(r"<([^<>]*_[^<>]*)>")          # `parse_video_caption`'s pattern (reference §1.4)
_EMPTY = "\n(The search result is empty. Please try searching from another perspective.)"
MAX_VARIANTS = 100            # above this the reference keeps a `random.sample` of the variants (unreproducible)


class VideoGraph:
  """Data-only stand-in for `videograph.VideoGraph` (the fixture pickles are trusted test data)."""


class Node:
  """Data-only stand-in for `videograph.VideoGraph.Node`."""


class _Unpickler(pickle.Unpickler):
  def find_class(self, module: str, name: str):
    if module == "videograph" and name in ("VideoGraph", "VideoGraph.Node"):
      return VideoGraph if name == "VideoGraph" else Node
    raise pickle.UnpicklingError(f"a reference memory graph names only videograph classes, not {module}.{name}")


def load(path: str | pathlib.Path) -> VideoGraph:
  with open(path, "rb") as f:
    return _Unpickler(f).load()


def parse_entities(text: str) -> list[tuple[str, int]]:
  """`(type, id)` per tag, in text order: the body splits on `_` into exactly (type, int id), type lower-cased."""
  out = []
  for body in _ENTITY_RE.findall(text):
    parts = body.split("_")
    if len(parts) != 2 or parts[0].strip().lower() not in ("face", "voice", "character"):
      continue
    try:
      out.append((parts[0].strip().lower(), int(parts[1])))
    except ValueError:
      pass
  return out


def is_hidden(text: str) -> bool:
  """`translate` drops sentences starting with "equivalence: " (lower-cased, with the space)."""
  return text.lower().startswith("equivalence: ")


def translate(text: str, reverse: dict[str, str]) -> str:
  """Each distinct face/voice entity with a character becomes that character, whole `<...>` tags only."""
  for kind, k in dict.fromkeys(parse_entities(text)):
    if kind != "character" and f"{kind}_{k}" in reverse:
      text = text.replace(f"<{kind}_{k}>", f"<{reverse[f'{kind}_{k}']}>")
  return text


def back_translate(query: str, mappings: dict[str, list[str]]) -> list[str]:
  """One variant per combination of the member tags of the characters the query names (whole tags only)."""
  names = list(dict.fromkeys(f"character_{k}" for kind, k in parse_entities(query)
                             if kind == "character" and f"character_{k}" in mappings))
  combos = list(itertools.product(*[mappings[n] for n in names]))
  if len(combos) > MAX_VARIANTS:
    raise ValueError(f"{len(combos)} variants: the reference samples {MAX_VARIANTS} at random, no oracle exists")
  out = []
  for combo in combos:
    variant = query
    for name, member in zip(names, combo):
      variant = variant.replace(f"<{name}>", f"<{member}>")
    out.append(variant)
  return out


def format_result(memories: dict[str, list[str]]) -> str:
  """What the controller sees (reference §3.6)."""
  return "Searched knowledge: " + json.dumps(memories, ensure_ascii=False) + ("" if memories else _EMPTY)


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
  for kind, k in parse_entities(text):
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
  variants = back_translate(query, g.character_mappings)
  related: list[int] = []
  for kind, k in parse_entities(query):
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
      if before_clip is not None and clip > before_clip or is_hidden(text):
        continue
      out.setdefault(clip, []).append(translate(text, reverse))
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
    memories[f"CLIP_{c}"] = [translate(t, reverse) for t in texts if not is_hidden(t)]
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
