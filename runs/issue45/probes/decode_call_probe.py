"""Fixed and per-step cost of one sampler decode call: B rows of an S=1024-slot cache filled lo..hi (random
values, SmolLM2-135M shapes, random weights), N steps of top-k/top-p sampling, no stop token; prints ms per call
of 3 calls after a compiling one. Two N give the per-step cost and the per-call intercept. Session 22.

  PYTHONPATH=. python runs/issue45/probes/decode_call_probe.py B LO HI N
"""
import dataclasses
import sys
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from bench.learner_flops import SMOLLM2
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.host_memory import retain_freed_memory
from m3jax.models.decoder import Decoder


def setup(B: int, lo: int, hi: int, n: int):
  """A sampler on SmolLM2-135M shapes (random weights) and `decode()`, one timed decode call of n sampled steps
  over B rows of a fresh 1024-slot cache filled lo..hi: returns (seconds, tokens); and the call's inputs."""
  retain_freed_memory()
  model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=0), rngs=nnx.Rngs(0))
  cfg = SamplingConfig(max_new_tokens=n, temperature=0.6, top_p=0.95, top_k=20)
  sampler = Sampler(model, cfg)
  rng = np.random.default_rng(0)
  cache = model.init_cache(B, 1024)
  k = jnp.asarray(rng.standard_normal(cache.k.shape) * 0.5, cache.k.dtype)
  v = jnp.asarray(rng.standard_normal(cache.v.shape) * 0.5, cache.v.dtype)
  length = jnp.asarray(rng.integers(lo, hi, B), jnp.int32)
  logits = jnp.asarray(rng.standard_normal((B, SMOLLM2.vocab_size)), jnp.float32)
  keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(0), jnp.arange(B))

  def decode():
    c = jax.block_until_ready(cache.replace(k=k + 0, v=v + 0, length=length))
    t = time.perf_counter()
    out = sampler._run_decode(c, logits, np.zeros(B, bool), keys, cfg)
    jax.block_until_ready(out[0])
    return time.perf_counter() - t, np.asarray(out[0])
  return sampler, decode, types.SimpleNamespace(cfg=cfg, cache=cache, length=length, logits=logits, keys=keys)


if __name__ == "__main__":
  B, lo, hi, n = (int(x) for x in sys.argv[1:5])
  _, decode, _ = setup(B, lo, hi, n)
  first, ref = decode()
  ts = [decode()[0] * 1e3 for _ in range(3)]
  print(f"B={B} N={n} ms/call {[round(x, 1) for x in ts]} first call {first:.1f} s tokens0 {ref[0, :6].tolist()}")
