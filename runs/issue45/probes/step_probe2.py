import time, numpy as np, jax, jax.numpy as jnp
def bt(f, *a, n=20):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]*1000
r = np.random.default_rng(0)
for B in (1, 8, 32):
  for dt in (jnp.float32, jnp.bfloat16):
    x = jnp.asarray(r.normal(size=(B,576)), jnp.float32)
    ws = [jnp.asarray(r.normal(size=s), dt) for s in ((576,576),(576,192),(576,192),(576,576),(576,1536),(576,1536),(1536,576))]
    dot = lambda a, w: jnp.dot(a.astype(dt), w, preferred_element_type=jnp.float32)
    def proj(x, ws):
      q = dot(x,ws[0]); kk = dot(x,ws[1]); vv = dot(x,ws[2]); o = dot(q,ws[3]); g = dot(x,ws[4]); u = dot(x,ws[5]); return o.sum() + kk.sum() + vv.sum() + dot(jax.nn.silu(g)*u,ws[6]).sum()
    f2 = jax.jit(proj); t2 = bt(f2, x, ws)
    # fused qkv and gate/up
    wqkv = jnp.concatenate(ws[:3], 1); wgu = jnp.concatenate(ws[4:6], 1)
    def proj2(x, wqkv, wo, wgu, wd):
      qkv = dot(x, wqkv); o = dot(qkv[:, :576], wo); gu = dot(x, wgu); g, u = gu[:, :1536], gu[:, 1536:]
      return o.sum() + qkv[:, 576:].sum() + dot(jax.nn.silu(g)*u, wd).sum()
    f3 = jax.jit(proj2); t3 = bt(f3, x, wqkv, ws[3], wgu, ws[6])
    print(B, jnp.dtype(dt).name, "projections/layer ms", round(t2,3), "fused qkv/gu", round(t3,3), flush=True)
