"""Several videos memorized in lock-step, their model calls batched across videos.

WHY: one clip of one video gives the models small batches (a few face chips, a handful of speech segments, a dozen
memory sentences); the reference gets throughput by running up to 32 videos in parallel processes, one clip at a
time each. Here the videos of one process share the models instead: each video's unchanged `Memorizer.memorize`
runs in its own thread, but only one thread runs at a time (a baton passed by semaphores, so there is no
concurrency and no lock in the memorization code). A thread runs until it calls a model through its proxies
(`Batched.models`, `Batched.complete`) and parks there; once every live video is parked (or done), the calls are
grouped by model and each group runs as ONE call on the concatenated inputs, whose results are split back. The
next round resumes every video. Each video keeps its own graph, face / voice ids, writer and directory, so its
memories are those it gets alone: the same ids, texts and memories; embeddings agree to float rounding only, since
XLA picks its kernels by batch shape (rows computed in a batch of 8 and of 64 differ by ~1e-7).

Static shapes: the batched calls concatenate rows, and every model already pads its batch to a power-of-two bucket
(GE2E partials, Whisper windows and decode rows, BERT rows, VAD clips here), so a varying number of live videos
lands on a handful of compiled shapes, bounded by `videos_in_flight`.

A failing batched call is re-run video by video so the error reaches the video that caused it; a video's error
(bad media, a refused directory) ends only that video: `run_lockstep` returns it in that video's place.
Ctrl-C stops every video at its next model call; each rolls back to its last checkpoint (as alone).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from m3jax.memorize.perceive import PerceptionModels
from m3jax.perception.voices import SpeakerEncoder
from m3jax.perception.vad import SileroVAD


@dataclasses.dataclass
class _Failed:
  error: BaseException


# The models in the order one clip calls them (vad and ge2e repeat inside speech segmentation).
STAGES = ("faces", "vad", "ge2e", "asr", "complete", "text")


class _Worker:
  """One video's thread; `step()` (main thread) lets it run until its next model call or its end."""

  def __init__(self, job: Callable[["Batched"], Any], models: PerceptionModels, complete: Callable | None):
    self._go, self._back = threading.Semaphore(0), threading.Semaphore(0)
    self.request: tuple[str, Any, Any] | None = None  # (model, batching key, input) while parked at a call
    self.reply: Any = None
    self.answered = False  # the parked call's reply is in: the video can run on
    self.done, self.outcome, self.running, self.cancelled = False, None, False, False
    self.batched = Batched(self, models, complete)
    self._thread = threading.Thread(target=self._run, args=(job,), daemon=True)
    self._thread.start()

  def _run(self, job) -> None:
    self._go.acquire()
    try:
      if self.cancelled:  # Ctrl-C before it ever ran
        raise KeyboardInterrupt
      self.outcome = job(self.batched)
    except BaseException as e:  # noqa: BLE001 - handed to the driver, which re-raises what is not a video's own
      self.outcome = e
    finally:
      self.done = True
      self._back.release()

  def step(self) -> None:
    self.running = True
    self._go.release()
    self._back.acquire()
    self.running = False

  def call(self, model: str, key: Any, payload: Any) -> Any:
    self.request, self.answered = (model, key, payload), False
    self._back.release()
    self._go.acquire()
    reply, self.request, self.reply, self.answered = self.reply, None, None, False
    if isinstance(reply, _Failed):
      raise reply.error
    return reply

  def cancel(self) -> None:
    """Ends the video: it gets KeyboardInterrupt at its parked call (its memorizer rolls back)."""
    if self.running:
      self._back.acquire()  # it was running when Ctrl-C came: wait until it parks
      self.running = False
    self.cancelled = True
    while not self.done:
      self.reply = _Failed(KeyboardInterrupt())
      self.step()


class Batched:
  """The model proxies one video's memorization runs on: every call parks the video until its batch has run."""

  def __init__(self, worker: _Worker, models: PerceptionModels, complete: Callable | None):
    call = worker.call
    self.models = PerceptionModels(faces=_Faces(call), vad=_VAD(call, models.vad), encoder=_Encoder(call),
                                   asr=_ASR(call), text=lambda texts: call("text", None, list(texts)))
    self.complete = (lambda conversations: call("complete", None, list(conversations))) if complete else None


class _Faces:
  def __init__(self, call):
    self._call = call

  def analyze(self, frames, face_filter):
    return self._call("faces", face_filter, list(frames))


class _Encoder:
  """GE2E: `embed` is SpeakerEncoder's own (partials, pooling) around the batched `embed_partials`."""

  def __init__(self, call):
    self._call = call

  def embed_partials(self, mels):
    return self._call("ge2e", None, mels)

  embed = SpeakerEncoder.embed


class _VAD:
  """Silero: `speech_spans` is SileroVAD's own around the batched `probs`."""

  def __init__(self, call, vad: SileroVAD):
    self._call, self._vad = call, vad

  @property
  def config(self):
    return self._vad.config

  def probs(self, audio_16k):
    return self._call("vad", None, audio_16k)

  speech_spans = SileroVAD.speech_spans


