"""Ingestion jobs: a video is memorized into a `video` space in the background, clip by clip.

Jobs are rows in SQLite (queued -> running -> done | failed) and run one at a time on a worker thread, so
they survive restarts: unfinished jobs are requeued at start-up and the memorizer resumes at its first clip
not yet checkpointed. WHY clip by clip: before every clip the job waits (up to `yield_s`) until no question is
queued or being answered, so memorization never starves questions. The memorizer keeps its graph in memory for
the whole job and checkpoints each clip as a journal (O(clip), m3jax.memorize.pipeline); the same journal is
replayed on the space's searchable graph, so questions see each memorized clip as it lands, and neither copy
is ever reloaded from disk or rebuilt while the video goes on.

A video is keyed by the SHA-256 of its bytes: the same video sent twice to one space is refused (409), as
`m3jax memorize` refuses to memorize one video twice into a memory directory.
"""

from __future__ import annotations

import hashlib
import math
import pathlib
import queue
import threading
import uuid

from m3jax.memorize.pipeline import MemorizeConfig
from m3jax.serve.batching import Batcher
from m3jax.serve.spaces import Space, SpaceError, SpaceStore


def file_sha256(path: pathlib.Path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
      digest.update(chunk)
  return digest.hexdigest()


class JobRunner:
  def __init__(self, store: SpaceStore, batcher: Batcher, yield_s: float, config: MemorizeConfig):
    self.store, self.batcher, self.yield_s, self.config = store, batcher, yield_s, config
    self._queue: queue.Queue[tuple[str, str, str, str, str] | None] = queue.Queue()
    self._models = None                       # perception models, loaded by the first job
    self._stopping = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="m3jax-jobs", daemon=True)
    self._thread.start()
    for row in store.jobs_unfinished():
      self._queue.put(row)

  def submit(self, tenant: str, space: Space, video: pathlib.Path, label: str, sha256: str | None = None) -> str:
    """Queues `video` (`label`: the name the client knows it by; `sha256`: of its bytes, computed if None)."""
    if space.kind != "video":
      raise SpaceError(f"space {space.id} is a {space.kind!r} space; create a space with kind='video' to ingest "
                       "videos", 409)
    from m3jax.perception.media import MediaError, probe
    try:
      probe(video)                              # corrupt media is refused now, not later in the job
    except MediaError:
      raise SpaceError(f"{label!r} is not a usable video (no readable audio or video stream)", 422) from None
    job_id = uuid.uuid4().hex
    self.store.job_insert(job_id, space.id, tenant, str(video), label, sha256 or file_sha256(video))
    self._queue.put((job_id, space.id, tenant, str(video), label))
    return job_id

  def close(self) -> None:
    """Stops at the next clip boundary; an interrupted job stays `running` and resumes at the next start."""
    self._stopping.set()
    self._queue.put(None)
    self._thread.join(timeout=5)

  def _loop(self) -> None:
    while True:
      job = self._queue.get()
      if job is None:
        return
      self._run(*job)

  def _run(self, job_id: str, space_id: str, tenant: str, source: str, label: str) -> None:
    from m3jax.perception.media import probe
    from m3jax.memorize.pipeline import Memorizer
    done, total = 0, 0
    try:
      space = self.store.get(tenant, space_id)
      video = pathlib.Path(source).resolve()
      total = math.ceil(probe(video).duration / self.config.clip_seconds)
      memdir = self.store.space_dir(space_id) / "memdir"
      memorizer = Memorizer(memdir, self.config, models=self._models)
      if not _same_graph(space.graph, memorizer.graph):   # the space's copy missed a clip (an earlier failure)
        self.store.reload(space)
      self.store.job_update(job_id, "running", done, total)
      while not self._stopping.is_set():
        self.batcher.wait_idle(self.yield_s)
        # append: a new video goes after the space's last one; the last one itself resumes (keyed on content)
        report = memorizer.memorize(video, append=True, max_clips=1, progress=False)
        self._models = memorizer.models
        done = report.clips_skipped + len(report.clips_done)   # skipped = clips of this video done earlier
        if not report.clips_done:
          break
        self.store.apply_journal(space, memorizer.last_journal)
        self.store.job_update(job_id, "running", done, total)
      else:
        return                                   # shutting down: resumed from its checkpoint next start
      self.store.job_update(job_id, "done", done, total)
    except Exception as e:                       # the job fails alone; the server keeps serving
      if not self._stopping.is_set():
        self.store.job_update(job_id, "failed", done, total, _public_message(e, source, label))


def _same_graph(a, b) -> bool:
  return (a.next_node_id, a.num_text, a.edge_text.size, a.max_clip) == (b.next_node_id, b.num_text,
                                                                       b.edge_text.size, b.max_clip)


def _public_message(e: Exception, source: str, label: str) -> str:
  """The failure as the client may see it: the video's server path becomes its label, and any other path under
  the data directory is dropped by the API's scrubbing (app.py)."""
  return f"{type(e).__name__}: {e}".replace(source, label)
