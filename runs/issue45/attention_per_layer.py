import time, math, sys, os
import numpy as np, jax, jax.numpy as jnp
L, B, S, K, G, Dh, STEPS = 30, 16, int(os.environ.get("S", 512)), 3, 3, 64, 16
H = K * G
fill = 256
own = (jnp.arange(H)[:, None] // G) == jnp.arange(K)[None, :]   # [H, K]: query head h reads kv head h // G

def att_fold(q, kl, vl_, valid_len, lo=0, n=None):
  # q [B, H, Dh]; kl/vl_ [B, S, K, Dh] one layer's buffer; all slots
  n = kl.shape[1]
  kf = kl.reshape(B, n * K, Dh); vf = vl_.reshape(B, n * K, Dh)
  s = jnp.einsum("bhd,bnd->bhn", q, kf, preferred_element_type=jnp.float32).reshape(B, H, n, K) * Dh ** -0.5
  mask = ((lo + jnp.arange(n))[None, :] < valid_len[:, None])[:, None, :, None] & own[None, :, None, :]
  s = jnp.where(mask, s, -1e30)
  m = s.max(axis=(2, 3))
  p = jnp.where(mask, jnp.exp(s - m[..., None, None]), 0.)
  out = jnp.einsum("bhn,bnd->bhd", p.reshape(B, H, n * K), vf, preferred_element_type=jnp.float32)
  return out / p.sum(axis=(2, 3))[..., None]

def att_bksd(q, kl, vl_, valid_len):
  n = kl.shape[2]
  qg = q.reshape(B, K, G, Dh)
  s = jnp.einsum("bkgd,bksd->bkgs", qg, kl, preferred_element_type=jnp.float32) * Dh ** -0.5
  mask = (jnp.arange(n)[None, :] < valid_len[:, None])[:, None, None, :]
  s = jnp.where(mask, s, -1e30)
  m = s.max(-1)
  p = jnp.where(mask, jnp.exp(s - m[..., None]), 0.)
  out = jnp.einsum("bkgs,bksd->bkgd", p, vl_, preferred_element_type=jnp.float32) / p.sum(-1)[..., None]
  return out.reshape(B, H, Dh)
KIND = os.environ.get("KIND", "fold")
def make(kind):
  def run(cks, cvs, q, vl):
    def body(i, c):
      cks, cvs, q = c
      cks, cvs = list(cks), list(cvs)
      for layer in range(L):
        o = (att_fold if KIND == 'fold' else att_bksd)(q, cks[layer], cvs[layer], vl + i)
        q = q + 1e-3 * o
        cks[layer] = (cks[layer].at[jnp.arange(B), vl + i].set(q.reshape(B, K, G, Dh)[:, :, 0]) if KIND == 'fold' else cks[layer].at[jnp.arange(B), :, vl + i].set(q.reshape(B, K, G, Dh)[:, :, 0]))
      return tuple(cks), tuple(cvs), q
    return jax.lax.fori_loop(0, STEPS, body, (cks, cvs, q))
  return jax.jit(run, donate_argnums=(0, 1))
vl = jnp.full((B,), fill, jnp.int32)
q = jax.random.normal(jax.random.PRNGKey(0), (B, H, Dh))
f = make("fold")
ts = []
for rep in range(5):
  cks = tuple(jnp.zeros((B, S, K, Dh) if KIND == 'fold' else (B, K, S, Dh)) + 0.01 for _ in range(L)); cvs = tuple(jnp.ones((B, S, K, Dh) if KIND == 'fold' else (B, K, S, Dh)) for _ in range(L))
  jax.block_until_ready((cks, cvs))
  t0 = time.perf_counter(); jax.block_until_ready(f(cks, cvs, q, vl)); ts.append(time.perf_counter() - t0)
print(f"perlayer_{KIND} S={S}: {np.median(ts[1:]) / STEPS * 1e3:.1f} ms per step (30 layers)", flush=True)
