"""Rotary position embeddings: the scaling variants HF configs use, and multimodal (3-stream) RoPE.

Frequencies are computed on the host in float64 numpy (they are config constants), then used as jit constants.
The rotation is HF's "rotate half" layout (not interleaved), so HF checkpoints load without permutation.
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
import numpy as np


def inv_frequencies(head_dim: int, theta: float, scaling: tuple[tuple[str, object], ...] | None,
                    max_position_embeddings: int) -> tuple[np.ndarray, float]:
  """Returns (inv_freq [head_dim/2] float32, attention scaling) for default/linear/llama3/yarn RoPE.

  `scaling` is the config's (key, value) pairs; DecoderConfig computes this once at construction, so an
  unsupported rope_type fails when the config is built (at load), not at the first forward."""
  return _inv_frequencies(head_dim, float(theta), tuple(sorted(scaling or ())), max_position_embeddings)


@functools.lru_cache(maxsize=None)
def _inv_frequencies(head_dim, theta, scaling_items, max_pos):
  scaling = dict(scaling_items)
  kind = scaling.get("rope_type", scaling.get("type", "default"))
  base = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  if kind == "default":
    return base.astype(np.float32), 1.0
  if kind == "linear":
    return (base / scaling["factor"]).astype(np.float32), 1.0
  if kind == "llama3":
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_ctx = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / base
    inv = np.where(wavelen > old_ctx / lo, base / factor, base)
    smooth = (old_ctx / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * inv / factor + smooth * inv
    medium = ~(wavelen < old_ctx / hi) & ~(wavelen > old_ctx / lo)
    return np.where(medium, smoothed, inv).astype(np.float32), 1.0
  if kind == "yarn":
    return _yarn(head_dim, theta, scaling, max_pos)
  raise ValueError(f"unsupported rope_type {kind!r} (supported: default, linear, llama3, yarn)")


def _yarn(dim, theta, s, max_pos):
  orig = s["original_max_position_embeddings"]
  factor = s.get("factor") or max_pos / orig
  mscale = lambda scale, m=1.0: 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
  attn = s.get("attention_factor")
  if attn is None:
    if s.get("mscale") and s.get("mscale_all_dim"):
      attn = mscale(factor, s["mscale"]) / mscale(factor, s["mscale_all_dim"])
    else:
      attn = mscale(factor)
  beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1
  corr = lambda rot: dim * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(theta))
  lo, hi = corr(beta_fast), corr(beta_slow)
  if s.get("truncate", True):
    lo, hi = math.floor(lo), math.ceil(hi)
  lo, hi = max(lo, 0), min(hi, dim - 1)
  if lo == hi:
    hi += 0.001
  ramp = np.clip((np.arange(dim // 2, dtype=np.float32) - lo) / (hi - lo), 0, 1)
  pos_freqs = theta ** (np.arange(0, dim, 2, dtype=np.float32) / dim)
  extra = 1 - ramp
  inv = (1.0 / (factor * pos_freqs)) * (1 - extra) + (1.0 / pos_freqs) * extra
  return inv.astype(np.float32), float(attn)


def cos_sin(positions, inv_freq: np.ndarray, mrope_section: tuple[int, ...] | None = None, scaling: float = 1.0):
  """cos/sin of shape [B, T, head_dim] for positions [B, T] (or [3, B, T] with multimodal RoPE sections)."""
  freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [..., B, T, Dh/2]
  if mrope_section is not None:
    if positions.ndim != 3:
      freqs = jnp.broadcast_to(freqs, (3,) + freqs.shape)
    stream = np.repeat(np.arange(len(mrope_section)) % 3, mrope_section)  # which stream each frequency uses
    freqs = jnp.moveaxis(freqs[stream, :, :, np.arange(stream.size)], 0, -1)  # [B, T, F]
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb) * scaling, jnp.sin(emb) * scaling


def apply(x, cos, sin):
  """Rotates x [B, T, H, Dh] with cos/sin [B, T, Dh] (rotate-half layout)."""
  half = x.shape[-1] // 2
  rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  c, s = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
  return x * c + rotated * s
