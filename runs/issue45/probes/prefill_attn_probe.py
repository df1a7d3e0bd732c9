"""One layer's attention of a rollout prefill piece (B rows x 64 queries after `cached` slots, SmolLM2-135M's heads:
9 query heads over 3 KV heads of 64) read from a cache of S slots: `cached_attention`'s loop over 256-slot blocks
(today's prefill) against `window_attention` over a static window of the first W slots. Medians of 7 runs.

  PYTHONPATH=. python runs/issue45/probes/prefill_attn_probe.py B S CACHED W1,W2,...
"""
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from m3jax.models.kv_attention import cached_attention, window_attention

B, S, cached = (int(x) for x in sys.argv[1:4])
windows = [int(w) for w in sys.argv[4].split(",")]
T, H, K, D = 64, 9, 3, 64
rng = np.random.default_rng(0)
q = jnp.asarray(rng.standard_normal((B, T, H, D)).astype(np.float32))
ck = jnp.asarray(rng.standard_normal((1, B, K, S, D)).astype(np.float32))
cv = jnp.asarray(rng.standard_normal((1, B, K, S, D)).astype(np.float32))
slots = cached + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
valid = jnp.full((B,), cached + T, jnp.int32)
ways = {"blocks": jax.jit(lambda q, ck, cv: cached_attention(q, ck, cv, jnp.int32(0), slots, valid))}
for w in windows:
  ways[f"window {w}"] = jax.jit(lambda q, ck, cv, w=w: window_attention(q, ck[0, :, :, :w], cv[0, :, :, :w], slots,
                                                                         valid))


def flat_attention(q, k, v, q_slots, valid_len):
  """window_attention with (batch, kv head) folded into one leading batch axis and the G query heads' rows
  side by side: two plain batched matmuls [B*K, G*T, D] x [B*K, D, W]."""
  Bq, Tq, Hq, Dq = q.shape
  Kk, W = k.shape[1], k.shape[2]
  G = Hq // Kk
  qf = q.reshape(Bq, Tq, Kk, G, Dq).transpose(0, 2, 3, 1, 4).reshape(Bq * Kk, G * Tq, Dq)
  s = jnp.matmul(qf, k.reshape(Bq * Kk, W, Dq).transpose(0, 2, 1), preferred_element_type=jnp.float32) * Dq ** -0.5
  s = s.reshape(Bq, Kk, G, Tq, W)
  mask = (jnp.arange(W)[None, None, :] <= q_slots[:, :, None]) & (jnp.arange(W)[None, None, :] < valid_len[:, None, None])
  mask = mask[:, None, None]
  s = jnp.where(mask, s, -1e30)
  p = jnp.where(mask, jnp.exp(s - s.max(axis=-1, keepdims=True)), 0.0)
  out = jnp.matmul(p.reshape(Bq * Kk, G * Tq, W), v.reshape(Bq * Kk, W, Dq), preferred_element_type=jnp.float32)
  out = out.reshape(Bq, Kk, G, Tq, Dq) / jnp.maximum(p.sum(axis=-1), 1e-30)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(Bq, Tq, Hq, Dq)


def lean_attention(q, k, v, q_slots, valid_len, exp_dtype=jnp.float32):
  """window_attention with the mask as an additive bias (one pass over the scores fewer: a masked score's exp
  underflows to exactly 0) and the normalisation after PV."""
  Bq, Tq, Hq, Dq = q.shape
  Kk, W = k.shape[1], k.shape[2]
  qg = q.reshape(Bq, Tq, Kk, Hq // Kk, Dq)
  keys = jnp.arange(W)[None, None, :]
  bias = jnp.where((keys <= q_slots[:, :, None]) & (keys < valid_len[:, None, None]), 0.0, -1e30)[:, None, None]
  s = jnp.einsum("btkgd,bksd->bkgts", qg * Dq ** -0.5, k, preferred_element_type=jnp.float32) + bias
  p = jnp.exp((s - s.max(axis=-1, keepdims=True)).astype(exp_dtype))
  out = jnp.einsum("bkgts,bksd->bkgtd", p.astype(q.dtype), v, preferred_element_type=jnp.float32)
  out = out / p.sum(axis=-1, dtype=jnp.float32)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(Bq, Tq, Hq, Dq)


def xla_sdpa(q, k, v, q_slots, valid_len):
  """jax.nn.dot_product_attention (XLA implementation) with the same mask, keys repeated to the query heads."""
  keys = jnp.arange(k.shape[2])[None, None, :]
  mask = ((keys <= q_slots[:, :, None]) & (keys < valid_len[:, None, None]))[:, None]  # [B, 1, T, W]
  kk, vv = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, W, K, D]
  return jax.nn.dot_product_attention(q, kk, vv, mask=mask, implementation="xla")


for w in windows:
  ways[f"sdpa {w}"] = jax.jit(lambda q, ck, cv, w=w: xla_sdpa(q, ck[0, :, :, :w], cv[0, :, :, :w], slots, valid))
  ways[f"bf16 {w}"] = jax.jit(lambda q, ck, cv, w=w: window_attention(
      q.astype(jnp.bfloat16), ck[0, :, :, :w].astype(jnp.bfloat16), cv[0, :, :, :w].astype(jnp.bfloat16), slots,
      valid).astype(jnp.float32))
  ways[f"lean {w}"] = jax.jit(lambda q, ck, cv, w=w: lean_attention(q, ck[0, :, :, :w], cv[0, :, :, :w], slots, valid))
  ways[f"flat {w}"] = jax.jit(lambda q, ck, cv, w=w: flat_attention(q, ck[0, :, :, :w], cv[0, :, :, :w], slots, valid))
ref = np.asarray(ways["blocks"](q, ck, cv))
times = {k: [] for k in ways}
for k, fn in ways.items():
  tol = 3e-2 if k.startswith("bf16") else 2e-4
  np.testing.assert_allclose(np.asarray(fn(q, ck, cv)), ref, rtol=tol, atol=tol / 10)
for _ in range(7):
  for k, fn in ways.items():
    t = time.perf_counter()
    jax.block_until_ready(fn(q, ck, cv))
    times[k].append(time.perf_counter() - t)
flops = lambda n: 4 * B * T * H * D * n
print(f"B={B} S={S} cached={cached}; load {open('/proc/loadavg').read().split()[:3]}")
for k, ts in times.items():
  n = 0 if k == "blocks" else int(k.split()[1])
  n = -(-(cached + T) // 256) * 256 if k == "blocks" else n
  print(f"  {k:12s} median {1e3 * statistics.median(ts):7.1f} ms  ({flops(n) / statistics.median(ts) / 1e9:.0f} GFLOP/s "
        f"over the {n} slots read)")
