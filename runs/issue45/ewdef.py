import dataclasses, time, sys, math
import numpy as np, jax, jax.numpy as jnp
import m3jax.models.decoder as dec
from m3jax.models import kv_attention as kva
from m3jax.models.llm import load_llm
from m3jax.engine.sampling import Sampler, SamplingConfig
_MASKED = kva._MASKED

def ew_attention(q, ck, cv, layer, q_slots, valid_len, window=None, block=kva.BLOCK):
  B, T, H, Dh = q.shape
  if T != 1:
    return kva.cached_attention(q, ck, cv, layer, q_slots, valid_len, window, block)
  S, K = ck.shape[2], ck.shape[3]
  G = H // K
  blk = math.gcd(S, block)
  qg = q.reshape(B, K, G, Dh).astype(jnp.float32) * (Dh ** -0.5)
  n_blocks = (jnp.max(valid_len) + blk - 1) // blk
  def body(j, carry):
    m, l, acc = carry
    start = j * blk
    kb = jax.lax.dynamic_slice(ck, (layer, 0, start, 0, 0), (1, B, blk, K, Dh))[0]  # [B, s, K, Dh]
    vb = jax.lax.dynamic_slice(cv, (layer, 0, start, 0, 0), (1, B, blk, K, Dh))[0]
    s = jnp.sum(qg[:, None, :, :, :] * kb[:, :, :, None, :].astype(jnp.float32), axis=-1)  # [B, s, K, G]
    mask = kva.visible(start + jnp.arange(blk), q_slots, valid_len, window)[:, 0, :, None, None]  # [B, s, 1, 1]
    s = jnp.where(mask, s, _MASKED)
    m_new = jnp.maximum(m, s.max(axis=1))  # [B, K, G]
    p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
    scale = jnp.exp(m - m_new)
    pv = jnp.sum(p[..., None] * vb[:, :, :, None, :].astype(jnp.float32), axis=1)  # [B, K, G, Dh]
    return m_new, l * scale + p.sum(axis=1), acc * scale[..., None] + pv
  init = (jnp.full((B, K, G), _MASKED, jnp.float32), jnp.zeros((B, K, G), jnp.float32),
          jnp.zeros((B, K, G, Dh), jnp.float32))
  _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  out = acc / jnp.where(l > 0, l, 1.0)[..., None]
  return out.reshape(B, 1, H, Dh).astype(q.dtype)

