"""Ingestion jobs: a video is memorized into a `video` space in the background, clip by clip.

Jobs are rows in SQLite (queued -> running -> done | failed) and run one at a time on a worker thread, so
they survive restarts: unfinished jobs are requeued at start-up and the memorizer resumes at its first clip
not yet checkpointed. WHY clip by clip: before every clip the job waits (up to `yield_s`) until no question is
queued or being answered, so memorization never starves questions; after every clip the space's searchable
graph is replaced by the freshly checkpointed one, so questions see memories as they arrive.
"""

from __future__ import annotations

import math
import pathlib
import queue
import threading
import uuid

from m3jax.serve.batching import Batcher
from m3jax.serve.spaces import Space, SpaceError, SpaceStore


class JobRunner:
  def __init__(self, store: SpaceStore, batcher: Batcher, yield_s: float):
    self.store, self.batcher, self.yield_s = store, batcher, yield_s
    self._queue: queue.Queue[tuple[str, str, str, str] | None] = queue.Queue()
    self._models = None                       # perception models, loaded by the first job
    self._stopping = threading.Event()
    self._thread = threading.Thread(target=self._loop, name="m3jax-jobs", daemon=True)
    self._thread.start()
    for row in store.jobs_unfinished():
      self._queue.put(row)

  def submit(self, tenant: str, space: Space, video: pathlib.Path) -> str:
    if space.kind != "video":
      raise SpaceError(f"space {space.id} is a {space.kind!r} space; create a space with kind='video' to ingest "
                       "videos", 409)
    from m3jax.agent.media import MediaError, probe
    try:
      probe(video)                              # corrupt media is refused now, not later in the job
    except MediaError as e:
      raise SpaceError(f"not a usable video: {e}", 422) from None
    job_id = uuid.uuid4().hex
    self.store.job_insert(job_id, space.id, tenant, str(video))
    self._queue.put((job_id, space.id, tenant, str(video)))
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

  def _run(self, job_id: str, space_id: str, tenant: str, source: str) -> None:
    from m3jax.agent.media import probe
    from m3jax.agent.memorize import MemorizeConfig, Memorizer, load_memory, read_manifest
    done, total = 0, 0
    try:
      space = self.store.get(tenant, space_id)
      video = pathlib.Path(source).resolve()
      config = MemorizeConfig()
      total = math.ceil(probe(video).duration / config.clip_seconds)
      memdir = self.store.space_dir(space_id) / "memdir"
      manifest = read_manifest(memdir)
      append = bool(manifest and manifest["sources"] and manifest["sources"][-1]["path"] != str(video))
      memorizer = Memorizer(memdir, config, models=self._models)
      self.store.job_update(job_id, "running", done, total)
      while not self._stopping.is_set():
        self.batcher.wait_idle(self.yield_s)
        report = memorizer.memorize(video, append=append, max_clips=1, progress=False)
        self._models = memorizer.models
        if not report.clips_done:
          break
        done = report.clips_skipped + len(report.clips_done)   # skipped = clips of this video done earlier
        self.store.replace_graph(space, load_memory(memdir))
        self.store.job_update(job_id, "running", done, total)
      else:
        return                                   # shutting down: resumed from its checkpoint next start
      self.store.job_update(job_id, "done", done, total)
    except Exception as e:                       # the job fails alone; the server keeps serving
      if not self._stopping.is_set():
        self.store.job_update(job_id, "failed", done, total, f"{type(e).__name__}: {e}")
