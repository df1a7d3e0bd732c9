"""Every rollout prefill call over `bench.rl_throughput` with whether it compiled (traced) a program, so steady
calls can be told from first ones; per (kind, rows, slots): calls, seconds, fed tokens, model GFLOP/s.

  PYTHONPATH=. python runs/issue45/probes/prefill_calls2.py --steps 1
"""
import collections
import sys
import time

import jax
import numpy as np

from m3jax.engine import prefill as prefill_lib
from m3jax.engine import sampling

CALLS = []


def wrap(name, fn, tok_arg, len_arg, cache_arg=2):
  def run(*args):
    tokens, chunk_len, cache = args[tok_arg], np.asarray(args[len_arg]), args[cache_arg]
    info = dict(fn=name, rows=int(tokens.shape[0]), width=int(tokens.shape[1]), slots=int(cache.k.shape[3]),
                batch=int(cache.k.shape[1]), fed=int(chunk_len.sum()),
                cached=int(np.asarray(cache.length).max()))
    traces, t0 = prefill_lib.TRACES[0], time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    CALLS.append(dict(info, s=time.perf_counter() - t0, compiled=prefill_lib.TRACES[0] != traces))
    return out
  return run


sampling.prefill = wrap("prefill", sampling.prefill, 3, 4)
sampling.prefill_subset = wrap("subset", sampling.prefill_subset, 4, 5)

import bench.rl_throughput as rt  # noqa: E402

rt.main()
agg = collections.defaultdict(lambda: [0, 0.0, 0, 0])
for c in CALLS:
  if c["compiled"]:
    continue
  a = agg[(c["fn"], c["rows"], c["batch"], c["width"], c["slots"])]
  a[0] += 1
  a[1] += c["s"]
  a[2] += c["fed"]
  a[3] += c["rows"] * c["width"]
GF = 0.21  # SmolLM2-135M model GFLOP a token, projections and MLP (m3jax.rl.flops, without attention)
print(f"{len(CALLS)} calls, {sum(c['s'] for c in CALLS):.1f} s; compiling calls {sum(c['compiled'] for c in CALLS)}, "
      f"{sum(c['s'] for c in CALLS if c['compiled']):.1f} s")
print("kind rows/batch width slots: calls, s, s/call, fed tokens, computed tokens, GFLOP/s of computed tokens")
for k, (n, s, fed, comp) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
  print(f"{k[0]:8s} {k[1]:3d}/{k[2]:3d} w{k[3]:4d} s{k[4]:5d}: {n:3d} calls {s:6.1f} s {s / n:6.3f} s/call "
        f"fed {fed:6d} computed {comp:6d} {comp * GF / s:6.1f} GFLOP/s")
