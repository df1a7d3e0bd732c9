"""Where one rollout prefill piece's time goes, op by op: B rows x 64 tokens after `cached` slots of an S-slot cache
(SmolLM2-135M shapes, random weights), the cache made outside the timing, under jax.profiler; XLA:CPU thunk time
summed by op-name prefix over both cores' threads. Session 21, after the attention layout change.

  PYTHONPATH=. python runs/issue45/probes/prefill_piece_profile.py B S CACHED
"""
import collections
import dataclasses
import glob
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.profiler import ProfileData

from bench.learner_flops import SMOLLM2
from m3jax.engine.prefill import prefill
from m3jax.host_memory import retain_freed_memory
from m3jax.models.decoder import Decoder

retain_freed_memory()
B, S, cached = (int(x) for x in sys.argv[1:4])
W = 64
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=128), rngs=nnx.Rngs(0))
gd, params = nnx.split(model)
toks = jnp.asarray(np.random.default_rng(0).integers(5, 49152, (B, W)).astype(np.int32))
fed = jnp.full((B,), W, jnp.int32)
caches = [jax.block_until_ready(model.init_cache(B, S).replace(length=jnp.full((B,), cached, jnp.int32)))
          for _ in range(6)]
jax.block_until_ready(prefill(gd, params, caches.pop(), toks, fed))
times = []
for _ in range(4):
  t = time.perf_counter()
  jax.block_until_ready(prefill(gd, params, caches.pop(), toks, fed))
  times.append(time.perf_counter() - t)
print(f"B={B} S={S} cached={cached} width={W}: median {statistics.median(times):.3f} s {[round(t, 3) for t in times]}; "
      f"load {open('/proc/loadavg').read().split()[:3]}")
trace = "/tmp/m3jax_prefill_trace"
os.system(f"rm -rf {trace}")
with jax.profiler.trace(trace):
  jax.block_until_ready(prefill(gd, params, caches.pop(), toks, fed))
data = ProfileData.from_file(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)[0])
by_op, full, count = collections.Counter(), collections.Counter(), collections.Counter()
for ev in (ev for plane in data.planes for line in plane.lines if "Eigen" in line.name or "XLA" in line.name
           for ev in line.events if ev.name != "ThunkExecutor::Execute"):
  by_op[ev.name.split(".")[0]] += ev.duration_ns
  if ev.name.startswith("ynn_fusion"):
    full[ev.name] += ev.duration_ns
    count[ev.name] += 1
total = sum(by_op.values())
print(f"thread time {total / 1e9:.2f} s over the ops:")
for name, ns in by_op.most_common(15):
  print(f"  {ns / 1e6:8.1f} ms  {100 * ns / total:5.1f}%  {name}")
print("the largest ynn fusions (name: calls, thread ms):")
for name, ns in full.most_common(12):
  print(f"  {name:24s} {count[name]:5d} calls  {ns / 1e6:8.1f} ms")
print("ynn fusions in all:", len(full))
