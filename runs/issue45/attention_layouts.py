import time, math, sys
import numpy as np, jax, jax.numpy as jnp
from m3jax.models import kv_attention as kva
L, B, S, K, G, Dh, STEPS = 30, 16, 512, 3, 3, 64, 16
fill = 256
import os; NOWRITE = os.environ.get("NOWRITE") == "1"
def att_bksd(q, ck, cv, layer, valid_len, blk=256):
  # ck [L, B, K, S, Dh]; q [B, K, G, Dh]
  n_blocks = (jnp.max(valid_len) + blk - 1) // blk
  def body(j, carry):
    m, l, acc = carry
    start = j * blk
    kb = jax.lax.dynamic_slice(ck, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0]
    vb = jax.lax.dynamic_slice(cv, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0]
    s = jnp.einsum("bkgd,bksd->bkgs", q, kb, preferred_element_type=jnp.float32) * Dh ** -0.5
    mask = (start + jnp.arange(blk))[None, :] < valid_len[:, None]
    s = jnp.where(mask[:, None, None], s, -1e30)
    m_new = jnp.maximum(m, s.max(-1))
    p = jnp.where(mask[:, None, None], jnp.exp(s - m_new[..., None]), 0.)
    sc = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgs,bksd->bkgd", p, vb, preferred_element_type=jnp.float32)
    return m_new, l * sc + p.sum(-1), acc * sc[..., None] + pv
  init = (jnp.full((B, K, G), -1e30), jnp.zeros((B, K, G)), jnp.zeros((B, K, G, Dh)))
  _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  return acc / l[..., None]
def att_full_bksd(q, ck, cv, layer, valid_len):
  kb, vb = ck[layer], cv[layer]
  s = jnp.einsum("bkgd,bksd->bkgs", q, kb, preferred_element_type=jnp.float32) * Dh ** -0.5
  mask = jnp.arange(S)[None, :] < valid_len[:, None]
  s = jnp.where(mask[:, None, None], s, -1e30)
  return jnp.einsum("bkgs,bksd->bkgd", jax.nn.softmax(s, -1), vb)
def att_cur(q, ck, cv, layer, valid_len):
  qq = q.reshape(B, 1, K * G, Dh)
  return kva.cached_attention(qq, ck, cv, layer, (valid_len - 1)[:, None], valid_len)
variants = {"cur": (att_cur, (L, B, S, K, Dh)), "bksd": (att_bksd, (L, B, K, S, Dh)),
            "full_bksd": (att_full_bksd, (L, B, K, S, Dh))}
def make(fn):
  @jax.jit
  def run(ck, cv, q, vl):
    def body(i, c):
      ck, cv, q = c
      for layer in range(L):
        o = fn(q, ck, cv, layer, vl + i)
        q = q + 1e-3 * o.reshape(q.shape)
        if NOWRITE: pass
        elif ck.shape[2] == S:   # [L,B,S,K,Dh]
          ck = ck.at[layer, jnp.arange(B), vl + i].set(q[:, :, 0])
        else:
          ck = ck.at[layer, jnp.arange(B), :, vl + i].set(q[:, :, 0])
      return ck, cv, q
    return jax.lax.fori_loop(0, STEPS, body, (ck, cv, q))
  return jax.jit(run, donate_argnums=(0, 1))
vl = jnp.full((B,), fill, jnp.int32)
q = jax.random.normal(jax.random.PRNGKey(0), (B, K, G, Dh))
fns = {}
for name, (fn, shape) in variants.items():
  if sys.argv[1:] and name not in sys.argv[1:]: continue
  fns[name] = (make(fn), shape)
times = {k: [] for k in fns}
for rep in range(5):
  for name, (f, shape) in fns.items():
    ck = jnp.zeros(shape) + 0.01; cv = jnp.ones(shape)
    jax.block_until_ready(f(ck, cv, q, vl)) if rep == 0 else None
    ck = jnp.zeros(shape) + 0.01; cv = jnp.ones(shape); jax.block_until_ready((ck, cv))
    t0 = time.perf_counter(); jax.block_until_ready(f(ck, cv, q, vl)); times[name].append(time.perf_counter() - t0)
for name, t in times.items():
  print(f"{name}: {np.median(t) / STEPS * 1e3:.1f} ms per step (30 layers)", flush=True)
if os.environ.get("PROF"):
  import glob, collections
  from jax.profiler import ProfileData
  name, (f, shape) = next(iter(fns.items()))
  ck = jnp.zeros(shape) + 0.01; cv = jnp.ones(shape); jax.block_until_ready((ck, cv))
  os.system("rm -rf /tmp/m3jax_attn_trace")
  with jax.profiler.trace("/tmp/m3jax_attn_trace"):
    jax.block_until_ready(f(ck, cv, q, vl))
  pd = ProfileData.from_file(glob.glob("/tmp/m3jax_attn_trace/**/*.xplane.pb", recursive=True)[0])
  agg = collections.Counter(); cnt = collections.Counter()
  for plane in pd.planes:
    for line in plane.lines:
      if "Eigen" not in line.name: continue
      for ev in line.events:
        agg[(line.name[-6:], ev.name.split(".")[0])] += ev.duration_ns; cnt[(line.name[-6:], ev.name.split(".")[0])] += 1
  for k, v in agg.most_common(14): print(f"{v/1e6:9.1f} ms {cnt[k]:6d} {k}")
