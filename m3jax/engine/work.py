"""Where a sampler's time goes: seconds and work of its prefills and decodes, for `bench/rl_throughput.py`.

WHY here and not in the bench: only the sampler knows which tokens it computed (fresh), which it took from a
forked or continued cache (reused) and when a decode ended. The counters cost no extra device sync inside a loop:
a prefill's logits are waited for once per prefill call (the decode that follows would wait for them anyway) and
the decode's end is already a host sync (`Sampler._run_decode` reads `done`).
"""

from __future__ import annotations

import dataclasses
import math
import time

import jax
import numpy as np

from m3jax.models.decoder import KVCache
from m3jax.models.kv_attention import BLOCK


@dataclasses.dataclass
class EngineWork:
  """Running totals over a sampler's calls (`Sampler.work`)."""

  prefill_s: float = 0.0  # wall seconds of prefill calls (including forking a shared prompt's cache rows)
  prefill_attended: int = 0  # sum over prefilled tokens of the positions each attends (cached + own prefix)
  prefill_rows: int = 0  # rows prefilled (each computes one row of vocabulary logits)
  prefill_reused: int = 0  # tokens already in a continued row's cache, not prefilled again
  decode_s: float = 0.0  # wall seconds of decode loops
  decode_steps: int = 0  # decode steps run (each reads every weight once, whatever the batch)
  decode_kv_read: int = 0  # KV-cache bytes the decode's attention read (`kv_bytes`)
  decode_kv_needed: int = 0  # of those, the bytes of each live row's own filled slots

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

  def decode(self, t0: float, steps: int, kv: tuple[int, int] = (0, 0)) -> None:
    """Counts one decode loop that started at `t0` and ran `steps` steps (already synced by the caller), whose
    attention read `kv` = (read, needed) cache bytes (`kv_bytes`)."""
    self.decode_s += time.perf_counter() - t0
    self.decode_steps += int(steps)
    self.decode_kv_read += int(kv[0])
    self.decode_kv_needed += int(kv[1])


def kv_bytes(cache, start_len: np.ndarray, n_gen: np.ndarray, steps: int,
             windows: list[tuple[int, int | None]] = ()) -> tuple[int, int]:
  """(read, needed) bytes of a `KVCache`'s keys and values over a decode loop of `steps` steps that began with
  `start_len[b]` slots filled in row b and sampled `n_gen[b]` tokens into it. `windows` lists the loop's calls as
  (step it ended at, window): a call with a window (`decode._decode`) read that many slots of every row per step.

  WHY: past a few hundred cached tokens per row, these reads outweigh the weights' (a batch-16 step over 2,048
  filled slots reads 1.5 GB of float32 KV against 0.54 GB of SmolLM2-135M weights), so a decode floor that counts
  only weights is too low. Without a window, `kv_attention.cached_attention` reads, for every row of the batch,
  the key blocks below the longest row's length. What the live rows need is their own filled slots: `needed`. At
  step i a row holds start_len + min(i + 1, n_gen) slots (the token fed that step included; a finished row stops
  growing), up to one slot off at a row's last step."""
  if not isinstance(cache, KVCache) or steps <= 0:
    return 0, 0
  k = cache.k
  batch, slots = k.shape[1], cache.max_len
  slot_bytes = 2 * k.nbytes // (batch * slots)  # keys and values of one slot, every layer
  block = math.gcd(slots, BLOCK)
  step = np.arange(steps)[:, None]
  filled = np.asarray(start_len, np.int64)[None] + np.minimum(step + 1, np.asarray(n_gen, np.int64)[None])
  per_step = -(-filled.max(axis=1) // block) * block
  begin = 0
  for end, window in windows:
    if window is not None:
      per_step[begin:end] = window
    begin = end
  needed = np.where(step < np.asarray(n_gen)[None], filled, 0).sum()
  return int(batch * per_step.sum()) * slot_bytes, int(needed) * slot_bytes
