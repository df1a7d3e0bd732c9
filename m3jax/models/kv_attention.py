"""Attention over a KV cache that reads only its filled part: a loop over key blocks with an online softmax.

WHY: the cache is padded to a length bucket (the sampler's `length_buckets`), and scoring every slot of that bucket
made a decode step grow with the bucket, not with what was written (77 / 155 / 383 ms at 256 / 1024 / 4096 slots).
Here the queries visit key blocks `[j * block, (j + 1) * block)` only while `j * block < max(valid_len)` (a
`fori_loop` with a traced trip count, i.e. a `while_loop`), so a step costs what the longest row has filled, and
each block is cut from the layer's cache with a `dynamic_slice` (the unread slots are never touched). Rows shorter
than the batch's longest are masked inside a block by `visible`, the mask the dense path (`decoder.attention`) uses.

The softmax is the flash-attention recurrence (running max `m`, running sum `l`, unnormalised output `acc`,
rescaled by exp(m_old - m_new) when a block raises the max), so the result equals the dense softmax up to float
rounding. A query that sees no key at all (a batch-padding row with nothing written) returns zeros, where the
dense path returns an unused average of empty slots.

Not differentiable in reverse mode (the trip count is data-dependent): it serves the cache paths (prefill and
decode), never training, which runs without a cache (`causal_attention`).

`window_attention` is the decode loop's form (`decoder.LayerKV`): each layer's keys and values are an array of their
own, `[B, K, W, Dh]`, holding only the first W slots (W a bucket just above what the loop will fill). It reads the
whole array with no slice at all: XLA:CPU materialises every `dynamic_slice` a dot reads, and for a batch-16 decode
step those block copies (then with a `[B, S, K, Dh]` -> `[B, K, S, Dh]` transpose each) were 73 of 191 ms.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

BLOCK = 256  # key slots per loop iteration: large enough that the loop's own overhead is small against the block
_MASKED = -1e30  # finite, so a block with no visible key rescales nothing to NaN


def visible(keys: Int[Array, "S"], q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
            window: Int[Array, ""] | None = None) -> Array:
  """[B, T, S] visibility of key slots `keys`: filled (s < valid_len), causal (s <= t) and, with a sliding `window`
  > 0, within it (s > t - window, transformers' sliding_window_overlay); window 0 = full attention."""
  s_idx = keys[None, None, :]
  t = q_slots[:, :, None]
  mask = (s_idx <= t) & (s_idx < valid_len[:, None, None])
  if window is not None:
    mask = mask & ((window == 0) | (s_idx > t - window))
  return mask


def cached_attention(q: Float[Array, "B T H Dh"], ck: Float[Array, "L B K S Dh"], cv: Float[Array, "L B K S Dh"],
                     layer: Int[Array, ""], q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
                     window: Int[Array, ""] | None = None, block: int = BLOCK) -> Float[Array, "B T H Dh"]:
  """Grouped-query attention of q (at cache slots `q_slots`) over layer `layer` of the cache, reading only the key
  blocks below max(valid_len); same semantics as `decoder.attention` on `ck[layer]`, `cv[layer]` with their slot
  and head axes swapped."""
  B, T, H, Dh = q.shape
  K, S = ck.shape[2], ck.shape[3]
  G = H // K
  blk = math.gcd(S, block)  # a block size dividing S: dynamic_slice would clamp a block running past the end
  qg = q.reshape(B, T, K, G, Dh)
  n_blocks = (jnp.max(valid_len) + blk - 1) // blk

  def body(j, carry):
    m, l, acc = carry
    start = j * blk
    kb = jax.lax.dynamic_slice(ck, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0].astype(q.dtype)
    vb = jax.lax.dynamic_slice(cv, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0].astype(q.dtype)
    s = jnp.einsum("btkgd,bksd->bkgts", qg, kb, preferred_element_type=jnp.float32) * (Dh ** -0.5)
    mask = visible(start + jnp.arange(blk), q_slots, valid_len, window)[:, None, None]  # [B, 1, 1, T, blk]
    s = jnp.where(mask, s, _MASKED)
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
    scale = jnp.exp(m - m_new)
    pv = jnp.einsum("bkgts,bksd->bkgtd", p.astype(q.dtype), vb, preferred_element_type=jnp.float32)
    return m_new, l * scale + p.sum(axis=-1), acc * scale[..., None] + pv

  init = (jnp.full((B, K, G, T), _MASKED, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
          jnp.zeros((B, K, G, T, Dh), jnp.float32))
  _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  out = acc / jnp.where(l > 0, l, 1.0)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh).astype(q.dtype)


def prefill_attention(q: Float[Array, "B T H Dh"], ck: Float[Array, "L B K S Dh"], cv: Float[Array, "L B K S Dh"],
                      layer: Int[Array, ""], q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"], chunk: int,
                      window: Int[Array, ""] | None = None) -> Float[Array, "B T H Dh"]:
  """`cached_attention` over blocks of `chunk` queries: a prefill of T tokens written after each row's cached ones.

  WHY: a prefill pads its rows to a width bucket and its cache to a slot bucket, and scoring every query block
  against every slot computed scores that the mask then threw away (an RL rollout's 32-row prefill at width 512
  into 1024 slots: 33.1 s that way, 26.4 s this way, SmolLM2-135M on 2 cores). Here a query block visits
  only the key blocks some row's queries of that block can see (below min(valid_len, start + block end)), and the
  loop stops after the last block holding a real query of any row; a row fed nothing reads no key at all. Every
  real query's softmax is `cached_attention`'s; padding queries (past a row's `valid_len`) return what their
  bounded keys give, which nothing reads. Forward only, as `cached_attention`."""
  B, T, H, Dh = q.shape
  n = -(-T // chunk)
  pad = n * chunk - T
  qp = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
  sp = jnp.pad(q_slots, ((0, 0), (0, pad)), mode="edge")
  start = q_slots[:, 0]
  fed = valid_len - start
  live = (jnp.max(fed) + chunk - 1) // chunk  # query blocks holding a real query of some row

  def body(i, out):
    qb = jax.lax.dynamic_slice_in_dim(qp, i * chunk, chunk, axis=1)
    sb = jax.lax.dynamic_slice_in_dim(sp, i * chunk, chunk, axis=1)
    seen = jnp.where(fed > 0, jnp.minimum(valid_len, start + (i + 1) * chunk), 0)  # the keys this block can see
    return jax.lax.dynamic_update_slice_in_dim(out, cached_attention(qb, ck, cv, layer, sb, seen, window),
                                               i * chunk, axis=1)

  return jax.lax.fori_loop(0, live, body, jnp.zeros_like(qp))[:, :T]


def window_attention(q: Float[Array, "B T H Dh"], k: Float[Array, "B K W Dh"], v: Float[Array, "B K W Dh"],
                     q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
                     window: Int[Array, ""] | None = None) -> Float[Array, "B T H Dh"]:
  """Grouped-query attention of q (at cache slots `q_slots`) over one layer's first W cache slots, every slot read
  and masked by `visible`; same semantics as `cached_attention` while valid_len <= W."""
  B, T, H, Dh = q.shape
  K, W = k.shape[1], k.shape[2]
  G = H // K
  qg = q.reshape(B, T, K, G, Dh)
  s = jnp.einsum("btkgd,bksd->bkgts", qg, k.astype(q.dtype), preferred_element_type=jnp.float32) * (Dh ** -0.5)
  mask = visible(jnp.arange(W), q_slots, valid_len, window)[:, None, None]  # [B, 1, 1, T, W]
  s = jnp.where(mask, s, _MASKED)
  p = jnp.where(mask, jnp.exp(s - s.max(axis=-1, keepdims=True)), 0.0)
  out = jnp.einsum("bkgts,bksd->bkgtd", p.astype(q.dtype), v.astype(q.dtype), preferred_element_type=jnp.float32)
  out = out / jnp.maximum(p.sum(axis=-1), jnp.finfo(jnp.float32).tiny)[..., None]
  return out.transpose(0, 3, 1, 2, 4).reshape(B, T, H, Dh).astype(q.dtype)
