"""Causal self-attention over query blocks with a flash-style backward pass (training and cache-free prefill).

Without a KV cache the keys are the queries' own tokens, so query block i only needs keys [0, (i + 1) * chunk).
Blocks are processed in a few groups; a group is one `lax.scan` over its blocks against the key prefix its last
block needs (the causal mask covers the rest), so:
  * memory stays linear in T: a scan holds one block's [G * chunk, prefix] scores at a time. Unrolled blocks (one
    program op per block) let XLA's scheduler start every block early and hold all their scores at once, which
    is the [T, T] memory chunking was meant to avoid (431 MB of temporaries for one T=4096 layer in this test
    shape, against 27 MB for one scan over all keys);
  * FLOPs stay close to exact causal attention: with `groups` groups the scores cost (groups + 1) / groups of the
    lower triangle, not the 2x of scanning every block over all keys.
The custom VJP keeps one log-sum-exp per query row and recomputes probabilities in the backward pass as
`exp(s - lse)`: one exponential per score, no second softmax, no recomputed P·V product, and dK / dV accumulated
transposed (dO^T P, dS^T Q), which XLA:CPU runs ~3x faster than P^T dO.

Semantics equal `decoder.attention` with `q_slots = offset + arange(T)`: query t sees keys s <= offset + t with
s < valid_len, and with a sliding `window` > 0 only keys s > offset + t - window (0 = full attention). An `offset`
of P puts P earlier keys before the queries' own (the learner's shared prefix, `Decoder.hidden`'s `prefix_kv`):
the same linear memory as a cache-free pass, where full attention would keep every layer's [T, P + T] scores for
the backward pass (tens of GB at T ~ 2000 for an RL group's rows). A window only masks scores: blocks
entirely outside it are still computed, which costs FLOPs but keeps one program for every layer of a model whose
layers differ in window (the window is a traced per-layer value of the layer scan).
Layout: each kv head's query group is one [G * chunk, Dh] tile per block, so every product is a batched matmul.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

_MASKED = -1e30  # added to masked scores; finite, so a fully masked row gives a finite (unused) output
GROUPS = 4


def causal_attention(q: Float[Array, "B T H Dh"], k: Float[Array, "B S K Dh"], v: Float[Array, "B S K Dh"],
                     valid_len: Int[Array, "B"], chunk: int, groups: int = GROUPS,
                     window: Int[Array, ""] | None = None, offset: int = 0) -> Float[Array, "B T H Dh"]:
  """Grouped-query causal attention of T queries over `offset` earlier keys and their own T (S = offset + T), in
  query blocks of `chunk`."""
  B, T, H, Dh = q.shape
  K = k.shape[2]
  if k.shape[1] != offset + T:
    raise ValueError(f"{k.shape[1]} keys for {T} queries after offset {offset}")
  n = -(-T // chunk)
  pad = ((0, 0), (0, n * chunk - T), (0, 0), (0, 0))
  key_bias = jnp.where(jnp.arange(offset + n * chunk)[None] < valid_len[:, None], 0.0, _MASKED).astype(jnp.float32)
  qb = _to_blocks(jnp.pad(q * jnp.asarray(Dh ** -0.5, q.dtype), pad), K, chunk)
  kt = jnp.pad(k, pad).transpose(0, 2, 1, 3)  # [B, K, offset + n*chunk, Dh]
  vt = jnp.pad(v, pad).transpose(0, 2, 1, 3)
  bounds = tuple(int(g[-1]) + 1 for g in np.array_split(np.arange(n), min(groups, n)))
  window = None if window is None else jnp.asarray(window, jnp.int32)
  out = _blocked(qb, kt, vt, key_bias[:, None, None], window, chunk, bounds, offset)
  return _from_blocks(out, H)[:, :T].astype(q.dtype)


def _to_blocks(x: Float[Array, "B Tp H Dh"], K: int, chunk: int) -> Float[Array, "n B K GC Dh"]:
  B, Tp, H, Dh = x.shape
  G, n = H // K, Tp // chunk
  return x.reshape(B, n, chunk, K, G, Dh).transpose(1, 0, 3, 4, 2, 5).reshape(n, B, K, G * chunk, Dh)


def _from_blocks(x: Float[Array, "n B K GC Dh"], H: int) -> Float[Array, "B Tp H Dh"]:
  n, B, K, GC, Dh = x.shape
  G = H // K
  c = GC // G
  return x.reshape(n, B, K, G, c, Dh).transpose(1, 0, 4, 2, 3, 5).reshape(B, n * c, H, Dh)


def _groups(bounds: tuple[int, ...]):
  """(first block, end block) of each group; the group attends to keys [0, offset + end * chunk)."""
  return zip((0,) + bounds[:-1], bounds)


def _scores(qi, i, kt, key_bias, window, chunk: int, offset: int):
  """Masked f32 scores of block i ([B, K, G*c, L]) against the first L keys (kt, key_bias already cut to L)."""
  s = jnp.einsum("bkqd,bksd->bkqs", qi, kt, preferred_element_type=jnp.float32) + key_bias
  row = (offset + i * chunk + jnp.arange(qi.shape[2]) % chunk)[:, None]  # every (group, row)'s query position
  key = jnp.arange(kt.shape[2])[None, :]
  visible = key <= row
  if window is not None:
    visible = visible & ((window == 0) | (key > row - window))
  return jnp.where(visible, s, _MASKED)


def _forward(qb, kt, vt, key_bias, window, chunk, bounds, offset):
  outs, lses = [], []
  for lo, hi in _groups(bounds):
    L = offset + hi * chunk
    k_l, v_l, bias_l = kt[:, :, :L], vt[:, :, :L], key_bias[..., :L]

    def block(_, xs, k_l=k_l, v_l=v_l, bias_l=bias_l):
      qi, i = xs
      s = _scores(qi, i, k_l, bias_l, window, chunk, offset)
      m = jnp.max(s, axis=-1, keepdims=True)
      p = jnp.exp(s - m)
      total = jnp.sum(p, axis=-1, keepdims=True)
      pv = jnp.einsum("bkqs,bksd->bkqd", p.astype(v_l.dtype), v_l, preferred_element_type=jnp.float32)
      return None, (pv / total, m + jnp.log(total))

    _, (out, lse) = jax.lax.scan(block, None, (qb[lo:hi], jnp.arange(lo, hi)))
    outs.append(out)
    lses.append(lse)
  return jnp.concatenate(outs), jnp.concatenate(lses)  # [n, B, K, G*c, Dh] f32, [n, B, K, G*c, 1]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _blocked(qb, kt, vt, key_bias, window, chunk, bounds, offset):
  return _forward(qb, kt, vt, key_bias, window, chunk, bounds, offset)[0]


def _blocked_fwd(qb, kt, vt, key_bias, window, chunk, bounds, offset):
  out, lse = _forward(qb, kt, vt, key_bias, window, chunk, bounds, offset)
  return out, (qb, kt, vt, key_bias, window, out, lse)


def _blocked_bwd(chunk, bounds, offset, res, d_out):
  """Flash-attention backward: P = exp(S - lse), dS = P * (dP - rowsum(dO * O)); dK, dV carried per group."""
  qb, kt, vt, key_bias, window, out, lse = res
  delta = jnp.sum(d_out * out, axis=-1, keepdims=True)  # [n, B, K, G*c, 1]
  B, K, S, Dh = kt.shape
  mm = functools.partial(jnp.einsum, preferred_element_type=jnp.float32)
  dk_t, dv_t, dqs = jnp.zeros((B, K, Dh, S), jnp.float32), jnp.zeros((B, K, Dh, S), jnp.float32), []
  for lo, hi in _groups(bounds):
    L = offset + hi * chunk
    k_l, v_l, bias_l = kt[:, :, :L], vt[:, :, :L], key_bias[..., :L]

    def block(carry, xs, k_l=k_l, v_l=v_l, bias_l=bias_l):
      dk_l, dv_l = carry
      qi, i, doi, lse_i, delta_i = xs
      doi = doi.astype(v_l.dtype)
      p = jnp.exp(_scores(qi, i, k_l, bias_l, window, chunk, offset) - lse_i)
      dv_l = dv_l + mm("bkqd,bkqs->bkds", doi, p.astype(v_l.dtype))
      ds = (p * (mm("bkqd,bksd->bkqs", doi, v_l) - delta_i)).astype(qi.dtype)
      dk_l = dk_l + mm("bkqd,bkqs->bkds", qi, ds)
      return (dk_l, dv_l), mm("bkqs,bksd->bkqd", ds, k_l)

    zeros = jnp.zeros((B, K, Dh, L), jnp.float32)
    (dk_l, dv_l), dq = jax.lax.scan(block, (zeros, zeros), (qb[lo:hi], jnp.arange(lo, hi), d_out[lo:hi],
                                                            lse[lo:hi], delta[lo:hi]))
    dk_t, dv_t = dk_t.at[..., :L].add(dk_l), dv_t.at[..., :L].add(dv_l)
    dqs.append(dq)
  return (jnp.concatenate(dqs).astype(qb.dtype), dk_t.swapaxes(2, 3).astype(kt.dtype),
          dv_t.swapaxes(2, 3).astype(vt.dtype), jnp.zeros_like(key_bias), None)  # the window is an integer


_blocked.defvjp(_blocked_fwd, _blocked_bwd)
