"""Logs every rollout prefill call (shape, rows fed, tokens, cache slots, seconds) over `bench.rl_throughput`.

  PYTHONPATH=. python runs/issue45/probes/prefill_calls.py --steps 1
"""
import sys
import time

import jax
import numpy as np

from m3jax.engine import sampling

CALLS = []


def wrap(name, fn, tok_arg, len_arg, cache_arg=2):
  def run(*args):
    tokens, chunk_len, cache = args[tok_arg], np.asarray(args[len_arg]), args[cache_arg]
    info = dict(fn=name, shape=tuple(tokens.shape), slots=int(cache.k.shape[3]), rows=int((chunk_len > 0).sum()),
                fed=int(chunk_len.sum()), cached=int(np.asarray(cache.length).max()),
                lens=chunk_len.tolist(), starts=np.asarray(cache.length).tolist())
    t0 = time.perf_counter()
    out = fn(*args)
    jax.block_until_ready(out)
    CALLS.append(dict(info, s=time.perf_counter() - t0))
    return out
  return run


sampling.prefill = wrap("prefill", sampling.prefill, 3, 4)
sampling.prefill_subset = wrap("subset", sampling.prefill_subset, 4, 5)

import bench.rl_throughput as rt  # noqa: E402

sys.argv = [sys.argv[0]] + sys.argv[1:]
rt.main()
import json
json.dump(CALLS, open(sys.argv[0].replace(".py", ".json"), "w"))
tot = sum(c["s"] for c in CALLS)
print(f"{len(CALLS)} prefill calls, {tot:.1f} s")
for c in sorted(CALLS, key=lambda c: -c["s"]):
  w = c["shape"][0] * c["shape"][1]
  print(f"{c['fn']:8s} shape={c['shape']} slots={c['slots']} rows={c['rows']} fed={c['fed']} "
        f"(of {w} padded, {c['fed'] / w:.2f}) cached_max={c['cached']} {c['s']:.2f} s")
