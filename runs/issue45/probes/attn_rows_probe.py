"""`cached_attention` of a prefill piece (B rows x T queries after `cached` slots) on all rows at once, against
the same attention over groups of rows (`lax.map`), so each group's scores stay in cache.

  PYTHONPATH=. python runs/issue45/probes/attn_rows_probe.py
"""
import time, jax, jax.numpy as jnp, numpy as np
from m3jax.models.kv_attention import cached_attention
L, B, K, S, Dh, H = 30, 32, 3, 1024, 64, 9
rng = np.random.default_rng(0)
for T, cached in [(64, 400), (128, 400), (64, 800)]:
  q = jnp.asarray(rng.standard_normal((B, T, H, Dh)), jnp.float32)
  ck = jnp.asarray(rng.standard_normal((L, B, K, S, Dh)), jnp.float32); cv = ck * 0.5
  start = jnp.full((B,), cached, jnp.int32); slots = start[:, None] + jnp.arange(T)[None]; valid = start + T

  def grouped(q, ck, cv, slots, valid, g):
    n = B // g
    def one(i):
      ckg = jax.lax.dynamic_slice_in_dim(ck, i * g, g, axis=1); cvg = jax.lax.dynamic_slice_in_dim(cv, i * g, g, axis=1)
      return cached_attention(jax.lax.dynamic_slice_in_dim(q, i * g, g, 0), ckg, cvg, 7,
                              jax.lax.dynamic_slice_in_dim(slots, i * g, g, 0), jax.lax.dynamic_slice_in_dim(valid, i * g, g, 0))
    out = jax.lax.map(one, jnp.arange(n))
    return out.reshape(B, T, H, Dh)
  fns = {"all rows": jax.jit(lambda q, ck, cv, s, v: cached_attention(q, ck, cv, 7, s, v))}
  for g in (1, 2, 4, 8):
    fns[f"groups of {g}"] = jax.jit(lambda q, ck, cv, s, v, g=g: grouped(q, ck, cv, s, v, g))
  ref = None
  for name, f in fns.items():
    out = jax.block_until_ready(f(q, ck, cv, slots, valid))
    ts = []
    for _ in range(5):
      t = time.perf_counter(); jax.block_until_ready(f(q, ck, cv, slots, valid)); ts.append(time.perf_counter() - t)
    ref = out if ref is None else ref
    print(f"T={T} cached={cached} {name}: {sorted(ts)[2]*1000:.1f} ms a layer, max diff {float(jnp.abs(out - ref).max()):.1e}", flush=True)
