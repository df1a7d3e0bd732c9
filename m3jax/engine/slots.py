"""Continuous batching's scheduler: which slot of the KV cache runs which request, when a slot frees, when to stop.

One loop drives every continuously batched job: the controller's question stream (`Controller.run_stream`), so
RL rollouts (`Controller.run(slots=...)`) and serve's request joining (`serve.batching.JoiningBatcher`, through
`ControllerAnswerer.stream`) with it. It knows nothing of questions or tokens: before each call of `step` it fills
free slots from `take`, and it hands each finished request's result to `finish` and frees its slot for the very
next call. WHY here and not in the controller: the slot mechanics are the engine's (`Sampler.empty_state` /
`reset_rows` keep one cache whose rows start and end independently); the controller only says what a row does
in a round.
"""

from __future__ import annotations

import itertools
from typing import Callable, Hashable, Mapping, Sequence, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# take(free_slots, idle) -> up to free_slots new (key, item) pairs, or None to stop
Take = Callable[[int, bool], "list[tuple[Hashable, Item]] | None"]
# step(starts, continues) -> the result of every request that ended in this call, by slot. `starts` are
# (slot, episode, item): a new request in a free slot, `episode` numbering requests in the order they were taken
# (a sampling stream's key); `continues` are the slots whose requests go on, in slot order
Step = Callable[[Sequence[tuple[int, int, Item]], Sequence[int]], Mapping[int, Result]]


def run_slots(slots: int, take: Take, step: Step, finish: Callable[[Hashable, Result], None]) -> None:
  """Runs until `take` returns None and every running request has ended (a None while requests run stops taking
  new ones; `idle` tells `take` nothing runs, so it may block until a request arrives). `finish(key, result)` is
  called, in slot order, as soon as `step` reports a request ended; its slot takes a new request in the next
  call."""
  holder: list[Hashable | None] = [None] * slots  # the key of the request each slot runs
  held = [False] * slots
  episodes = itertools.count()
  stopping = False
  while True:
    free = [slot for slot in range(slots) if not held[slot]]
    new = take(len(free), len(free) == slots) if free and not stopping else []
    if new is None:
      stopping, new = True, []
    if len(new) > len(free):
      raise ValueError(f"take() returned {len(new)} requests for {len(free)} free slots")
    starts = []
    for slot, (key, item) in zip(free, new):
      holder[slot], held[slot] = key, True
      starts.append((slot, next(episodes), item))
    started = {slot for slot, _, _ in starts}
    continues = [slot for slot in range(slots) if held[slot] and slot not in started]
    if not starts and not continues:
      if stopping:
        return
      continue
    ended = step(starts, continues)
    for slot in sorted(ended):
      if not held[slot]:
        raise ValueError(f"step() ended slot {slot}, which runs nothing")
      key, holder[slot], held[slot] = holder[slot], None, False
      finish(key, ended[slot])
