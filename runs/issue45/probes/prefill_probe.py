import sys, time, dataclasses, numpy as np, jax, jax.numpy as jnp
from flax import nnx
from m3jax.models.decoder import Decoder
from m3jax.engine.prefill import prefill
from bench.learner_flops import SMOLLM2
B, W, S, cached = (int(x) for x in sys.argv[1:5]); variants = sys.argv[5].split(",")
runs = {}
for v in variants:
  dt, ac = v.split(":")
  cfg = dataclasses.replace(SMOLLM2, attention_chunk=int(ac), param_dtype=dt, compute_dtype=dt)
  model = Decoder(cfg, rngs=nnx.Rngs(0)); gd, params = nnx.split(model)
  rng = np.random.default_rng(0)
  toks = jnp.asarray(rng.integers(5, 49152, (B, W)).astype(np.int32)); cl = jnp.asarray(rng.integers(W // 2, W, (B,)).astype(np.int32))
  def fresh():
    c = model.init_cache(B, S); return c.replace(length=jnp.full((B,), cached, jnp.int32))
  runs[v] = (gd, params, toks, cl, fresh)
  t = time.perf_counter(); jax.block_until_ready(prefill(gd, params, fresh(), toks, cl)); print(v, "compile+1", round(time.perf_counter()-t, 1), flush=True)
res = {v: [] for v in variants}; out = {}
for r in range(3):
  for v in variants:
    gd, params, toks, cl, fresh = runs[v]; c = fresh(); jax.block_until_ready(c)
    t = time.perf_counter(); lg, _ = prefill(gd, params, c, toks, cl); jax.block_until_ready(lg); res[v].append(time.perf_counter() - t); out[v] = np.asarray(lg)
for v in variants:
  print(v, f"{sorted(res[v])[1]:.2f} s", [round(x, 2) for x in res[v]], "maxdiff vs first", float(np.abs(out[v] - out[variants[0]]).max()), flush=True)
