"""One rollout-sized prefill piece (64 tokens a row after `cached` cached slots) on SmolLM2-135M's shapes (random
weights), four ways, medians of 5 interleaved runs:
  full     `prefill` over all B rows of the cache (every row fed);
  subset   `prefill_subset` over N of the B rows (what `_prefill_pieces` runs below 3/4 of the batch);
  masked   `prefill` over all B rows with only N fed (the alternative: no gather, extra rows computed);
  gather   `take_rows` + `with_rows_filled` of N rows alone (the subset's copying; whole rows before session 22).

  PYTHONPATH=. python runs/issue45/probes/subset_probe.py B N S CACHED
"""
import dataclasses
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.learner_flops import SMOLLM2
from m3jax.engine.prefill import prefill, prefill_subset
from m3jax.models.decoder import Decoder

B, N, S, cached = (int(x) for x in sys.argv[1:5])
W = 64
cfg = dataclasses.replace(SMOLLM2, attention_chunk=128)
model = Decoder(cfg, rngs=nnx.Rngs(0))
gd, params = nnx.split(model)
rng = np.random.default_rng(0)
toks_b = jnp.asarray(rng.integers(5, 49152, (B, W)).astype(np.int32))
toks_n = toks_b[:N]
fed_b = jnp.full((B,), W, jnp.int32)
fed_masked = jnp.asarray(np.where(np.arange(B) < N, W, 0).astype(np.int32))
fed_n = jnp.full((N,), W, jnp.int32)
index = jnp.arange(N, dtype=jnp.int32)


def fresh():
  c = model.init_cache(B, S)
  return jax.block_until_ready(c.replace(length=jnp.full((B,), cached, jnp.int32)))


@jax.jit
def gather_put(cache, index):
  return cache.with_rows_filled(cache.take_rows(index), index, cache.length[index], W)


ways = {
    "full": lambda c: prefill(gd, params, c, toks_b, fed_b),
    "subset": lambda c: prefill_subset(gd, params, c, index, toks_n, fed_n),
    "masked": lambda c: prefill(gd, params, c, toks_b, fed_masked),
    "gather": lambda c: gather_put(c, index),
}
for name, fn in ways.items():
  jax.block_until_ready(fn(fresh()))
times = {name: [] for name in ways}
for _ in range(5):
  for name, fn in ways.items():
    c = fresh()
    t = time.perf_counter()
    jax.block_until_ready(fn(c))
    times[name].append(time.perf_counter() - t)
print(f"B={B} N={N} S={S} cached={cached} width={W}; load {open('/proc/loadavg').read().split()[:3]}")
for name, ts in times.items():
  print(f"  {name:7s} median {statistics.median(ts):.3f} s  {[round(t, 3) for t in ts]}")
