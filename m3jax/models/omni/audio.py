"""Qwen2.5-Omni audio encoder (thinker.audio_tower): Whisper-style, with the Omni specifics.

Log-mels of each audio are cut into chunks of 2*n_window frames (1 s); every chunk runs through conv1 (k3) and
conv2 (k3, stride 2), gets sinusoidal positions *restarting at 0 per chunk*, and attends only within itself. After
the layers the valid frames of each audio are average-pooled by 2 and projected to the LM width, so one LM token
covers 40 ms. We keep the padded [chunks, frames] layout through all layers (a key mask replaces HF's per-chunk
loop) and drop padding once at the end; all chunk/valid/pool indices are planned on the host from the lengths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from m3jax.models.omni.common import FlatParams, layer_norm


@dataclass(frozen=True)
class AudioConfig:
  num_mel_bins: int = 128
  encoder_layers: int = 32
  encoder_attention_heads: int = 20
  encoder_ffn_dim: int = 5120
  d_model: int = 1280
  max_source_positions: int = 1500
  n_window: int = 100
  output_dim: int = 3584
  param_dtype: Any = jnp.float32

  @property
  def head_dim(self) -> int:
    return self.d_model // self.encoder_attention_heads

  @staticmethod
  def from_hf(d: Mapping[str, Any], **overrides) -> "AudioConfig":
    if d.get("activation_function", "gelu") != "gelu" or d.get("scale_embedding", False):
      raise ValueError("only activation_function='gelu' and scale_embedding=False are supported")
    kw = {k: d[k] for k in ("num_mel_bins", "encoder_layers", "encoder_attention_heads", "encoder_ffn_dim",
                            "d_model", "max_source_positions", "n_window", "output_dim")}
    kw.update(overrides)
    return AudioConfig(**kw)


def audio_output_lengths(feature_lens: np.ndarray) -> np.ndarray:
  """LM tokens produced per audio for `feature_lens` mel frames (conv stride 2, then pool 2)."""
  after_conv = (np.asarray(feature_lens) - 1) // 2 + 1
  return (after_conv - 2) // 2 + 1


@flax.struct.dataclass
class AudioPlan:
  """Host-computed indices for one packed batch of audios (depends only on the mel lengths)."""
  frame_index: np.ndarray  # [C, W] column of the packed mel matrix for each chunk frame, -1 = padding
  token_valid: np.ndarray  # [C, W'] bool, chunk frame survives conv2
  valid_flat: np.ndarray  # [Nv] flat indices into [C*W'] of the valid frames
  pool_index: np.ndarray  # [No] first frame of each averaged pair in the valid sequence
  output_lengths: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())


def plan_audio(feature_lens: np.ndarray, cfg: AudioConfig) -> AudioPlan:
  lens = np.asarray(feature_lens, np.int64).reshape(-1)
  if (lens <= 0).any():
    raise ValueError(f"audio feature lengths must be positive, got {lens.tolist()}")
  win = cfg.n_window * 2
  chunk_num = -(-lens // win)
  chunk_len = np.full(int(chunk_num.sum()), win, np.int64)
  tail = np.cumsum(chunk_num) - 1
  chunk_len[tail] = lens % win
  chunk_len = np.where(chunk_len == 0, win, chunk_len)
  starts = np.concatenate([[0], np.cumsum(chunk_len)[:-1]])
  width = int(chunk_len.max())
  cols = np.arange(width)
  frame_index = np.where(cols[None] < chunk_len[:, None], starts[:, None] + cols[None], -1).astype(np.int32)
  after = (chunk_len - 1) // 2 + 1
  width2 = (width - 1) // 2 + 1
  if width2 > cfg.max_source_positions:
    raise ValueError(f"audio chunk of {width2} frames exceeds max_source_positions={cfg.max_source_positions}")
  token_valid = np.arange(width2)[None] < after[:, None]
  valid_flat = np.flatnonzero(token_valid.reshape(-1)).astype(np.int32)
  after_audio = (lens - 1) // 2 + 1
  n_pool = (after_audio - 2) // 2 + 1
  offsets = np.concatenate([[0], np.cumsum(after_audio)[:-1]])
  pool_index = np.concatenate([o + 2 * np.arange(k) for o, k in zip(offsets, n_pool)]).astype(np.int32)
  return AudioPlan(frame_index, token_valid, valid_flat, pool_index, tuple(int(x) for x in n_pool))


AUDIO_LOGICAL: dict[str, tuple[str | None, ...]] = {
    "conv1_w": (None, None, "embed"), "conv1_b": ("norm",), "conv2_w": (None, None, "embed"), "conv2_b": ("norm",),
    "ln1_w": ("layers", "norm"), "ln1_b": ("layers", "norm"), "ln2_w": ("layers", "norm"), "ln2_b": ("layers", "norm"),
    "wq": ("layers", "embed", "heads"), "bq": ("layers", "heads"), "wk": ("layers", "embed", "heads"),
    "wv": ("layers", "embed", "heads"), "bv": ("layers", "heads"), "wo": ("layers", "heads", "embed"),
    "bo": ("layers", "norm"), "fc1_w": ("layers", "embed", "mlp"), "fc1_b": ("layers", "mlp"),
    "fc2_w": ("layers", "mlp", "embed"), "fc2_b": ("layers", "norm"),
    "ln_post_w": ("norm",), "ln_post_b": ("norm",), "proj_w": ("embed", "mlp"), "proj_b": ("norm",),
}
_LAYER_KEYS = ("ln1_w", "ln1_b", "wq", "bq", "wk", "wv", "bv", "wo", "bo", "ln2_w", "ln2_b", "fc1_w", "fc1_b",
               "fc2_w", "fc2_b")
_ONES = ("ln1_w", "ln2_w", "ln_post_w")
_ZEROS = ("conv1_b", "conv2_b", "ln1_b", "ln2_b", "bq", "bv", "bo", "fc1_b", "fc2_b", "ln_post_b", "proj_b")


def _shapes(cfg: AudioConfig) -> dict[str, tuple[int, ...]]:
  L, D, F, M = cfg.encoder_layers, cfg.d_model, cfg.encoder_ffn_dim, cfg.num_mel_bins
  return {"conv1_w": (3, M, D), "conv1_b": (D,), "conv2_w": (3, D, D), "conv2_b": (D,),
          "ln1_w": (L, D), "ln1_b": (L, D), "wq": (L, D, D), "bq": (L, D), "wk": (L, D, D), "wv": (L, D, D),
          "bv": (L, D), "wo": (L, D, D), "bo": (L, D), "ln2_w": (L, D), "ln2_b": (L, D), "fc1_w": (L, D, F),
          "fc1_b": (L, F), "fc2_w": (L, F, D), "fc2_b": (L, D), "ln_post_w": (D,), "ln_post_b": (D,),
          "proj_w": (D, cfg.output_dim), "proj_b": (cfg.output_dim,)}


def init_params(cfg: AudioConfig, key: jax.Array, std: float = 0.02) -> dict[str, jax.Array]:
  out = {}
  for i, (name, shape) in enumerate(sorted(_shapes(cfg).items())):
    if name in _ONES:
      out[name] = jnp.ones(shape, cfg.param_dtype)
    elif name in _ZEROS:
      out[name] = jnp.zeros(shape, cfg.param_dtype)
    else:
      out[name] = (std * jax.random.normal(jax.random.fold_in(key, i), shape)).astype(cfg.param_dtype)
  return out


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
  inc = np.log(max_timescale) / (channels // 2 - 1)
  inv = np.exp(-inc * np.arange(channels // 2, dtype=np.float32)).astype(np.float32)
  t = np.arange(length, dtype=np.float32)[:, None] * inv[None]
  return np.concatenate([np.sin(t), np.cos(t)], axis=1).astype(np.float32)


class AudioEncoder(FlatParams):
  """thinker.audio_tower: packed log-mels [mel, total_frames] + AudioPlan -> tokens [sum(out_lens), output_dim]."""

  _shapes = staticmethod(lambda cfg: _shapes(cfg))
  _init = staticmethod(lambda cfg, key: init_params(cfg, key))

  def __call__(self, features: Float[Array, "M T"], plan: AudioPlan) -> Float[Array, "N O"]:
    return audio_forward(self.params(), self.cfg, features, jnp.asarray(plan.frame_index),
                         jnp.asarray(plan.token_valid), jnp.asarray(plan.valid_flat), jnp.asarray(plan.pool_index))


def _conv(x, w, b, stride: int):
  y = jax.lax.conv_general_dilated(x, w, (stride,), [(1, 1)], dimension_numbers=("NWC", "WIO", "NWC"))
  return y + b


def audio_forward(p: Mapping[str, jax.Array], cfg: AudioConfig, features: Float[Array, "M T"],
                  frame_index: Int[Array, "C W"], token_valid, valid_flat, pool_index) -> jax.Array:
  """Pure function of the weights; plan arrays fix all shapes."""
  dt = p["conv1_w"].dtype
  frames = features.T.astype(dt)  # [T, M]
  mask = (frame_index >= 0)[..., None]
  x = jnp.where(mask, frames[jnp.maximum(frame_index, 0)], 0)  # [C, W, M]
  x = jax.nn.gelu(_conv(x, p["conv1_w"], p["conv1_b"], 1), approximate=False) * mask
  x = jax.nn.gelu(_conv(x, p["conv2_w"], p["conv2_b"], 2), approximate=False)  # [C, W', D]
  c, w2, d = x.shape
  x = x + jnp.asarray(sinusoids(w2, d), dt)[None]
  H, K = cfg.encoder_attention_heads, cfg.head_dim
  key_ok = token_valid[:, None, None, :]

  def layer(h, lp):
    y = layer_norm(h, lp["ln1_w"], lp["ln1_b"])
    q = (y @ lp["wq"] + lp["bq"]).reshape(c, w2, H, K)
    k = (y @ lp["wk"]).reshape(c, w2, H, K)
    v = (y @ lp["wv"] + lp["bv"]).reshape(c, w2, H, K)
    logits = jnp.einsum("clhk,cmhk->chlm", q, k, preferred_element_type=jnp.float32) * K ** -0.5
    probs = jax.nn.softmax(jnp.where(key_ok, logits, jnp.finfo(jnp.float32).min), axis=-1).astype(v.dtype)
    att = jnp.einsum("chlm,cmhk->clhk", probs, v).reshape(c, w2, d)
    h = h + att @ lp["wo"] + lp["bo"]
    y = layer_norm(h, lp["ln2_w"], lp["ln2_b"])
    y = jax.nn.gelu(y @ lp["fc1_w"] + lp["fc1_b"], approximate=False) @ lp["fc2_w"] + lp["fc2_b"]
    return h + y, None

  x, _ = jax.lax.scan(layer, x, {k: p[k] for k in _LAYER_KEYS})
  x = x.reshape(c * w2, d)[valid_flat]
  x = (x[pool_index] + x[pool_index + 1]) / 2
  return layer_norm(x, p["ln_post_w"], p["ln_post_b"]) @ p["proj_w"] + p["proj_b"]
