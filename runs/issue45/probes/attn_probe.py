import time, numpy as np, jax, jax.numpy as jnp
from m3jax.models.decoder import chunked_attention, grouped_attention
from m3jax.models.causal_attention import causal_attention
def bt(f, *a, n=5):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]
r = np.random.default_rng(0)
for dt in (jnp.float32, jnp.bfloat16):
  B,T,S,H,K,D = 32,512,1024,9,3,64
  q = jnp.asarray(r.normal(size=(B,T,H,D)), dt); k = jnp.asarray(r.normal(size=(B,S,K,D)), dt); v = jnp.asarray(r.normal(size=(B,S,K,D)), dt)
  slots = jnp.asarray(400 + np.arange(T)[None].repeat(B,0), jnp.int32); vl = jnp.full((B,), 912, jnp.int32)
  for ch in (128, 256):
    f = jax.jit(lambda q,k,v,s,vl: chunked_attention(q,k,v,s,vl,ch))
    t = bt(f,q,k,v,slots,vl); fl = 4*B*T*S*H*D
    print(dt.__name__ if hasattr(dt,'__name__') else dt, "prefill chunked", ch, f"{t*1000:.0f} ms/layer x30 = {30*t:.1f} s  {fl/t/1e9:.0f} GFLOP/s", flush=True)
  # learner causal fwd+bwd B=2 T=1280
  B,T = 2,1280
  q = jnp.asarray(r.normal(size=(B,T,H,D)), dt); k = jnp.asarray(r.normal(size=(B,T,K,D)), dt); v = jnp.asarray(r.normal(size=(B,T,K,D)), dt)
  vl = jnp.full((B,), T, jnp.int32)
  fwd = jax.jit(lambda q,k,v: causal_attention(q,k,v,vl,128))
  g = jax.jit(jax.grad(lambda q,k,v: causal_attention(q,k,v,vl,128).astype(jnp.float32).sum(), argnums=(0,1,2)))
  tf = bt(fwd,q,k,v); tg = bt(g,q,k,v); fl = 2*B*T*T*H*D
  print("causal fwd", f"{tf*1000:.1f} ms/layer  {fl/tf/1e9:.0f} GFLOP/s; grad {tg*1000:.1f} ms/layer; x30 x2 microbatches: {60*(tg):.1f} s", flush=True)