class _ASR:
  def __init__(self, call):
    self._call = call

  def transcribe(self, segments):
    return self._call("asr", None, list(segments))


def _split(rows: Sequence[Any], sizes: Sequence[int]) -> list[Any]:
  out, start = [], 0
  for n in sizes:
    out.append(rows[start:start + n])
    start += n
  return out


def run_batch(model: str, key: Any, inputs: list[Any], models: PerceptionModels,
              complete: Callable | None) -> list[Any]:
  """One call of `model` on the inputs of several videos, concatenated; one result per input."""
  sizes = [len(x) for x in inputs]
  if model == "faces":
    found = models.faces.analyze([f for frames in inputs for f in frames], key)
    starts = np.cumsum([0] + sizes)
    return [[dataclasses.replace(d, frame_index=d.frame_index - starts[k]) for d in found
             if starts[k] <= d.frame_index < starts[k + 1]] for k in range(len(inputs))]
  if model == "vad":
    return models.vad.probs_batch(inputs)
  if model == "ge2e":
    rows = models.encoder.embed_partials(np.concatenate(inputs))
  elif model == "asr":
    rows = models.asr.transcribe([s for segs in inputs for s in segs])
  elif model == "text":
    rows = models.text([t for texts in inputs for t in texts])
  elif model == "complete":
    rows = complete([c for convs in inputs for c in convs])
  else:
    raise ValueError(f"no batched model {model!r}")
  return _split(rows, sizes)


@dataclasses.dataclass
class LockstepStats:
  """What batching achieved: per model, the number of batched calls, of video requests they served, and the
  seconds they took (the rest of the wall time is each video's own work: decoding, clustering, graph, saving)."""
  calls: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  requests: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  seconds: collections.Counter = dataclasses.field(default_factory=collections.Counter)

  def summary(self) -> str:
    return ", ".join(f"{m} {self.requests[m] / self.calls[m]:.1f}" for m in sorted(self.calls))

  def times(self) -> str:
    return ", ".join(f"{m} {self.seconds[m]:.1f}s" for m in sorted(self.calls))


def run_lockstep(jobs: Sequence[Callable[[Batched], Any]], models: PerceptionModels, in_flight: int,
                 complete: Callable | None = None, stats: LockstepStats | None = None) -> list[Any]:
  """Runs `jobs` (one per video; each gets its `Batched` proxies) at most `in_flight` at a time, in lock-step,
  starting the next job as soon as one ends; returns each job's result, or the exception (not KeyboardInterrupt)
  that ended it. `complete` is a writer's chat-completion backend, batched the same way.

  When every live video is parked, only the calls of the earliest pipeline stage (`STAGES`) run; the others
  wait. A video ahead thus runs alone until it reaches the stage where the others wait, and from then on the
  videos meet at every stage (a video with no speech in a clip skips three stages; one just started is at the
  first), instead of drifting out of phase and never sharing a batch."""
  if in_flight < 1:
    raise ValueError(f"in_flight must be >= 1, got {in_flight}")
  stats = stats if stats is not None else LockstepStats()
  outcomes: list[Any] = [None] * len(jobs)
  todo = collections.deque(range(len(jobs)))
  live: dict[int, _Worker] = {}
  try:
    while todo or live:
      while todo and len(live) < in_flight:
        i = todo.popleft()
        live[i] = _Worker(jobs[i], models, complete)
      runnable = [i for i in sorted(live) if live[i].request is None or live[i].answered]
      for i in runnable:
        live[i].step()
        if live[i].done:
          outcomes[i] = live.pop(i).outcome
          if not isinstance(outcomes[i], Exception) and isinstance(outcomes[i], BaseException):
            raise outcomes[i]
      if runnable:
        continue  # refill, and run what was just started, before any batch
      stage = min(STAGES.index(w.request[0]) for w in live.values())
      groups: dict[Any, list[_Worker]] = {}
      for i in sorted(live):
        if live[i].request[0] == STAGES[stage]:
          groups.setdefault(live[i].request[1], []).append(live[i])
      for key, workers in groups.items():
        _answer(STAGES[stage], key, workers, models, complete, stats)
  except KeyboardInterrupt:
    for w in live.values():
      w.cancel()
    raise
  return outcomes


def _answer(model: str, key: Any, workers: list[_Worker], models: PerceptionModels, complete: Callable | None,
            stats: LockstepStats) -> None:
  stats.calls[model] += 1
  stats.requests[model] += len(workers)
  start = time.perf_counter()
  try:
    replies = run_batch(model, key, [w.request[2] for w in workers], models, complete)
  except Exception:  # noqa: BLE001 - one video's bad input: find whose, alone
    replies = []
    for w in workers:
      try:
        replies.append(run_batch(model, key, [w.request[2]], models, complete)[0])
      except Exception as e:  # noqa: BLE001 - raised in that video's thread, at its call
        replies.append(_Failed(e))
  stats.seconds[model] += time.perf_counter() - start
  for w, reply in zip(workers, replies):
    w.reply, w.answered = reply, True
