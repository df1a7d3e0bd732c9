import time, numpy as np, jax, jax.numpy as jnp
def bt(f, *a, n=5):
  jax.block_until_ready(f(*a)); ts=[]
  for _ in range(n):
    t=time.perf_counter(); jax.block_until_ready(f(*a)); ts.append(time.perf_counter()-t)
  return sorted(ts)[n//2]
r = np.random.default_rng(0)
B,K,M,S,D = 32,3,384,1024,64
for dt in (jnp.float32, jnp.bfloat16):
  q = jnp.asarray(r.normal(size=(B,K,M,D)), dt); k = jnp.asarray(r.normal(size=(B,K,S,D)), dt); p = jnp.asarray(r.normal(size=(B,K,M,S)), dt)
  f1 = jax.jit(lambda q,k: jnp.einsum("bkqd,bksd->bkqs", q, k, preferred_element_type=jnp.float32))
  f2 = jax.jit(lambda p,v: jnp.einsum("bkqs,bksd->bkqd", p, v, preferred_element_type=jnp.float32))
  f3 = jax.jit(lambda s: jnp.exp(s - s.max(-1, keepdims=True)))
  s32 = jnp.asarray(r.normal(size=(B,K,M,S)), jnp.float32)
  fl = 2*B*K*M*S*D
  t1, t2, t3 = bt(f1,q,k), bt(f2,p,k), bt(f3,s32)
  print(jnp.dtype(dt).name, f"QK {t1*1000:.1f} ms {fl/t1/1e9:.0f} GFLOP/s; PV {t2*1000:.1f} ms {fl/t2/1e9:.0f} GFLOP/s; exp-max {t3*1000:.1f} ms (per query block of 128)", flush=True)
print("---")
q = jnp.asarray(r.normal(size=(B,K,M,D)), jnp.float32); k = jnp.asarray(r.normal(size=(B,K,S,D)), jnp.float32)
kT = k.swapaxes(-1, -2)
f4 = jax.jit(lambda q,kT: jnp.einsum("bkqd,bkds->bkqs", q, kT, preferred_element_type=jnp.float32))
f5 = jax.jit(lambda q,k: jnp.einsum("bkqd,bkds->bkqs", q, k.swapaxes(-1,-2), preferred_element_type=jnp.float32))
f6 = jax.jit(lambda q,k: jnp.einsum("bksd,bkqd->bkqs", k, q, preferred_element_type=jnp.float32))
f7 = jax.jit(lambda q,k: jnp.einsum("bksd,bkqd->bksq", k, q, preferred_element_type=jnp.float32))
fl = 2*B*K*M*S*D
for name, f, a in (("pre-transposed NN", f4, (q, kT)), ("transpose inside", f5, (q, k)), ("k-major out bkqs", f6, (q, k)), ("out bksq", f7, (q, k))):
  t = bt(f, *a); print(name, f"{t*1000:.1f} ms {fl/t/1e9:.0f} GFLOP/s", flush=True)
