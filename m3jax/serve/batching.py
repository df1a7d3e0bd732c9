"""Dynamic batching: questions from concurrent requests are answered together in one batch call.

One worker thread takes the oldest queued item, then waits at most `max_wait_s` for more until `max_batch`
items are queued, and hands them all to `fn` in one call (one embedder call, one search kernel call, one
controller batch). WHY a thread and not the event loop: the batch call is seconds of jitted device work that
releases the GIL; the event loop keeps accepting requests (and filling the next batch) meanwhile.

`JoiningBatcher` goes one step further for the control agent (`ControllerAnswerer.stream`): its worker runs one
continuous-batching loop, and a question that arrives while others are being answered joins the loop's next
policy call in a free KV-cache slot instead of waiting for the whole running batch to finish; each answer is
returned as soon as its own trajectory ends. Opt-in (`ServeConfig.join_running`): every call of the loop decodes
all its slots, where a static batch decodes only its own batch bucket, so joining wins at high concurrency only.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
from typing import Callable, Generic, Sequence, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Batcher(Generic[T, R]):
  """`submit(items)` -> one future per item; `fn(batch) -> results` must return one result per item (or an
  Exception instance for an item that failed alone)."""

  def __init__(self, fn: Callable[[list[T]], Sequence[R | Exception]], max_batch: int, max_wait_s: float):
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    self.fn, self.max_batch, self.max_wait_s = fn, max_batch, max_wait_s
    self._queue: collections.deque[tuple[T, concurrent.futures.Future]] = collections.deque()
    self._cv = threading.Condition()
    self._stop = False
    self._running = False
    self.batches = 0
    self.items = 0
    self.batch_seconds = 0.0
    self.batch_size_counts: collections.Counter[int] = collections.Counter()
    self._thread = threading.Thread(target=self._loop, name="m3jax-batcher", daemon=True)
    self._thread.start()

  def submit(self, items: Sequence[T]) -> list[concurrent.futures.Future]:
    futures = [concurrent.futures.Future() for _ in items]
    with self._cv:
      if self._stop:
        raise RuntimeError("the batcher is stopped")
      self._queue.extend(zip(items, futures))
      self._cv.notify()
    return futures

  @property
  def pending(self) -> int:
    return len(self._queue)

  def wait_idle(self, timeout_s: float) -> None:
    """Blocks until no question is queued or being answered (or `timeout_s` passes): background work yields to questions."""
    deadline = time.monotonic() + timeout_s
    with self._cv:
      while (self._queue or self._running) and not self._stop:
        left = deadline - time.monotonic()
        if left <= 0:
          return
        self._cv.wait(left)

  def close(self) -> None:
    with self._cv:
      self._stop = True
      self._cv.notify_all()
    self._thread.join(timeout=30)
    for _, fut in self._queue:
      fut.set_exception(RuntimeError("the server is shutting down"))

  def _take(self) -> list[tuple[T, concurrent.futures.Future]]:
    with self._cv:
      while not self._queue and not self._stop:
        self._cv.wait()
      if self._stop:
        return []
      deadline = time.monotonic() + self.max_wait_s
      while len(self._queue) < self.max_batch and not self._stop:
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cv.wait(left)
      n = min(self.max_batch, len(self._queue))
      self._running = True
      return [self._queue.popleft() for _ in range(n)]

  def _call(self, items: list[T]) -> list[R | Exception]:
    """`fn(items)`; if the batch call fails, each item is retried alone so a bad item fails only its caller."""
    try:
      results = list(self.fn(items))
      if len(results) != len(items):
        raise RuntimeError(f"batch function returned {len(results)} results for {len(items)} items")
      return results
    except Exception as e:
      if len(items) == 1:
        return [e]
      return [self._call([item])[0] for item in items]

  def _loop(self) -> None:
    while True:
      batch = self._take()
      if not batch:
        return
      start = time.perf_counter()
      results = self._call([item for item, _ in batch])
      for (_, fut), res in zip(batch, results):
        if isinstance(res, Exception):
          fut.set_exception(res)
        else:
          fut.set_result(res)
      self.batches += 1
      self.items += len(batch)
      self.batch_seconds += time.perf_counter() - start
      self.batch_size_counts[len(batch)] += 1
      with self._cv:
        self._running = False
        self._cv.notify_all()                   # wakes wait_idle callers


class JoiningBatcher(Batcher[T, R]):
  """`Batcher`'s interface over a streaming answerer: `stream(take, finish)` runs until `take` returns None,
  taking queued items (`take(n, idle) -> [(key, item)]`, blocking only when nothing runs) and reporting each
  result (`finish(key, result)`) as soon as it is ready. If the stream fails, every item it was running is
  retried alone through `fn` (so a bad item fails only its caller) and a fresh stream starts. Counters: a
  "batch" is one hand-over of queued items to the running loop; `batch_seconds` is the time items were running."""

  def __init__(self, fn: Callable[[list[T]], Sequence[R | Exception]],
               stream: Callable[[Callable, Callable], None], max_batch: int):
    self.stream = stream
    self._in_flight: dict[int, tuple[T, concurrent.futures.Future]] = {}
    self._keys = 0
    self._busy_since = 0.0
    super().__init__(fn, max_batch, max_wait_s=0.0)

  def _hand_over(self, n: int, idle: bool) -> list[tuple[int, T]] | None:
    with self._cv:
      while idle and not self._queue and not self._stop:
        self._cv.wait()
      if self._stop:
        return None
      got = []
      for _ in range(min(n, self.max_batch, len(self._queue))):
        item, fut = self._queue.popleft()
        if not fut.set_running_or_notify_cancel():
          continue
        key, self._keys = self._keys, self._keys + 1
        self._in_flight[key] = (item, fut)
        got.append((key, item))
      if got:
        if not self._running:
          self._running, self._busy_since = True, time.perf_counter()
        self.batches += 1
        self.items += len(got)
        self.batch_size_counts[len(got)] += 1
      return got

  def _finish(self, key: int, result: R | Exception) -> None:
    with self._cv:
      _, fut = self._in_flight.pop(key)
      if not self._in_flight:
        self._idle()
    if isinstance(result, Exception):
      fut.set_exception(result)
    else:
      fut.set_result(result)

  def _idle(self) -> None:  # holding self._cv
    if self._running:
      self._running = False
      self.batch_seconds += time.perf_counter() - self._busy_since
      self._cv.notify_all()  # wakes wait_idle callers

  def _loop(self) -> None:
    while not self._stop:
      try:
        self.stream(self._hand_over, self._finish)
      except Exception:
        with self._cv:
          failed, self._in_flight = list(self._in_flight.values()), {}
        for item, fut in failed:  # each alone: a bad item fails only its own caller
          result = self._call([item])[0]
          if isinstance(result, Exception):
            fut.set_exception(result)
          else:
            fut.set_result(result)
        with self._cv:
          self._idle()
