"""Where a sampler's time goes: seconds and work of its prefills and decodes, for `bench/rl_throughput.py`.

WHY here and not in the bench: only the sampler knows which tokens it computed (fresh), which it took from a
forked or continued cache (reused) and when a decode ended. The counters cost no extra device sync inside a loop:
a prefill's logits are waited for once per prefill call (the decode that follows would wait for them anyway) and
the decode's end is already a host sync (`Sampler._run_decode` reads `done`).
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np


@dataclasses.dataclass
class EngineWork:
  """Running totals over a sampler's calls (`Sampler.work`)."""

  prefill_s: float = 0.0  # wall seconds of prefill calls (including forking a shared prompt's cache rows)
  prefill_attended: int = 0  # sum over prefilled tokens of the positions each attends (cached + own prefix)
  prefill_rows: int = 0  # rows prefilled (each computes one row of vocabulary logits)
  prefill_reused: int = 0  # tokens already in a continued row's cache, not prefilled again
  decode_s: float = 0.0  # wall seconds of decode loops
  decode_steps: int = 0  # decode steps run (each reads every weight once, whatever the batch)

  def prefill(self, t0: float, logits, cache_len: np.ndarray, feed: list[list[int]]) -> None:
    """Counts one prefill call that started at `t0` (perf_counter) and returned `logits`; `cache_len[b]` tokens
    were already in row b's cache and `feed[b]` were computed."""
    jax.block_until_ready(logits)
    self.prefill_s += time.perf_counter() - t0
    n = np.array([len(f) for f in feed], np.int64)
    offset = np.asarray(cache_len, np.int64)[:len(n)]
    self.prefill_attended += int((n * offset + n * (n + 1) // 2).sum())
    self.prefill_rows += int((n > 0).sum())
    self.prefill_reused += int(offset[n > 0].sum())

  def decode(self, t0: float, steps: int) -> None:
    """Counts one decode loop that started at `t0` and ran `steps` steps (already synced by the caller)."""
    self.decode_s += time.perf_counter() - t0
    self.decode_steps += int(steps)
