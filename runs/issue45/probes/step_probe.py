import time, numpy as np, jax, jax.numpy as jnp
from m3jax.models.kv_attention import window_attention
def bt(f, *a, n=20):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]*1000
r = np.random.default_rng(0)
B,W,H,K,D = 32,768,9,3,64
for B in (8, 32):
  q = jnp.asarray(r.normal(size=(B,1,H,D)), jnp.float32); k = jnp.asarray(r.normal(size=(B,K,W,D)), jnp.float32); v = jnp.asarray(r.normal(size=(B,K,W,D)), jnp.float32)
  sl = jnp.full((B,1), 700, jnp.int32); vl = jnp.full((B,), 701, jnp.int32)
  f = jax.jit(lambda q,k,v,s,l: window_attention(q,k,v,s,l))
  print(B, "window_attention/layer ms", round(bt(f,q,k,v,sl,vl),2), "x30 =", round(30*bt(f,q,k,v,sl,vl),1))
  x = jnp.asarray(r.normal(size=(B,576)), jnp.float32)
  ws = [jnp.asarray(r.normal(size=s), jnp.float32) for s in ((576,576),(576,192),(576,192),(576,576),(576,1536),(576,1536),(1536,576))]
  def proj(x, ws):
    q = x@ws[0]; kk = x@ws[1]; vv = x@ws[2]; o = q@ws[3]; g = x@ws[4]; u = x@ws[5]; return o.sum() + kk.sum() + vv.sum() + ((jax.nn.silu(g)*u)@ws[6]).sum()
  f2 = jax.jit(proj); t2 = bt(f2, x, ws)
  print(B, "projections/layer ms", round(t2,2), "x30 =", round(30*t2,1), "GFLOP/s", round(2*B*(576*576*2+576*384+576*1536*3)/t2/1e6,1))
  emb = jnp.asarray(r.normal(size=(49152,576)), jnp.float32)
  f3 = jax.jit(lambda x, e: jax.lax.top_k(jnp.einsum("bd,vd->bv", x, e)/0.6, 20)); 
  print(B, "lm head + top_k ms", round(bt(f3, x, emb),2))
