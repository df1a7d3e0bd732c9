"""Graph journals: the insertions one clip made to a `MemoryGraph`, saved in O(clip) and replayed exactly.

WHY: saving the whole graph after every clip costs O(graph) per clip, O(N^2) over a video. A memory directory
instead snapshots the graph now and then and saves each clip in between as its journal: the records that
`graph.journal` collected (entity matches as decided, a clip's memories with their embeddings). Replaying them
on the snapshot rebuilds the same graph, bit for bit, with no similarity re-scored (`replay`). The memory
service replays the same records on the searchable copy of a space, so questions see each clip as it lands.

File format: one `.npz` (loaded with allow_pickle=False) holding the arrays `a0, a1, ...` and `meta`, the
records as UTF-8 JSON whose arrays are `{"array": i}` references.
"""

from __future__ import annotations

import json
import os
import pathlib
import zipfile

import numpy as np

from m3jax.memory.graph import GraphError, MemoryGraph


class JournalError(GraphError):
  """A journal file that cannot be read or replayed."""


def _encode(records: list[tuple], arrays: list[np.ndarray]) -> list:
  def enc(x):
    if isinstance(x, np.ndarray):
      arrays.append(np.asarray(x, np.float32))
      return {"array": len(arrays) - 1}
    if isinstance(x, (tuple, list)):
      return [enc(v) for v in x]
    if isinstance(x, (bool, np.bool_)):
      return bool(x)
    if isinstance(x, (int, np.integer)):
      return int(x)
    return x
  return [enc(r) for r in records]


def save(records: list[tuple], path: str | os.PathLike) -> None:
  """Writes the records next to `path`, fsyncs, renames into place (a torn write never carries the name)."""
  path = pathlib.Path(path)
  arrays: list[np.ndarray] = []
  meta = json.dumps(_encode(records, arrays), ensure_ascii=False).encode()
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "wb") as f:
    np.savez(f, meta=np.frombuffer(meta, np.uint8), **{f"a{i}": a for i, a in enumerate(arrays)})
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def load(path: str | os.PathLike) -> list:
  path = pathlib.Path(path)
  try:
    with np.load(path, allow_pickle=False) as z:
      arrays = {k: z[k] for k in z.files}
    meta = json.loads(arrays.pop("meta").tobytes().decode())
  except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
    raise JournalError(f"journal {path.name} is damaged: {type(e).__name__}: {e}") from None

  def dec(x):
    if isinstance(x, dict):
      return arrays[f"a{x['array']}"]
    if isinstance(x, list):
      return [dec(v) for v in x]
    return x
  return [dec(r) for r in meta]


def replay(graph: MemoryGraph, records: list) -> None:
  """Applies the records in order (the graph must be in the state they were recorded on)."""
  for record in records:
    if record[0] == "entities":
      graph.replay_entities(int(record[1]), [(int(n), bool(c), np.asarray(e, np.float32), list(items))
                                              for n, c, e, items in record[2]])
    elif record[0] == "clip":
      _, clip_id, episodic, semantic, episodic_emb, semantic_emb = record
      graph.add_clip(int(clip_id), episodic, semantic, episodic_emb=episodic_emb, semantic_emb=semantic_emb)
    else:
      raise JournalError(f"unknown journal record {record[0]!r}")
