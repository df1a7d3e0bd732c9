"""Qwen2.5-VL-style vision encoder of Qwen2.5-Omni (thinker.visual).

Patches (3-D: temporal x 14 x 14) -> linear patch embed -> blocks (RMSNorm, 2-D rotary attention, SwiGLU) where
most blocks attend inside 112-px windows and `fullatt_block_indexes` attend over a whole frame -> 2x2 merger.
Tokens are reordered once into window order (at 2x2 merge-unit granularity, so frames stay contiguous), which
makes every attention segment contiguous; the merger output is put back in raster order at the end.
Layers are stacked and run with lax.scan; the window/full choice per layer is a lax.cond on a scanned flag.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float, Int

from m3jax.models.omni.common import FlatParams, SegmentLayout, rms_norm, rotate_half, segment_attention


@dataclass(frozen=True)
class VisionConfig:
  depth: int = 32
  hidden_size: int = 1280
  intermediate_size: int = 3420
  num_heads: int = 16
  in_channels: int = 3
  patch_size: int = 14
  temporal_patch_size: int = 2
  spatial_merge_size: int = 2
  window_size: int = 112
  out_hidden_size: int = 3584
  fullatt_block_indexes: tuple[int, ...] = (7, 15, 23, 31)
  rope_theta: float = 10000.0
  param_dtype: Any = jnp.float32
  attention_chunk: int = 0  # > 0: query blocks of this size in attention (common.segment_attention)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_heads

  @property
  def patch_dim(self) -> int:
    return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

  @staticmethod
  def from_hf(d: Mapping[str, Any], **overrides) -> "VisionConfig":
    rope = d.get("rope_parameters") or {}
    kw = dict(depth=d["depth"], hidden_size=d["hidden_size"], intermediate_size=d["intermediate_size"],
              num_heads=d["num_heads"], in_channels=d.get("in_channels", 3), patch_size=d["patch_size"],
              temporal_patch_size=d["temporal_patch_size"], spatial_merge_size=d["spatial_merge_size"],
              window_size=d["window_size"], out_hidden_size=d["out_hidden_size"],
              fullatt_block_indexes=tuple(d["fullatt_block_indexes"]),
              rope_theta=float(rope.get("rope_theta", d.get("rope_theta", 10000.0))))
    kw.update(overrides)
    return VisionConfig(**kw)


@flax.struct.dataclass
class VisionPlan:
  """Host-computed, shape-static indices for one packed batch of images/videos (depends only on grid_thw)."""
  token_perm: np.ndarray  # [N] raster -> window order
  pos_hw: np.ndarray  # [N, 2] (h, w) rotary positions, window order
  full: SegmentLayout  # per-frame segments
  window: SegmentLayout  # per-window segments
  merged_reverse: np.ndarray  # [N / m^2] window order -> raster order of merged tokens
  split_sizes: tuple[int, ...] = flax.struct.field(pytree_node=False, default=())  # merged tokens per entry


def plan_vision(grid_thw: np.ndarray, cfg: VisionConfig) -> VisionPlan:
  grid_thw = np.asarray(grid_thw, np.int64).reshape(-1, 3)
  m = cfg.spatial_merge_size
  unit = m * m
  win = cfg.window_size // m // cfg.patch_size
  pos, window_index, cu_win, cu_full = [], [], [0], [0]
  offset = 0
  for t, h, w in grid_thw.tolist():
    if h % m or w % m:
      raise ValueError(f"grid h={h}, w={w} must be divisible by spatial_merge_size={m}")
    hh, ww = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    blk = (h // m, m, w // m, m)
    hp = hh.reshape(blk).transpose(0, 2, 1, 3).reshape(-1)
    wp = ww.reshape(blk).transpose(0, 2, 1, 3).reshape(-1)
    pos.append(np.tile(np.stack([hp, wp], -1), (t, 1)))
    lh, lw = h // m, w // m
    idx = np.arange(t * lh * lw).reshape(t, lh, lw)
    ph, pw = win - lh % win, win - lw % win
    padded = np.pad(idx, ((0, 0), (0, ph), (0, pw)), constant_values=-100)
    nh, nw = (lh + ph) // win, (lw + pw) // win
    padded = padded.reshape(t, nh, win, nw, win).transpose(0, 1, 3, 2, 4).reshape(t, nh * nw, win, win)
    seqlens = (padded != -100).sum((2, 3)).reshape(-1)
    flat = padded.reshape(-1)
    window_index.append(flat[flat != -100] + offset)
    cu_win.extend((np.cumsum(seqlens) * unit + cu_win[-1]).tolist())
    cu_full.extend((np.arange(1, t + 1) * h * w + cu_full[-1]).tolist())
    offset += t * lh * lw
  window_index = np.concatenate(window_index)
  token_perm = (window_index[:, None] * unit + np.arange(unit)[None, :]).reshape(-1)
  pos_hw = np.concatenate(pos)[token_perm]
  return VisionPlan(
      token_perm=token_perm.astype(np.int32), pos_hw=pos_hw.astype(np.int32),
      full=SegmentLayout.from_cu_seqlens(np.asarray(cu_full)), window=SegmentLayout.from_cu_seqlens(np.asarray(cu_win)),
      merged_reverse=np.argsort(window_index).astype(np.int32),
      split_sizes=tuple(int(x) for x in (grid_thw.prod(-1) // unit)))


# logical sharding axes of every parameter (leading "layers" axis for stacked block weights)
VISION_LOGICAL: dict[str, tuple[str | None, ...]] = {
    "patch_embed": ("norm", "embed"),
    "norm1": ("layers", "norm"), "norm2": ("layers", "norm"),
    "wq": ("layers", "embed", "heads"), "wk": ("layers", "embed", "heads"), "wv": ("layers", "embed", "heads"),
    "bq": ("layers", "heads"), "bk": ("layers", "heads"), "bv": ("layers", "heads"),
    "wo": ("layers", "heads", "embed"), "bo": ("layers", "norm"),
    "w_gate": ("layers", "embed", "mlp"), "b_gate": ("layers", "mlp"),
    "w_up": ("layers", "embed", "mlp"), "b_up": ("layers", "mlp"),
    "w_down": ("layers", "mlp", "embed"), "b_down": ("layers", "norm"),
    "merger_ln": ("norm",), "merger_w1": ("embed", "mlp"), "merger_b1": ("mlp",),
    "merger_w2": ("mlp", "embed"), "merger_b2": ("norm",),
}

_BLOCK_KEYS = ("norm1", "norm2", "wq", "wk", "wv", "bq", "bk", "bv", "wo", "bo",
               "w_gate", "b_gate", "w_up", "b_up", "w_down", "b_down")


_BIASES = ("bq", "bk", "bv", "bo", "b_gate", "b_up", "b_down", "merger_b1", "merger_b2")


def _shapes(cfg: VisionConfig) -> dict[str, tuple[int, ...]]:
  L, D, F, M = cfg.depth, cfg.hidden_size, cfg.intermediate_size, cfg.hidden_size * cfg.spatial_merge_size ** 2
  return {"patch_embed": (cfg.patch_dim, D), "norm1": (L, D), "norm2": (L, D),
          "wq": (L, D, D), "wk": (L, D, D), "wv": (L, D, D), "bq": (L, D), "bk": (L, D), "bv": (L, D),
          "wo": (L, D, D), "bo": (L, D), "w_gate": (L, D, F), "b_gate": (L, F), "w_up": (L, D, F), "b_up": (L, F),
          "w_down": (L, F, D), "b_down": (L, D), "merger_ln": (D,), "merger_w1": (M, M), "merger_b1": (M,),
          "merger_w2": (M, cfg.out_hidden_size), "merger_b2": (cfg.out_hidden_size,)}


def init_params(cfg: VisionConfig, key: jax.Array, std: float = 0.02) -> dict[str, jax.Array]:
  """Random weights (norm scales = 1, biases = 0) for tests and from-scratch training."""
  out = {}
  for i, (name, shape) in enumerate(sorted(_shapes(cfg).items())):
    if name in ("norm1", "norm2", "merger_ln"):
      out[name] = jnp.ones(shape, cfg.param_dtype)
    elif name in _BIASES:
      out[name] = jnp.zeros(shape, cfg.param_dtype)
    else:
      out[name] = (std * jax.random.normal(jax.random.fold_in(key, i), shape)).astype(cfg.param_dtype)
  return out


class VisionEncoder(FlatParams):
  """thinker.visual: pixel patches [N, C*tp*p*p] + VisionPlan -> merged tokens [N/4, out_hidden_size]."""

  _shapes = staticmethod(lambda cfg: _shapes(cfg))
  _init = staticmethod(lambda cfg, key: init_params(cfg, key))

  def __call__(self, patches: Float[Array, "N P"], plan: VisionPlan) -> Float[Array, "M O"]:
    return vision_forward(self.params(), self.cfg, patches, jnp.asarray(plan.token_perm), jnp.asarray(plan.pos_hw),
                          jnp.asarray(plan.full.index), jnp.asarray(plan.full.inverse),
                          jnp.asarray(plan.window.index), jnp.asarray(plan.window.inverse),
                          jnp.asarray(plan.merged_reverse))


def _rotary(pos_hw: Int[Array, "N 2"], cfg: VisionConfig) -> tuple[Float[Array, "N K"], Float[Array, "N K"]]:
  quarter = cfg.head_dim // 2
  inv_freq = 1.0 / (cfg.rope_theta ** (jnp.arange(0, quarter, 2, dtype=jnp.float32) / quarter))
  freqs = pos_hw.astype(jnp.float32)[..., None] * inv_freq  # [N, 2, K/4]
  ang = jnp.concatenate([freqs[:, 0], freqs[:, 1]], axis=-1)
  ang = jnp.concatenate([ang, ang], axis=-1)
  return jnp.cos(ang), jnp.sin(ang)


def vision_forward(p: Mapping[str, jax.Array], cfg: VisionConfig, patches, token_perm, pos_hw, full_index,
                   full_inverse, win_index, win_inverse, merged_reverse) -> jax.Array:
  """Pure function of the weights (jit/grad friendly); the plan arrays fix all shapes."""
  n = patches.shape[0]
  H, K = cfg.num_heads, cfg.head_dim
  x = patches.astype(p["patch_embed"].dtype) @ p["patch_embed"]
  x = x[token_perm]
  cos, sin = _rotary(pos_hw, cfg)
  cos, sin = cos[:, None, :], sin[:, None, :]
  is_full = jnp.isin(jnp.arange(cfg.depth), jnp.asarray(cfg.fullatt_block_indexes, jnp.int32))
  scale = K ** -0.5

  def block(h, lp):
    w, full = lp
    y = rms_norm(h, w["norm1"], 1e-6)
    q = (y @ w["wq"] + w["bq"]).reshape(n, H, K)
    k = (y @ w["wk"] + w["bk"]).reshape(n, H, K)
    v = (y @ w["wv"] + w["bv"]).reshape(n, H, K)
    qf, kf = q.astype(jnp.float32), k.astype(jnp.float32)
    q = (qf * cos + rotate_half(qf) * sin).astype(q.dtype)
    k = (kf * cos + rotate_half(kf) * sin).astype(k.dtype)
    chunk = cfg.attention_chunk
    att = jax.lax.cond(full, lambda: segment_attention(q, k, v, full_index, full_inverse, scale, chunk),
                       lambda: segment_attention(q, k, v, win_index, win_inverse, scale, chunk))
    h = h + att.reshape(n, H * K) @ w["wo"] + w["bo"]
    y = rms_norm(h, w["norm2"], 1e-6)
    y = jax.nn.silu(y @ w["w_gate"] + w["b_gate"]) * (y @ w["w_up"] + w["b_up"])
    return h + y @ w["w_down"] + w["b_down"], None

  x, _ = jax.lax.scan(block, x, ({k: p[k] for k in _BLOCK_KEYS}, is_full))
  unit = cfg.spatial_merge_size ** 2
  y = rms_norm(x, p["merger_ln"], 1e-6).reshape(n // unit, unit * cfg.hidden_size)
  y = jax.nn.gelu(y @ p["merger_w1"] + p["merger_b1"], approximate=False)
  y = y @ p["merger_w2"] + p["merger_b2"]
  return y[merged_reverse]
