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
  n_blocks = (jnp.max(valid_len) + blk - 1) // blk

  def body(j, carry):
    m, l, acc = carry
    start = j * blk
    kb = jax.lax.dynamic_slice(ck, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0].astype(q.dtype)
    vb = jax.lax.dynamic_slice(cv, (layer, 0, 0, start, 0), (1, B, K, blk, Dh))[0].astype(q.dtype)
    s = _masked_scores(q, kb, start + jnp.arange(blk), q_slots, valid_len, window)
    m_new = jnp.maximum(m, s.max(axis=-1))
    p = jnp.exp(s - m_new[..., None])  # a masked score: exp(-1e30 - m) = 0 once the row has seen a key
    scale = jnp.exp(m - m_new)  # and what a row summed before its first key is scaled to 0 here
    return m_new, l * scale + p.sum(axis=-1), acc * scale[..., None] + _weighted_values(p, vb)

  init = (jnp.full((B, K, G, T), _MASKED, jnp.float32), jnp.zeros((B, K, G, T), jnp.float32),
          jnp.zeros((B, K, G, T, Dh), jnp.float32))
  _, l, acc = jax.lax.fori_loop(0, n_blocks, body, init)
  return _ungroup(acc / l[..., None], q_slots, valid_len, window).astype(q.dtype)


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
  and masked; same semantics as `cached_attention` while valid_len <= W."""
  s = _masked_scores(q, k.astype(q.dtype), jnp.arange(k.shape[2]), q_slots, valid_len, window)
  p = jnp.exp(s - s.max(axis=-1, keepdims=True))
  out = _weighted_values(p, v.astype(q.dtype)) / p.sum(axis=-1)[..., None]
  return _ungroup(out, q_slots, valid_len, window).astype(q.dtype)


def _masked_scores(q: Float[Array, "B T H Dh"], k: Float[Array, "B K S Dh"], keys: Int[Array, "S"],
                   q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
                   window: Int[Array, ""] | None) -> Float[Array, "B K G T S"]:
  """Scaled f32 scores of q against keys `keys` of k, masked ones at -1e30 (or below: a finite score is absorbed).

  WHY two forms (XLA:CPU, SmolLM2's 9 query over 3 KV heads, 2 cores): with several queries a row (a prefill
  piece), each KV head's G x T query rows form one matrix, so the product comes out in the softmax's layout (the
  [B, T, K, G] order made XLA transpose the whole score tensor), and the mask is an additive bias that fuses into
  the pass over the scores (a select there cost as much again): one layer of 32 rows x 64 queries over 768 slots
  took 45 ms this way against 90 ms. A decode step's single query is the opposite case: there the grouped rows
  ran at half the speed of the [B, T, K, G] einsum with a select (30 layers of 32 rows over 1024 slots: 223
  against 111 ms)."""
  B, T, H, Dh = q.shape
  K = k.shape[1]
  G = H // K
  mask = visible(keys, q_slots, valid_len, window)[:, None, None]  # [B, 1, 1, T, S]
  if T == 1:
    s = jnp.einsum("btkgd,bksd->bkgts", q.reshape(B, T, K, G, Dh), k, preferred_element_type=jnp.float32)
    return jnp.where(mask, s * (Dh ** -0.5), _MASKED)
  qg = q.reshape(B, T, K, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, K, G * T, Dh)
  s = jnp.einsum("bkqd,bksd->bkqs", qg, k, preferred_element_type=jnp.float32).reshape(B, K, G, T, k.shape[2])
  return s * (Dh ** -0.5) + jnp.where(mask, 0.0, _MASKED)


def _weighted_values(p: Float[Array, "B K G T S"], v: Float[Array, "B K S Dh"]) -> Float[Array, "B K G T Dh"]:
  """p @ v per KV head, in `_masked_scores`' layout for the same T."""
  B, K, G, T, S = p.shape
  if T == 1:
    return jnp.einsum("bkgts,bksd->bkgtd", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  out = jnp.einsum("bkqs,bksd->bkqd", p.reshape(B, K, G * T, S).astype(v.dtype), v, preferred_element_type=jnp.float32)
  return out.reshape(B, K, G, T, v.shape[-1])


def _ungroup(out: Float[Array, "B K G T Dh"], q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
             window: Int[Array, ""] | None) -> Float[Array, "B T H Dh"]:
  """Back to [B, T, H, Dh], with zeros for a query that sees no key at all (a batch-padding row): the masked
  softmax gives such a row an average of whatever its slots hold. Its visible keys are [lo, min(t, valid_len - 1)].
  Unwritten slots hold finite values (a cache starts zeroed; a reset row keeps old finite ones), as the values'
  product needs anyway: p = 0 times NaN would not be 0."""
  B, K, G, T, Dh = out.shape
  lo = 0 if window is None else jnp.where(window == 0, 0, jnp.maximum(q_slots - window + 1, 0))
  sees = jnp.minimum(q_slots, valid_len[:, None] - 1) >= lo
  return jnp.where(sees[:, :, None, None], out.transpose(0, 3, 1, 2, 4).reshape(B, T, K * G, Dh), 0.0)
