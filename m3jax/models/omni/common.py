"""Small numerical pieces shared by the Omni encoders: norms, rotary helpers, packed-segment attention.

The encoders pack many media items into one token sequence and attend only within segments (frames, windows,
audio chunks). Instead of a dense [N, N] mask we gather each segment into a padded [S, L] layout (indices planned
on the host), attend there and scatter back: cost is O(sum_s L_s * L) instead of O(N^2), which is what makes long
videos fit in memory.
"""

from __future__ import annotations

from typing import Callable, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int


def rms_norm(x: Float[Array, "... D"], w: Float[Array, "D"], eps: float) -> Float[Array, "... D"]:
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return w * y.astype(x.dtype)


def layer_norm(x: Float[Array, "... D"], w: Float[Array, "D"], b: Float[Array, "D"],
               eps: float = 1e-5) -> Float[Array, "... D"]:
  x32 = x.astype(jnp.float32)
  mu = jnp.mean(x32, axis=-1, keepdims=True)
  var = jnp.mean(jnp.square(x32 - mu), axis=-1, keepdims=True)
  return ((x32 - mu) * jax.lax.rsqrt(var + eps)).astype(x.dtype) * w + b


def rotate_half(x: Float[Array, "... D"]) -> Float[Array, "... D"]:
  h = x.shape[-1] // 2
  return jnp.concatenate([-x[..., h:], x[..., :h]], axis=-1)


@flax.struct.dataclass
class SegmentLayout:
  """Where each token of a packed sequence sits in a padded [S, L] segment grid.

  index[s, l] = token id or -1 (padding); inverse[n] = flat position s*L + l of token n.
  """
  index: np.ndarray  # int32 [S, L]
  inverse: np.ndarray  # int32 [N]

  @staticmethod
  def from_cu_seqlens(cu: np.ndarray) -> "SegmentLayout":
    cu = np.asarray(cu, np.int64)
    lens = np.diff(cu)
    lens = lens[lens > 0]
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(np.int64)
    width = int(lens.max()) if lens.size else 1
    cols = np.arange(width)
    index = np.where(cols[None, :] < lens[:, None], starts[:, None] + cols[None, :], -1).astype(np.int32)
    seg = np.repeat(np.arange(lens.size), lens)
    inverse = (seg * width + (np.arange(int(lens.sum())) - np.repeat(starts, lens))).astype(np.int32)
    return SegmentLayout(index, inverse)


def segment_attention(q: Float[Array, "N H K"], k: Float[Array, "N H K"], v: Float[Array, "N H K"],
                      index: Int[Array, "S L"], inverse: Int[Array, "N"], scale: float,
                      chunk: int = 0) -> Float[Array, "N H K"]:
  """Bidirectional softmax attention restricted to segments (see SegmentLayout).

  `chunk` > 0 attends `chunk` queries of every segment at a time (lax.map, rematerialised in the backward pass):
  scores are [S, H, chunk, L] instead of [S, H, L, L] — a full-attention layer over 30 frames of ~1,300 patches
  would otherwise hold 3.2 GB of f32 scores. Same result per query row.
  """
  valid = index >= 0
  idx = jnp.maximum(index, 0)
  qs, ks, vs = q[idx], k[idx], v[idx]  # [S, L, H, K]
  key_ok = valid[:, None, None, :]

  def attend(qc):  # [S, C, H, K] -> [S, C, H, K]
    logits = jnp.einsum("slhk,smhk->shlm", qc, ks, preferred_element_type=jnp.float32) * scale
    probs = jax.nn.softmax(jnp.where(key_ok, logits, jnp.finfo(jnp.float32).min), axis=-1).astype(v.dtype)
    return jnp.einsum("shlm,smhk->slhk", probs, vs)

  s, l = index.shape
  if chunk and l > chunk:
    n = -(-l // chunk)
    qp = jnp.pad(qs, ((0, 0), (0, n * chunk - l), (0, 0), (0, 0)))
    blocks = qp.reshape(s, n, chunk, *qs.shape[2:]).swapaxes(0, 1)  # [n, S, C, H, K]
    out = jax.lax.map(jax.checkpoint(attend), blocks).swapaxes(0, 1).reshape(s, n * chunk, *qs.shape[2:])[:, :l]
  else:
    out = attend(qs)
  return out.reshape(s * l, *out.shape[2:])[inverse]


class FlatParams(nnx.Module):
  """An encoder whose parameters are a flat name -> array dict: freshly initialised, or given (e.g. loaded and
  already placed on their shardings). Subclasses set `_shapes` (cfg -> {name: shape}) and `_init` (cfg, key)."""

  _shapes: Callable
  _init: Callable

  def __init__(self, cfg, rngs: nnx.Rngs | None = None, params: Mapping[str, jax.Array] | None = None):
    self.cfg = cfg
    if params is None:
      params = type(self)._init(cfg, (rngs or nnx.Rngs(0)).params())
    for name in type(self)._shapes(cfg):
      setattr(self, name, nnx.Param(params[name]))

  def params(self) -> dict[str, jax.Array]:
    return {name: getattr(self, name)[...] for name in type(self)._shapes(self.cfg)}
