"""Fixed and per-step cost of one sampler decode call: B rows of an S=1024-slot cache filled lo..hi (random
values, SmolLM2-135M shapes, random weights), N steps of top-k/top-p sampling, no stop token; prints ms per call
of 3 calls after a compiling one. Two N give the per-step cost and the per-call intercept. Session 22.

  PYTHONPATH=. python runs/issue45/probes/decode_call_probe.py B LO HI N
"""
import sys, time, dataclasses, numpy as np, jax, jax.numpy as jnp
from m3jax.host_memory import retain_freed_memory
retain_freed_memory()
from flax import nnx
from m3jax.models.decoder import Decoder
from m3jax.engine.sampling import Sampler, SamplingConfig
from bench.learner_flops import SMOLLM2
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=0), rngs=nnx.Rngs(0))
cfg = SamplingConfig(max_new_tokens=int(sys.argv[4]), temperature=0.6, top_p=0.95, top_k=20)
s = Sampler(model, cfg)
rng = np.random.default_rng(0)
B, lo, hi = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cache = model.init_cache(B, 1024)
k = jnp.asarray(rng.standard_normal(cache.k.shape) * 0.5, cache.k.dtype); v = jnp.asarray(rng.standard_normal(cache.v.shape) * 0.5, cache.v.dtype)
length = jnp.asarray(rng.integers(lo, hi, B), jnp.int32)
logits = jnp.asarray(rng.standard_normal((B, SMOLLM2.vocab_size)), jnp.float32)
keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(0), jnp.arange(B))
def once():
  c = cache.replace(k=k + 0, v=v + 0, length=length); jax.block_until_ready(c)
  t = time.perf_counter(); out = s._run_decode(c, logits, np.zeros(B, bool), keys, cfg); jax.block_until_ready(out[0])
  return (time.perf_counter() - t) / 1, np.asarray(out[0])
t0 = time.perf_counter(); _, ref = once(); first = time.perf_counter() - t0
ts = [once()[0] * 1e3 for _ in range(3)]
print(f"B={B} N={cfg.max_new_tokens} ms/call {[round(x,1) for x in ts]} first call {first:.1f} s tokens0 {ref[0,:6].tolist()}", flush=True)
