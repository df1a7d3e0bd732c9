"""Memory spaces on disk: SQLite (WAL) metadata and clip log, plus graph snapshots (array files).

Layout under `data_dir`:
  meta.sqlite              spaces, clip log (memories + their embeddings), jobs
  spaces/<id>/graph_<seq>  MemoryGraph snapshot holding clip-log rows 1..seq (m3jax.memory.store format)
  spaces/<id>/memdir/      memorization directory of `video` spaces (m3jax.memorize.pipeline format: snapshots and
                           per-clip journals, each clip durable once its job reports it done)
WHY a clip log: a clip is acknowledged only after its row (texts and embeddings) is committed with
`synchronous=FULL`, which survives `kill -9` and power loss; snapshots are only a start-up shortcut. A restart
loads the snapshot named in SQLite and replays the later rows with their stored embeddings, so the rebuilt
graph is identical to the one that served before. Writes to one space are serialised by its lock, and
searches take the same lock, so concurrent requests never see or make a half-inserted clip.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
import shutil
import sqlite3
import threading
import time
import uuid
from typing import Callable, Sequence

import numpy as np

from m3jax.memory import journal as journal_lib
from m3jax.memory.graph import GraphConfig, GraphError, MemoryGraph
from m3jax.memory.search import SearchConfig
from m3jax.memory.store import GraphFormatError, fsync_tree
from m3jax.memory.store import load_graph, save_graph

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
ID_RE = re.compile(r"^[0-9a-f]{32}$")
KINDS = ("clips", "video")
MAX_CLIP_ID = 2**31 - 1                # clip ids are int32 on device

_SCHEMA = """
CREATE TABLE IF NOT EXISTS spaces (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT NOT NULL,
  kind TEXT NOT NULL, created REAL NOT NULL, snapshot TEXT, snapshot_seq INTEGER NOT NULL DEFAULT 0,
  UNIQUE (tenant, name));
CREATE TABLE IF NOT EXISTS clips (space_id TEXT NOT NULL, seq INTEGER NOT NULL, clip_id INTEGER NOT NULL,
  episodic TEXT NOT NULL, semantic TEXT NOT NULL, emb BLOB NOT NULL, created REAL NOT NULL,
  PRIMARY KEY (space_id, seq));
CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, space_id TEXT NOT NULL, tenant TEXT NOT NULL,
  source TEXT NOT NULL, status TEXT NOT NULL, clips_done INTEGER NOT NULL DEFAULT 0, clips_total INTEGER NOT NULL DEFAULT 0, message TEXT NOT NULL
  DEFAULT '', created REAL NOT NULL, updated REAL NOT NULL);
