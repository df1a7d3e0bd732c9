"""Versioned persistence of a MemoryGraph: a directory with a manifest, the columns, and the text store.

Layout (format `m3jax.memory_graph`, version 1):
  manifest.json   format name, version, GraphConfig, counts (checked on load)
  arrays.npz      every struct-of-arrays column (valid rows only; loaded with allow_pickle=False)
  text.json       node contents (sentences, ASR, face crops), per-text entity lists, clip -> text order
  scann/          the ScaNN index when one is attached (its docids kept in the manifest, not in a pickle)
The directory is written next to the target and renamed into place, so a failed save never destroys the
previous copy. Loading a newer format or a damaged directory raises `GraphFormatError` naming the problem.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import zipfile

import numpy as np

from m3jax.memory.graph import GraphConfig, MemoryGraph
from m3jax.memory.schema import FLAG_EQUIVALENCE, GraphFormatError

FORMAT = "m3jax.memory_graph"
VERSION = 1


def _columns(g: MemoryGraph) -> dict[str, np.ndarray]:
  cols = {"node_kind": g.node_kind, "node_clip": g.node_clip, "node_slot": g.node_slot, "text_emb": g.text_emb,
          "text_node": g.text_node, "text_clip": g.text_clip, "text_flags": g.text_flags, "edge_text": g.edge_text,
          "edge_entity": g.edge_entity, "edge_weight": g.edge_weight}
  for name, bank in (("face", g.faces), ("voice", g.voices)):
    cols.update({f"{name}_emb": bank.emb, f"{name}_count": bank.count, f"{name}_node": bank.node,
                 f"{name}_updates": bank.updates})
  return cols


def save_graph(g: MemoryGraph, path: str | os.PathLike) -> None:
  path = pathlib.Path(path)
  tmp = path.with_name(path.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  np.savez(tmp / "arrays.npz", **{k: c.valid for k, c in _columns(g).items()})
  text = {"contents": g.contents,
          "text_entities": [list(g.text_entities.get(s, ())) for s in range(g.num_text)],
          "clip_texts": {str(c): v for c, v in g.clip_texts.items()}}
  (tmp / "text.json").write_text(json.dumps(text, ensure_ascii=False))
  manifest = {"format": FORMAT, "version": VERSION, "config": dataclasses.asdict(g.config),
              "counts": {"nodes": g.next_node_id, "text": g.num_text, "edges": g.edge_text.size}}
  if g.index is not None:
    manifest["index"] = g.index.save(tmp / "index")
  (tmp / "manifest.json").write_text(json.dumps(manifest, indent=1))
  old = path.with_name(path.name + ".old")
  if path.exists():
    shutil.rmtree(old, ignore_errors=True)
    path.rename(old)
  tmp.rename(path)
  shutil.rmtree(old, ignore_errors=True)


def _read_json(p: pathlib.Path):
  try:
    return json.loads(p.read_text())
  except FileNotFoundError:
    raise GraphFormatError(f"saved graph is missing {p.name} ({p})") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise GraphFormatError(f"saved graph file {p} is damaged: {e}") from None


def load_graph(path: str | os.PathLike) -> MemoryGraph:
  path = pathlib.Path(path)
  if not path.is_dir():
    raise GraphFormatError(f"no saved memory graph at {path}")
  manifest = _read_json(path / "manifest.json")
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise GraphFormatError(f"{path} is not an m3jax memory graph (format {manifest.get('format')!r})")
  version = manifest.get("version")
  if not isinstance(version, int) or version > VERSION:
    raise GraphFormatError(f"{path} was written in memory-graph format version {version}; this m3jax reads "
                           f"versions <= {VERSION} (upgrade m3jax)")
  try:
    config = GraphConfig(**manifest["config"])
    with np.load(path / "arrays.npz", allow_pickle=False) as z:
      columns = {name: z[name] for name in _columns(MemoryGraph(config))}
  except (KeyError, TypeError, ValueError, OSError, zipfile.BadZipFile) as e:
    raise GraphFormatError(f"saved graph {path} is damaged: {type(e).__name__}: {e}") from None
  text = _read_json(path / "text.json")
  try:
    g = from_columns(config, columns, text["contents"], text["text_entities"],
                     {int(c): v for c, v in text["clip_texts"].items()})
  except (KeyError, TypeError, ValueError) as e:
    raise GraphFormatError(f"saved graph {path} is damaged: {type(e).__name__}: {e}") from None
  counts = manifest.get("counts", {})
  if (g.next_node_id, g.num_text, g.edge_text.size) != (counts.get("nodes"), counts.get("text"), counts.get("edges")):
    raise GraphFormatError(f"saved graph {path} is damaged: column sizes do not match the manifest counts")
  if "index" in manifest:
    from m3jax.memory.index import load_index
    g.index = load_index(path / "index", manifest["index"])
  g._touch()
  return g


def from_columns(config: GraphConfig, columns: dict[str, np.ndarray], contents: list, text_entities: list,
                 clip_texts: dict[int, list[int]]) -> MemoryGraph:
  """A graph from its columns and text store (loading, and bulk construction of large graphs)."""
  g = MemoryGraph(config)
  for name, col in _columns(g).items():
    col.load(columns[name])
  g.contents = [list(c) for c in contents]
  g.text_entities = {s: tuple(e) for s, e in enumerate(text_entities)}
  g.clip_texts = {int(c): list(v) for c, v in clip_texts.items()}
  if len(g.contents) != g.next_node_id or len(g.text_entities) != g.num_text:
    raise ValueError("text store does not match the arrays")
  if np.any(np.diff(g.edge_text.valid) < 0):
    raise ValueError("edge rows are not sorted by text row")
  g._max_clip = None
  rebuild_host_indexes(g)
  return g


def rebuild_host_indexes(g: MemoryGraph) -> None:
  """Edge lookup tables and the equivalence list, derived from the columns."""
  texts, ents = g.edge_text.valid.tolist(), g.edge_entity.valid.tolist()
  g.edge_of = {(t, e): r for r, (t, e) in enumerate(zip(texts, ents))}
  g.entity_edges, g.text_edges = {}, {}
  for r, (t, e) in enumerate(zip(texts, ents)):
    g.entity_edges.setdefault(e, []).append(r)
    g.text_edges.setdefault(t, []).append(r)
  g.equivalences = np.nonzero(g.text_flags.valid & FLAG_EQUIVALENCE)[0].tolist()


def fsync_tree(root: pathlib.Path) -> None:
  """fsyncs every file under `root`, then the directories (power-loss durability of a snapshot)."""
  dirs = [root, root.parent]
  for path in root.rglob("*"):
    if path.is_dir():
      dirs.append(path)
      continue
    with open(path, "rb") as f:
      os.fsync(f.fileno())
  for d in dirs:
    fd = os.open(d, os.O_RDONLY)
    try:
      os.fsync(fd)
    finally:
      os.close(fd)
