"""The engine's continuous-batching scheduler (`engine.slots.run_slots`) on requests that need a known number of
calls: slots refill in the very next call, results arrive as each request ends, stopping waits for the running."""

import pytest

from m3jax.engine.slots import run_slots


def _run(slots, lengths, stop_after=None):
  waiting = list(enumerate(lengths))
  calls, finished, left = [], [], {}

  def take(n, idle):
    if stop_after is not None and len(finished) >= stop_after:
      return None
    if not waiting:
      return None
    got, waiting[:] = waiting[:n], waiting[n:]
    return got

  def step(starts, continues):
    for slot, _, need in starts:
      left[slot] = need
    calls.append(([(slot, episode) for slot, episode, _ in starts], list(continues)))
    for slot in [s for s, _, _ in starts] + list(continues):
      left[slot] -= 1
    return {slot: f"done{slot}" for slot in list(left) if left[slot] == 0 and not left.pop(slot)}

  run_slots(slots, take, step, lambda key, result: finished.append((key, result)))
  return calls, finished


def test_a_freed_slot_takes_the_next_request_in_the_next_call():
  calls, finished = _run(2, [1, 3, 1, 1])
  assert calls == [([(0, 0), (1, 1)], []), ([(0, 2)], [1]), ([(0, 3)], [1])]
  assert finished == [(0, "done0"), (2, "done0"), (3, "done0"), (1, "done1")]  # slot order within a call


def test_stop_lets_the_running_requests_end():
  calls, finished = _run(2, [1, 3, 1], stop_after=1)
  assert [key for key, _ in finished] == [0, 1]  # request 2 never starts; request 1 runs to its end
  assert calls[-1] == ([], [1])


def test_take_may_not_overfill():
  with pytest.raises(ValueError, match="3 requests for 2 free slots"):
    run_slots(2, lambda n, idle: [(i, 1) for i in range(3)], lambda s, c: {}, lambda k, r: None)


def test_step_may_not_end_an_empty_slot():
  with pytest.raises(ValueError, match="ended slot 1, which runs nothing"):
    run_slots(2, lambda n, idle: [("a", 1)] if idle else None, lambda s, c: {1: "x"}, lambda k, r: None)