"""
# columns added after the first release (ALTERed into older databases): what the client calls the video (the
# server path in `source` is never shown) and the SHA-256 of its bytes (one video is ingested once per space)
_JOB_COLUMNS = {"label": "TEXT NOT NULL DEFAULT ''", "sha256": "TEXT NOT NULL DEFAULT ''"}


class SpaceError(ValueError):
  """A request the space store refuses; `status` is the HTTP status the API answers with."""

  def __init__(self, message: str, status: int = 400):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class Space:
  id: str
  tenant: str
  name: str
  kind: str
  graph: MemoryGraph
  seq: int                                   # last clip-log row applied to `graph`
  lock: threading.RLock = dataclasses.field(default_factory=threading.RLock)
  deleted: bool = False                      # set under `lock`; a request holding a stale handle sees it

  @property
  def dir_name(self) -> str:
    return self.id

  def summary(self) -> dict:
    g = self.graph
    return {"id": self.id, "name": self.name, "kind": self.kind, "clips": len(g.clip_texts),
            "max_clip": g.max_clip, "nodes": g.next_node_id, "memories": g.num_text}


class SpaceStore:
  """All spaces of a data directory. Thread-safe; one instance per process owns the directory."""

  def __init__(self, data_dir: str | pathlib.Path, graph_config: GraphConfig, search_config: SearchConfig,
               embed_fn: Callable[[Sequence[str]], np.ndarray], snapshot_every: int = 64):
    self.root = pathlib.Path(data_dir)
    (self.root / "spaces").mkdir(parents=True, exist_ok=True)
    self.graph_config, self.search_config, self.embed_fn = graph_config, search_config, embed_fn
    self.snapshot_every = snapshot_every
    self._db = sqlite3.connect(self.root / "meta.sqlite", check_same_thread=False, isolation_level=None)
    self._db.execute("PRAGMA journal_mode=WAL")
    self._db.execute("PRAGMA synchronous=FULL")
    self._db.executescript(_SCHEMA)
    have = {row[1] for row in self._db.execute("PRAGMA table_info(jobs)")}
    for name, decl in _JOB_COLUMNS.items():
      if name not in have:
        self._db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {decl}")
    self._db_lock = threading.Lock()
    self._spaces: dict[str, Space] = {}
    self._load_lock = threading.Lock()

  # ------------------------------------------------------------------------------------------------- db
  def _query(self, sql: str, args: tuple = ()) -> list[tuple]:
    with self._db_lock:
      return self._db.execute(sql, args).fetchall()

  def _write(self, statements: list[tuple[str, tuple]]) -> None:
    """Runs `statements` in one durable transaction (committed to the WAL and fsynced before returning)."""
    with self._db_lock:
      self._db.execute("BEGIN IMMEDIATE")
      try:
        for sql, args in statements:
          self._db.execute(sql, args)
        self._db.execute("COMMIT")
      except BaseException:
        self._db.execute("ROLLBACK")
        raise

  def space_dir(self, space_id: str) -> pathlib.Path:
    if not ID_RE.match(space_id):                   # ids are ours; never build a path from anything else
      raise SpaceError(f"malformed space id {space_id!r}", 404)
    return self.root / "spaces" / space_id

  # ---------------------------------------------------------------------------------------------- spaces
  def create(self, tenant: str, name: str, kind: str = "clips") -> Space:
    if not isinstance(name, str) or not NAME_RE.match(name):
      raise SpaceError(f"space name {name!r} must match {NAME_RE.pattern}", 422)
    if kind not in KINDS:
      raise SpaceError(f"space kind must be one of {KINDS}, got {kind!r}", 422)
    space_id = uuid.uuid4().hex
    try:
      self._write([("INSERT INTO spaces (id, tenant, name, kind, created) VALUES (?, ?, ?, ?, ?)",
                    (space_id, tenant, name, kind, time.time()))])
    except sqlite3.IntegrityError:
      raise SpaceError(f"a space named {name!r} already exists", 409) from None
    self.space_dir(space_id).mkdir(parents=True, exist_ok=True)
    return self.get(tenant, space_id)

  def list(self, tenant: str) -> list[Space]:
    rows = self._query("SELECT id FROM spaces WHERE tenant = ? ORDER BY created", (tenant,))
    return [self.get(tenant, r[0]) for r in rows]

  def get(self, tenant: str, space_id: str) -> Space:
    """The space, loaded on first use. Another tenant's space is reported as unknown (no existence leak)."""
    space = self._spaces.get(space_id)
    if space is None:
      with self._load_lock:
        space = self._spaces.get(space_id) or self._load(space_id)
    if space is None or space.tenant != tenant:
      raise SpaceError(f"unknown space {space_id!r}", 404)
    return space

  def loaded(self, space_id: str) -> Space | None:
    """The space if it is already in memory (no disk access; the caller checks the tenant)."""
    return self._spaces.get(space_id)

  @property
  def num_loaded(self) -> int:
    return len(self._spaces)

  def delete(self, tenant: str, space_id: str) -> None:
    space = self.get(tenant, space_id)
    if self._query("SELECT 1 FROM jobs WHERE space_id = ? AND status IN ('queued', 'running')", (space_id,)):
      raise SpaceError(f"space {space_id} has an ingestion job in progress; delete it when the job is done", 409)
    with space.lock:
      self._write([("DELETE FROM clips WHERE space_id = ?", (space_id,)),
                   ("DELETE FROM jobs WHERE space_id = ?", (space_id,)),
                   ("DELETE FROM spaces WHERE id = ?", (space_id,))])
      self._spaces.pop(space_id, None)
      space.deleted = True
      shutil.rmtree(self.space_dir(space_id), ignore_errors=True)

  def _load(self, space_id: str) -> Space | None:
    rows = self._query("SELECT tenant, name, kind FROM spaces WHERE id = ?", (space_id,))
    if not rows or not ID_RE.match(space_id):
      return None
    tenant, name, kind = rows[0]
    graph, seq = self._read_graph(space_id, kind)
    space = Space(space_id, tenant, name, kind, graph, seq)
    self._spaces[space_id] = space
    return space

  def _read_graph(self, space_id: str, kind: str) -> tuple[MemoryGraph, int]:
    """The space's graph as stored on disk, and the last clip-log row it holds."""
    snapshot, snapshot_seq = self._query("SELECT snapshot, snapshot_seq FROM spaces WHERE id = ?", (space_id,))[0]
    d = self.space_dir(space_id)
    if kind == "video":
      from m3jax.memorize.pipeline import load_memory, read_manifest
      graph = load_memory(d / "memdir") if read_manifest(d / "memdir") else MemoryGraph(self.graph_config)
      seq = 0
    else:
      graph = MemoryGraph(self.graph_config)
      if snapshot:
        try:
          graph = load_graph(d / snapshot)
        except GraphFormatError:
          if snapshot_seq == 0:                 # an imported graph has no clip log to rebuild it from
            raise
          snapshot_seq = 0                      # a damaged periodic snapshot: rebuild from the whole clip log
      seq = snapshot_seq
      for row_seq, clip_id, ep, sem, blob in self._query(
          "SELECT seq, clip_id, episodic, semantic, emb FROM clips WHERE space_id = ? AND seq > ? ORDER BY seq",
          (space_id, snapshot_seq)):
        ep, sem = json.loads(ep), json.loads(sem)
        emb = np.frombuffer(blob, np.float32).reshape(len(ep) + len(sem), graph.config.text_dim)
        graph.add_clip(clip_id, ep, sem, episodic_emb=emb[: len(ep)], semantic_emb=emb[len(ep):])
        seq = row_seq
      for stale in d.glob("graph_*"):          # left by a snapshot interrupted before its commit
        if stale.name != snapshot:
          shutil.rmtree(stale, ignore_errors=True)
    return graph, seq

  def reload(self, space: Space) -> Space:
    """Rebuilds the space's graph from disk in place (after a failed write or an admin import)."""
    with space.lock:
      graph, space.seq = self._read_graph(space.id, space.kind)
      self.replace_graph(space, graph)
    return space

  # ----------------------------------------------------------------------------------------------- clips
  def add_clip(self, space: Space, episodic: Sequence[str], semantic: Sequence[str],
               clip_id: int | None = None) -> dict:
    """Inserts one clip's memories; returns once the clip is durable (committed)."""
    if space.kind != "clips":
      raise SpaceError(f"space {space.id} is a {space.kind!r} space: its memories come from ingestion jobs", 409)
    for s in list(episodic) + list(semantic):
      if not isinstance(s, str) or not s.strip():
        raise SpaceError("memories must be non-empty strings", 422)
    texts = list(episodic) + list(semantic)
    emb = np.asarray(self.embed_fn(texts), np.float32) if texts else np.zeros((0, self.graph_config.text_dim),
                                                                               np.float32)
    with space.lock:
      if space.deleted:
        raise SpaceError(f"unknown space {space.id!r}", 404)
      g = space.graph
      if clip_id is None:
        clip_id = g.max_clip + 1
      if not isinstance(clip_id, int) or not 0 <= clip_id <= MAX_CLIP_ID:
        raise SpaceError(f"clip_id must be an integer in 0..{MAX_CLIP_ID}, got {clip_id!r}", 422)
      if clip_id < g.max_clip:
        raise SpaceError(f"clip {clip_id} comes before clip {g.max_clip} already stored: clips are inserted in "
                         "time order", 409)
      try:
        created = g.add_clip(clip_id, list(episodic), list(semantic), episodic_emb=emb[: len(episodic)],
                             semantic_emb=emb[len(episodic):])
      except GraphError as e:
        self.reload(space)
        raise SpaceError(str(e), 422) from None
      seq = space.seq + 1
      try:
        self._write([("INSERT INTO clips (space_id, seq, clip_id, episodic, semantic, emb, created) VALUES "
                      "(?, ?, ?, ?, ?, ?, ?)", (space.id, seq, clip_id, json.dumps(list(episodic)),
                                                json.dumps(list(semantic)), emb.tobytes(), time.time()))])
      except BaseException:
        self.reload(space)                     # the in-memory graph holds a clip that was not stored
        raise
      space.seq = seq
      if seq % self.snapshot_every == 0:
        self.snapshot(space)
      return {"clip_id": clip_id, "seq": seq, "created_nodes": created}

  def snapshot(self, space: Space) -> None:
    """Saves the graph, then points SQLite at it, then removes the previous snapshot."""
    with space.lock:
      name = f"graph_{space.seq:08d}"
      d = self.space_dir(space.id)
      old = self._query("SELECT snapshot FROM spaces WHERE id = ?", (space.id,))
      save_graph(space.graph, d / name)
      fsync_tree(d / name)                     # the files are on disk before SQLite points at them
      self._write([("UPDATE spaces SET snapshot = ?, snapshot_seq = ? WHERE id = ?", (name, space.seq, space.id))])
      if old and old[0][0] and old[0][0] != name:
        shutil.rmtree(d / old[0][0], ignore_errors=True)

  def snapshot_all(self) -> None:
    """Snapshots every loaded `clips` space with log rows past its snapshot (clean shutdown: fast restart)."""
    for space in list(self._spaces.values()):
      if space.kind == "clips":
        rows = self._query("SELECT snapshot_seq FROM spaces WHERE id = ?", (space.id,))
        if rows and rows[0][0] < space.seq:
          self.snapshot(space)

  def import_graph(self, tenant: str, name: str, graph: MemoryGraph) -> Space:
    """A new `clips` space whose starting graph is `graph` (admin import; later clips append to it)."""
    space = self.create(tenant, name, "clips")
    with space.lock:
      save_graph(graph, self.space_dir(space.id) / "graph_import")
      fsync_tree(self.space_dir(space.id) / "graph_import")
      self._write([("UPDATE spaces SET snapshot = ?, snapshot_seq = 0 WHERE id = ?", ("graph_import", space.id))])
    return self.reload(space)

  def import_memory_dir(self, tenant: str, name: str, memory_dir: str | os.PathLike) -> Space:
    """A new `video` space holding a copy of a memory directory written by `m3jax memorize` (later ingestion
    jobs append their videos to it)."""
    from m3jax.memorize.pipeline import load_memory, read_manifest
    src = pathlib.Path(memory_dir)
    if not read_manifest(src):
      raise SpaceError(f"{memory_dir} is not a memory directory (written by `m3jax memorize VIDEO --memory DIR`)",
                       422)
    graph = load_memory(src)                              # refuses a damaged directory before anything is made
    for dim in ("text_dim", "face_dim", "voice_dim"):       # what the service's embedder and perception produce
      if getattr(graph.config, dim) != getattr(self.graph_config, dim):
        raise SpaceError(f"{memory_dir} has graph {dim}={getattr(graph.config, dim)}; the service's graph has "
                         f"{dim}={getattr(self.graph_config, dim)}", 422)
    space = self.create(tenant, name, "video")
    with space.lock:
      memdir = self.space_dir(space.id) / "memdir"
      shutil.copytree(src, memdir, ignore=shutil.ignore_patterns("*.tmp"))
      fsync_tree(memdir)
    return self.reload(space)

  def replace_graph(self, space: Space, graph: MemoryGraph) -> None:
    """Swaps in a new graph (a reload from disk)."""
    with space.lock:
      space.graph = graph

  def apply_journal(self, space: Space, records: list) -> None:
    """Replays one memorized clip's graph insertions on the space's searchable graph (O(clip), under its lock:
    questions see the clip whole or not at all)."""
    with space.lock:
      journal_lib.replay(space.graph, records)

  # ------------------------------------------------------------------------------------------------ jobs
  def job_insert(self, job_id: str, space_id: str, tenant: str, source: str, label: str, sha256: str) -> None:
    """Queues a job, unless the space already has (or is ingesting) a video with these bytes: 409 naming that
    job. Checked and inserted in one transaction, so two concurrent uploads of one video cannot both pass."""
    now = time.time()
    with self._db_lock:
      self._db.execute("BEGIN IMMEDIATE")
      try:
        dup = self._db.execute("SELECT id, label FROM jobs WHERE space_id = ? AND sha256 = ? AND status IN "
                               "('queued', 'running', 'done')", (space_id, sha256)).fetchone()
        if dup is None:
          self._db.execute("INSERT INTO jobs (id, space_id, tenant, source, status, created, updated, label, sha256) "
                           "VALUES (?, ?, ?, ?, 'queued', ?, ?, ?, ?)",
                           (job_id, space_id, tenant, source, now, now, label, sha256))
        self._db.execute("COMMIT")
      except BaseException:
        self._db.execute("ROLLBACK")
        raise
    if dup is not None:
      raise SpaceError(f"this video ({label!r}, sha256 {sha256[:12]}...) is already ingested into space {space_id} "
                       f"by job {dup[0]} ({dup[1]!r}); its memories are not added twice", 409)

  def job_update(self, job_id: str, status: str, clips_done: int, clips_total: int, message: str = "") -> None:
    self._write([("UPDATE jobs SET status = ?, clips_done = ?, clips_total = ?, message = ?, updated = ? WHERE "
                  "id = ?", (status, clips_done, clips_total, message, time.time(), job_id))])

  def job_get(self, tenant: str, job_id: str) -> dict:
    rows = self._query("SELECT id, space_id, label, status, clips_done, clips_total, message, created, updated "
                       "FROM jobs WHERE id = ? AND tenant = ?", (job_id, tenant))
    if not rows:
      raise SpaceError(f"unknown job {job_id!r}", 404)
    keys = ("id", "space_id", "source", "status", "clips_done", "clips_total", "message", "created", "updated")
    return dict(zip(keys, rows[0]))

  def jobs_unfinished(self) -> list[tuple[str, str, str, str, str]]:
    """(id, space_id, tenant, source, label) of the jobs to resume, oldest first."""
    return self._query("SELECT id, space_id, tenant, source, label FROM jobs WHERE status IN ('queued', 'running') "
                       "ORDER BY created")

  def close(self) -> None:
    with self._db_lock:
      self._db.close()

