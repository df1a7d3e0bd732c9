"""Target-token cross-entropy without materialising [B, T, V] logits.

The Omni vocabulary is 152k and a 30-s clip prompt is ~20k tokens, so full logits would be ~12 GB in f32 per
row. The final hidden states are cut into sequence chunks; each chunk's logits are computed, reduced to the
label's negative log-likelihood, and dropped (rematerialised in the backward pass by jax.checkpoint).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from m3jax.models.decoder import Decoder
from m3jax.models.omni.chat import Batch
from m3jax.models.omni.thinker import Thinker, ThinkerInputs


class TextBatch(NamedTuple):
  """A text-only SFT batch (the text memory writer): right-padded token rows, their lengths, next-token labels
  and the weights that select target tokens."""
  ids: Int[Array, "B T"]
  lengths: Int[Array, "B"]
  labels: Int[Array, "B T"]
  weights: Float[Array, "B T"]


def chunked_nll(h: Float[Array, "B T D"], w: Float[Array, "D V"], labels: Int[Array, "B T"],
                weights: Float[Array, "B T"], chunk: int) -> tuple[jax.Array, jax.Array]:
  """(sum of weighted NLL, sum of weights). T must be a multiple of `chunk` (pad the batch length)."""
  B, T, D = h.shape
  if T % chunk:
    raise ValueError(f"sequence length {T} is not a multiple of the loss chunk {chunk}")
  n = T // chunk
  hs = h.reshape(B, n, chunk, D).swapaxes(0, 1)
  ls = labels.reshape(B, n, chunk).swapaxes(0, 1)
  ws = weights.reshape(B, n, chunk).swapaxes(0, 1)

  @jax.checkpoint
  def one(hc, lc, wc):
    logits = jnp.einsum("bcd,dv->bcv", hc, w.astype(hc.dtype), preferred_element_type=jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, lc[..., None], axis=-1)[..., 0]
    return jnp.sum((lse - picked) * wc)

  def body(total, xs):
    return total + one(*xs), None

  total, _ = jax.lax.scan(body, jnp.zeros((), jnp.float32), (hs, ls, ws))
  return total, jnp.sum(weights)


def thinker_loss(model: Thinker, inputs: ThinkerInputs, labels, weights, chunk: int) -> tuple[jax.Array, jax.Array]:
  h, _ = model.hidden(inputs.input_ids, inputs.lengths, inputs.positions, inputs.plans, inputs.pixel_values,
                      inputs.audio_features)
  return chunked_nll(h, model.lm.lm_head_weight(), labels, weights, chunk)


def decoder_loss(model: Decoder, batch: TextBatch, chunk: int) -> tuple[jax.Array, jax.Array]:
  h, _ = model.hidden(batch.ids, chunk_len=batch.lengths)
  return chunked_nll(h, model.lm_head_weight(), batch.labels, batch.weights, chunk)


def batch_loss(model: Thinker | Decoder, batch: Batch | TextBatch, chunk: int) -> tuple[jax.Array, jax.Array]:
  """(sum of target-token NLL, target-token count) of either SFT batch kind: a TextBatch on a text Decoder, a
  media Batch on the Omni thinker."""
  if isinstance(batch, TextBatch):
    return decoder_loss(model, batch, chunk)
  return thinker_loss(model, batch.inputs, batch.labels, batch.weights, chunk)
