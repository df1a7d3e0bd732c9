import time, numpy as np, jax, jax.numpy as jnp
from m3jax.models.decoder import chunked_attention
from m3jax.models.kv_attention import window_attention
def bt(f, *a, n=5):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]
r = np.random.default_rng(0)
B,T,S,H,K,D = 32,512,1024,9,3,64
q = jnp.asarray(r.normal(size=(B,T,H,D)), jnp.float32); k = jnp.asarray(r.normal(size=(B,S,K,D)), jnp.float32); v = jnp.asarray(r.normal(size=(B,S,K,D)), jnp.float32)
slots = jnp.asarray(400 + np.arange(T)[None].repeat(B,0), jnp.int32); vl = jnp.full((B,), 912, jnp.int32)
def win_chunked(q, k, v, s, vl, ch, keys=None):
  kt, vt = k.transpose(0,2,1,3), v.transpose(0,2,1,3)
  if keys: kt, vt = kt[:, :, :keys], vt[:, :, :keys]
  n = T // ch
  qb = q.reshape(B, n, ch, H, D).swapaxes(0, 1); sb = s.reshape(B, n, ch).swapaxes(0, 1)
  out = jax.lax.map(lambda xs: window_attention(xs[0], kt, vt, xs[1], vl), (qb, sb))
  return out.swapaxes(0, 1).reshape(B, T, H, D)
ref = None
for name, f in (("chunked128", jax.jit(lambda q,k,v,s,vl: chunked_attention(q,k,v,s,vl,128))),
                ("window128", jax.jit(lambda q,k,v,s,vl: win_chunked(q,k,v,s,vl,128))),
                ("window64", jax.jit(lambda q,k,v,s,vl: win_chunked(q,k,v,s,vl,64))),
                ("window256", jax.jit(lambda q,k,v,s,vl: win_chunked(q,k,v,s,vl,256))),
                ("window128_keys1024", jax.jit(lambda q,k,v,s,vl: win_chunked(q,k,v,s,vl,128, 1024)))):
  t = bt(f, q, k, v, slots, vl); o = np.asarray(f(q, k, v, slots, vl)); ref = o if ref is None else ref
  print(name, f"{t*1000:.0f} ms/layer  x30 {30*t:.1f} s  maxdiff {np.abs(o-ref).max():.2e}", flush=True)
