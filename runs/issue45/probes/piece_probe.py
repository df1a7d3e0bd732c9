"""One prefill call's seconds by shape (B:W:S:cached), next to the model's cache-free forward on the same tokens.

  PYTHONPATH=. python runs/issue45/probes/piece_probe.py 32:64:1024:400 32:64:512:400 ...
"""
import sys, time, numpy as np, jax, jax.numpy as jnp
from flax import nnx
from m3jax.models.decoder import Decoder
from m3jax.engine.prefill import prefill
from bench.learner_flops import SMOLLM2
import dataclasses
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=128), rngs=nnx.Rngs(0)); gd, params = nnx.split(model)
fwd = jax.jit(lambda p, t: nnx.merge(gd, p).hidden(t)[0])
for spec in [a for a in sys.argv[1:] if a.count(":") == 3]:
  B, W, S, cached = (int(x) for x in spec.split(":"))
  toks = jnp.asarray(np.random.default_rng(0).integers(5, 49152, (B, W)).astype(np.int32))
  cl = jnp.full((B,), W, jnp.int32)
  def fresh():
    c = model.init_cache(B, S); return c.replace(length=jnp.full((B,), cached, jnp.int32))
  jax.block_until_ready(prefill(gd, params, fresh(), toks, cl)); jax.block_until_ready(fwd(params, toks))
  tp, tf = [], []
  for r in range(3):
    c = fresh(); jax.block_until_ready(c)
    t = time.perf_counter(); jax.block_until_ready(prefill(gd, params, c, toks, cl)); tp.append(time.perf_counter() - t)
    t = time.perf_counter(); jax.block_until_ready(fwd(params, toks)); tf.append(time.perf_counter() - t)
  gf = B * W * 2 * 106e6 / 1e9
  print(f"{spec}: prefill {min(tp):.3f} s ({B*W/min(tp):.0f} tok/s), cache-free forward {min(tf):.3f} s; weight GFLOP {gf:.0f} "
        f"-> {gf/min(tp):.0f} / {gf/min(tf):.0f} GFLOP/s", flush=True)

# prefill_subset: R rows of a B-row cache (B:R:W:S:cached), against the full-batch prefill of the same width
from m3jax.engine.prefill import prefill_subset
for spec in [a for a in sys.argv[1:] if a.count(":") == 4]:
  B, R, W, S, cached = (int(x) for x in spec.split(":"))
  toks = jnp.asarray(np.random.default_rng(0).integers(5, 49152, (R, W)).astype(np.int32))
  cl = jnp.full((R,), W, jnp.int32)
  index = jnp.arange(R, dtype=jnp.int32)
  def fresh():
    c = model.init_cache(B, S); return c.replace(length=jnp.full((B,), cached, jnp.int32))
  jax.block_until_ready(prefill_subset(gd, params, fresh(), index, toks, cl))
  ts = []
  for r in range(3):
    c = fresh(); jax.block_until_ready(c)
    t = time.perf_counter(); jax.block_until_ready(prefill_subset(gd, params, c, index, toks, cl)); ts.append(time.perf_counter() - t)
  print(f"subset {spec}: {min(ts):.3f} s ({R*W/min(ts):.0f} tok/s)", flush=True)
