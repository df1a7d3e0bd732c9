import time, numpy as np, jax, jax.numpy as jnp
from m3jax.models.kv_attention import window_attention
def bt(f, *a, n=30):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]*1000
r = np.random.default_rng(0)
H,K,D = 9,3,64
def alt(q, k, v, vl):  # T == 1, no per-query mask beyond valid_len
  B = q.shape[0]; W = k.shape[2]
  qg = q.reshape(B, K, H // K, D)
  s = jnp.einsum("bkgd,bksd->bkgs", qg, k, preferred_element_type=jnp.float32) * (D ** -0.5)
  mask = (jnp.arange(W)[None] < vl[:, None])[:, None, None]
  s = jnp.where(mask, s, -1e30)
  p = jnp.exp(s - s.max(-1, keepdims=True))
  out = jnp.einsum("bkgs,bksd->bkgd", p, v, preferred_element_type=jnp.float32) / p.sum(-1)[..., None]
  return out.reshape(B, 1, H, D)
for B, W in ((8, 384), (32, 768)):
  q = jnp.asarray(r.normal(size=(B,1,H,D)), jnp.float32); k = jnp.asarray(r.normal(size=(B,K,W,D)), jnp.float32); v = jnp.asarray(r.normal(size=(B,K,W,D)), jnp.float32)
  sl = jnp.full((B,1), W-68, jnp.int32); vl = jnp.full((B,), W-67, jnp.int32)
  f = jax.jit(lambda q,k,v,s,l: window_attention(q,k,v,s,l)); g = jax.jit(alt)
  a = np.asarray(f(q,k,v,sl,vl)); b = np.asarray(g(q,k,v,vl))
  print(B, W, "window_attention ms", round(bt(f,q,k,v,sl,vl),3), "alt ms", round(bt(g,q,k,v,vl),3), "diff", np.abs(a-b).max(), flush=True)
