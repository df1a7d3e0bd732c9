"""Per-token log-probs and entropies from final hidden states, without ever building [B, T, V] logits.

For a 150k-token vocabulary the logits of a 64×8k batch would take 300 GB; the loss only needs, per token,
log p(target) = z_target − logsumexp(z) and the entropy lse − E_p[z]. Both come from a streaming pass over
vocabulary chunks that keeps a running max m, s = Σ exp(z − m) and u = Σ exp(z − m)·z (online softmax), nested
in a pass over sequence chunks. Both loop bodies are rematerialised, so the backward pass also holds only one
[B, Tc, Vc] block at a time; the saved residuals are the [B, Tc] running statistics. A sequence chunk in which
no row has a trained token (the system prompt and instructions that open every conversation) is skipped with
`lax.cond`, forward and backward; its outputs are 0.

`gathered_logprobs` goes further: only the trained positions (listed per row) are gathered out of the hidden
states before the vocabulary projection, so prompts and tool results interleaved with the policy's turns (which
put a trained token into nearly every sequence chunk of a multi-turn trajectory) cost no logits at all.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

_NEG = -1e30  # finite "−inf": exp(_NEG − m) underflows to 0 without inf − inf = nan


def _vocab_pass(h: Float[Array, "B Tc D"], w_chunks: Float[Array, "nV D Vc"], targets: Int[Array, "B Tc"],
                vocab_size: int, inv_temp: float) -> tuple[Array, Array]:
  """(log p(target), entropy) of one sequence chunk, streaming over vocabulary chunks."""
  n_chunks, _, vc = w_chunks.shape
  B, Tc = targets.shape

  def body(carry, xs):
    m, s, u, z_tgt = carry
    w_c, idx = xs
    z = jnp.einsum("btd,dv->btv", h, w_c.astype(h.dtype), preferred_element_type=jnp.float32) * inv_temp
    col = idx * vc + jnp.arange(vc)
    valid = col < vocab_size
    z = jnp.where(valid, z, _NEG)
    m_new = jax.lax.stop_gradient(jnp.maximum(m, z.max(-1)))  # any shift is exact; no gradient through it
    scale = jnp.exp(m - m_new)
    e = jnp.exp(z - m_new[..., None])
    s = s * scale + e.sum(-1)
    u = u * scale + (e * jnp.where(valid, z, 0.0)).sum(-1)
    local = targets - idx * vc
    hit = (local >= 0) & (local < vc)
    z_hit = jnp.take_along_axis(z, jnp.clip(local, 0, vc - 1)[..., None], axis=-1)[..., 0]
    return (m_new, s, u, z_tgt + jnp.where(hit, z_hit, 0.0)), None

  if n_chunks > 1:
    body = jax.checkpoint(body)
  zeros = jnp.zeros((B, Tc), jnp.float32)
  init = (jnp.full((B, Tc), _NEG, jnp.float32), zeros, zeros, zeros)
  (m, s, u, z_tgt), _ = jax.lax.scan(body, init, (w_chunks, jnp.arange(n_chunks)))
  lse = m + jnp.log(s)
  return z_tgt - lse, lse - u / s


def target_logprobs(h: Float[Array, "B T D"], w: Float[Array, "D V"], targets: Int[Array, "B T"], *,
                    needed: Array | None = None, temperature: float = 1.0, seq_chunk: int = 256,
                    vocab_chunk: int = 8192) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """log softmax(h·w / temperature)[targets] and the entropy of that distribution, per position.

  `needed[b, t]` (optional) marks the positions whose values are used; chunks with none are not computed.
  """
  B, T, D = h.shape
  V = w.shape[1]
  vc = min(vocab_chunk, V)
  nv = -(-V // vc)
  w_pad = jnp.pad(w, ((0, 0), (0, nv * vc - V))) if nv * vc != V else w
  w_chunks = w_pad.reshape(D, nv, vc).transpose(1, 0, 2)
  tc = min(seq_chunk, T)
  nt = -(-T // tc)
  pad = nt * tc - T
  if pad:
    h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
  needed = jnp.ones((B, T), bool) if needed is None else needed.astype(bool)
  if pad:
    needed = jnp.pad(needed, ((0, 0), (0, pad)))
  n_chunks = needed.reshape(B, nt, tc).any(axis=(0, 2))  # [nt]
  h_chunks = h.reshape(B, nt, tc, D).transpose(1, 0, 2, 3)
  t_chunks = targets.reshape(B, nt, tc).transpose(1, 0, 2)
  inv_temp = 1.0 / temperature

  def body(_, xs):
    hc, tg, use = xs
    skip = lambda hc, tg: (jnp.zeros(tg.shape, jnp.float32), jnp.zeros(tg.shape, jnp.float32))
    return None, jax.lax.cond(use, lambda hc, tg: _vocab_pass(hc, w_chunks, tg, V, inv_temp), skip, hc, tg)

  if nt > 1:
    body = jax.checkpoint(body)
  _, (logp, ent) = jax.lax.scan(body, None, (h_chunks, t_chunks, n_chunks))
  logp = logp.transpose(1, 0, 2).reshape(B, nt * tc)[:, :T]
  ent = ent.transpose(1, 0, 2).reshape(B, nt * tc)[:, :T]
  return logp, ent


def sequence_logprobs(h: Float[Array, "B T D"], w: Float[Array, "D V"], tokens: Int[Array, "B T"],
                      mask: Array | None = None, **kw) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """Token-aligned: out[:, t] = log p(tokens[:, t] | tokens[:, <t]) (and its entropy); out[:, 0] = 0.

  With `mask` (token-aligned, as the loss mask) only chunks holding a masked token are guaranteed computed.
  """
  targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
  needed = None if mask is None else jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
  logp, ent = target_logprobs(h, w, targets, needed=needed, **kw)
  shift = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
  return shift(logp), shift(ent)


def trained_positions(mask, bucket: int):
  """Host-side [..., K] token positions t with mask[..., t] > 0, in order, padded with −1; K = the most any row
  has, rounded up to a multiple of `bucket` (one compilation per K) and capped at the width. None when K would
  be the whole width (gathering would save nothing)."""
  import numpy as np

  mask = np.asarray(mask) > 0
  width = mask.shape[-1]
  count = int(mask.sum(-1).max(initial=0))
  k = min(width, -(-max(count, 1) // bucket) * bucket)
  if k >= width:
    return None
  order = np.argsort(~mask, axis=-1, kind="stable")[..., :k]  # trained positions first, in order
  return np.where(np.take_along_axis(mask, order, -1), order, -1).astype(np.int32)


def gathered_logprobs(h: Float[Array, "B T D"], w: Float[Array, "D V"], tokens: Int[Array, "B T"],
                      positions: Int[Array, "B K"], **kw) -> tuple[Float[Array, "B T"], Float[Array, "B T"]]:
  """`sequence_logprobs` at `positions` only (token positions ≥ 1; −1 = padding): out[b, p] = log p(tokens[b, p]
  | tokens[b, <p]) from h[b, p − 1] for every listed p, 0 elsewhere (entropies alike). The vocabulary work is
  B·K positions instead of B·T; gradients reach h only at the gathered positions."""
  valid = positions > 0
  pos = jnp.where(valid, positions, 0)
  hq = jnp.take_along_axis(h, jnp.maximum(pos - 1, 0)[..., None], axis=1)
  targets = jnp.take_along_axis(tokens, pos, axis=1)
  logp, ent = target_logprobs(hq, w, targets, needed=valid, **kw)
  rows = jnp.arange(h.shape[0])[:, None]
  scatter = lambda x: jnp.zeros(tokens.shape, x.dtype).at[rows, pos].add(jnp.where(valid, x, 0.0))
  return scatter(logp), scatter(ent)
