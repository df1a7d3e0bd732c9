"""Where a rollout-sized prefill piece (B rows x 64 tokens, SmolLM2-135M shapes, random weights) goes: the layers
without a cache (projections, MLP, attention within the 64 tokens), the cached prefill with nothing cached, and
with `cached` slots filled. Medians of 5 interleaved runs.

  PYTHONPATH=. python runs/issue45/probes/prefill_parts_probe.py B S CACHED
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
from m3jax.engine.prefill import prefill
from m3jax.models.decoder import Decoder

B, S, cached = (int(x) for x in sys.argv[1:4])
W = 64
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=128), rngs=nnx.Rngs(0))
gd, params = nnx.split(model)
toks = jnp.asarray(np.random.default_rng(0).integers(5, 49152, (B, W)).astype(np.int32))
fed = jnp.full((B,), W, jnp.int32)


def cache_at(n):
  c = model.init_cache(B, S)
  return jax.block_until_ready(c.replace(length=jnp.full((B,), n, jnp.int32)))


@jax.jit
def no_cache(params, toks):
  m = nnx.merge(gd, params)
  h, _ = m.hidden(toks)
  return m.logits(h[:, -1:])


ways = {"no cache": lambda: no_cache(params, toks),
        "cached 0": lambda c=None: prefill(gd, params, cache_at(0), toks, fed),
        f"cached {cached}": lambda: prefill(gd, params, cache_at(cached), toks, fed)}
for fn in ways.values():
  jax.block_until_ready(fn())
times = {k: [] for k in ways}
for _ in range(5):
  for k, fn in ways.items():
    t = time.perf_counter()
    jax.block_until_ready(fn())
    times[k].append(time.perf_counter() - t)
print(f"B={B} S={S} width={W}; load {open('/proc/loadavg').read().split()[:3]} (cache_at inside the timing: "
      f"an empty cache's allocation)")
for k, ts in times.items():
  print(f"  {k:12s} median {statistics.median(ts):.3f} s  {[round(t, 3) for t in ts]}")
