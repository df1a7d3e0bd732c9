"""Whisper encoder–decoder in Flax NNX, decodable by the m3jax sampler.

The decoder follows the sampler's model protocol `model(tokens, cache, chunk_len) -> (logits, cache)` plus
`init_cache(batch, max_len)`. Its cache carries, besides the self-attention K/V, the cross-attention K/V of every
decoder layer: they depend only on the encoder output, so they are projected once per audio segment (in
`init_cache(..., encoder_out=...)`) instead of once per generated token.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int


@dataclasses.dataclass(frozen=True)
class WhisperConfig:
  vocab_size: int = 51864
  num_mel_bins: int = 80
  d_model: int = 384
  encoder_layers: int = 4
  decoder_layers: int = 4
  encoder_heads: int = 6
  decoder_heads: int = 6
  encoder_ffn_dim: int = 1536
  decoder_ffn_dim: int = 1536
  max_source_positions: int = 1500
  max_target_positions: int = 448
  eos_token_id: int = 50256
  decoder_start_token_id: int = 50257
  param_dtype: str = "float32"
  compute_dtype: str = "float32"

  def __post_init__(self):
    for name in ("d_model", "vocab_size", "num_mel_bins", "max_source_positions", "max_target_positions"):
      if getattr(self, name) <= 0:
        raise ValueError(f"WhisperConfig.{name} must be positive, got {getattr(self, name)}")
    for heads in (self.encoder_heads, self.decoder_heads):
      if heads <= 0 or self.d_model % heads:
        raise ValueError(f"WhisperConfig: d_model={self.d_model} is not divisible by heads={heads}")

  @property
  def n_frames(self) -> int:
    """Mel frames the encoder takes (the stride-2 conv halves them to max_source_positions)."""
    return 2 * self.max_source_positions

  @classmethod
  def from_hf(cls, cfg: Mapping[str, Any], **overrides) -> "WhisperConfig":
    """Builds the config from a Hugging Face WhisperConfig dict (config.json)."""
    return cls(
        vocab_size=cfg["vocab_size"], num_mel_bins=cfg["num_mel_bins"], d_model=cfg["d_model"],
        encoder_layers=cfg["encoder_layers"], decoder_layers=cfg["decoder_layers"],
        encoder_heads=cfg["encoder_attention_heads"], decoder_heads=cfg["decoder_attention_heads"],
        encoder_ffn_dim=cfg["encoder_ffn_dim"], decoder_ffn_dim=cfg["decoder_ffn_dim"],
        max_source_positions=cfg["max_source_positions"], max_target_positions=cfg["max_target_positions"],
        eos_token_id=cfg.get("eos_token_id", 50256), decoder_start_token_id=cfg.get("decoder_start_token_id", 50257),
        **overrides)


@flax.struct.dataclass
class WhisperCache:
  """Decoder state: self-attention K/V written at `length` per sequence, plus the fixed cross-attention K/V."""
  k: Float[Array, "L B S H Dh"]
  v: Float[Array, "L B S H Dh"]
  length: Int[Array, "B"]
  cross_k: Float[Array, "L B H T Dh"]  # heads before time: the per-token cross-attention then reads
  cross_v: Float[Array, "L B H T Dh"]  # [T, Dh] blocks contiguously instead of transposing 1500 rows per step


def _dense(cfg: WhisperConfig, d_in: int, d_out: int, rngs: nnx.Rngs, bias: bool = True) -> nnx.Linear:
  return nnx.Linear(d_in, d_out, use_bias=bias, param_dtype=jnp.dtype(cfg.param_dtype),
                    dtype=jnp.dtype(cfg.compute_dtype), rngs=rngs)


def _norm(cfg: WhisperConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
  return nnx.LayerNorm(cfg.d_model, epsilon=1e-5, param_dtype=jnp.dtype(cfg.param_dtype),
                       dtype=jnp.dtype(cfg.compute_dtype), rngs=rngs)


def _attend(q: Float[Array, "B T H Dh"], k: Float[Array, "B S H Dh"], v: Float[Array, "B S H Dh"],
            mask: jax.Array | None, heads_first: bool = False) -> Float[Array, "B T H Dh"]:
  """Softmax attention in float32 (q is pre-scaled); `mask` broadcasts to [B, T, S], True = may attend.
  With `heads_first`, k and v are laid out [B, H, S, Dh]."""
  kv = "bhsd" if heads_first else "bshd"
  scores = jnp.einsum(f"bthd,{kv}->bhts", q, k, preferred_element_type=jnp.float32)
  if mask is not None:
    scores = jnp.where(mask[:, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  return jnp.einsum(f"bhts,{kv}->bthd", probs, v)


def _attend_blocked(q: Float[Array, "B T H Dh"], k: Float[Array, "B T H Dh"], v: Float[Array, "B T H Dh"],
                    max_block: int = 256) -> Float[Array, "B T H Dh"]:
  """Unmasked self-attention one (batch, head, query block) at a time.

  The encoder's 1500x1500 score matrices are too big for the CPU caches; computing them in query blocks that
  stay in cache (exp, row sums and the value matmul on the same block) is ~3x faster than the whole-matrix
  softmax on CPU, and equal up to float rounding.
  """
  b, t, h, d = q.shape
  block = max(c for c in range(1, min(t, max_block) + 1) if t % c == 0)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2).reshape(b * h, t, d)
  qs = heads_first(q).reshape(b * h, t // block, block, d)

  def one_block(q_blk: Float[Array, "C Dh"], k_bh: Float[Array, "T Dh"], v_bh: Float[Array, "T Dh"]):
    s = jnp.dot(q_blk, k_bh.T, preferred_element_type=jnp.float32)
    e = jnp.exp(s - s.max(axis=-1, keepdims=True))
    return (jnp.dot(e.astype(v_bh.dtype), v_bh) / e.sum(axis=-1, keepdims=True)).astype(v_bh.dtype)

  def one_head(args):
    q_bh, k_bh, v_bh = args
    return jax.lax.map(lambda q_blk: one_block(q_blk, k_bh, v_bh), q_bh)

  out = jax.lax.map(one_head, (qs, heads_first(k), heads_first(v)))
  return jnp.swapaxes(out.reshape(b, h, t, d), 1, 2)


class Attention(nnx.Module):
  """Multi-head attention with Whisper's bias layout (k has no bias); split into project/attend for caching."""

  def __init__(self, cfg: WhisperConfig, heads: int, rngs: nnx.Rngs):
    d = cfg.d_model
    self.heads, self.head_dim = heads, d // heads
    self.q = _dense(cfg, d, d, rngs)
    self.k = _dense(cfg, d, d, rngs, bias=False)
    self.v = _dense(cfg, d, d, rngs)
    self.out = _dense(cfg, d, d, rngs)

  def _heads(self, x: Float[Array, "B T D"]) -> Float[Array, "B T H Dh"]:
    return x.reshape(*x.shape[:2], self.heads, self.head_dim)

  def query(self, x: Float[Array, "B T D"]) -> Float[Array, "B T H Dh"]:
    return self._heads(self.q(x)) * (self.head_dim ** -0.5)

  def key_value(self, x: Float[Array, "B S D"]) -> tuple[Float[Array, "B S H Dh"], Float[Array, "B S H Dh"]]:
    return self._heads(self.k(x)), self._heads(self.v(x))

  def output(self, o: Float[Array, "B T H Dh"]) -> Float[Array, "B T D"]:
    return self.out(o.reshape(*o.shape[:2], -1))


class _MLP(nnx.Module):
  def __init__(self, cfg: WhisperConfig, ffn_dim: int, rngs: nnx.Rngs):
    self.fc1 = _dense(cfg, cfg.d_model, ffn_dim, rngs)
    self.fc2 = _dense(cfg, ffn_dim, cfg.d_model, rngs)

  def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    return self.fc2(jax.nn.gelu(self.fc1(x), approximate=False))


class EncoderLayer(nnx.Module):
  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.attn_norm, self.attn = _norm(cfg, rngs), Attention(cfg, cfg.encoder_heads, rngs)
    self.mlp_norm, self.mlp = _norm(cfg, rngs), _MLP(cfg, cfg.encoder_ffn_dim, rngs)

  def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    h = self.attn_norm(x)
    x = x + self.attn.output(_attend_blocked(self.attn.query(h), *self.attn.key_value(h)))
    return x + self.mlp(self.mlp_norm(x))


def sinusoids(length: int, channels: int) -> Float[Array, "T D"]:
  """Whisper's fixed encoder position table (checkpoints store it; used for freshly initialised models)."""
  inc = jnp.log(10000.0) / (channels // 2 - 1)
  scaled = jnp.arange(length)[:, None] * jnp.exp(-inc * jnp.arange(channels // 2))[None, :]
  return jnp.concatenate([jnp.sin(scaled), jnp.cos(scaled)], axis=1)


class WhisperEncoder(nnx.Module):
  """Two GELU convolutions (the second halves time) + learned/sinusoidal positions + pre-norm transformer."""

  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    kw = dict(kernel_size=3, padding=((1, 1),), param_dtype=jnp.dtype(cfg.param_dtype),
              dtype=jnp.dtype(cfg.compute_dtype), rngs=rngs)
    self.conv1 = nnx.Conv(cfg.num_mel_bins, cfg.d_model, strides=1, **kw)
    self.conv2 = nnx.Conv(cfg.d_model, cfg.d_model, strides=2, **kw)
    self.positions = nnx.Param(sinusoids(cfg.max_source_positions, cfg.d_model).astype(jnp.dtype(cfg.param_dtype)))
    self.layers = nnx.List([EncoderLayer(cfg, rngs) for _ in range(cfg.encoder_layers)])
    self.norm = _norm(cfg, rngs)

  def __call__(self, features: Float[Array, "B M F"]) -> Float[Array, "B T D"]:
    cfg = self.cfg
    if features.ndim != 3 or features.shape[1:] != (cfg.num_mel_bins, cfg.n_frames):
      raise ValueError(f"Whisper encoder expects features [B, {cfg.num_mel_bins}, {cfg.n_frames}], "
                       f"got {tuple(features.shape)}")
    x = jnp.swapaxes(features, 1, 2).astype(jnp.dtype(cfg.compute_dtype))
    x = jax.nn.gelu(self.conv1(x), approximate=False)
    x = jax.nn.gelu(self.conv2(x), approximate=False)
    x = x + self.positions[...].astype(x.dtype)
    for layer in self.layers:
      x = layer(x)
    return self.norm(x)


class DecoderLayer(nnx.Module):
  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.self_norm, self.self_attn = _norm(cfg, rngs), Attention(cfg, cfg.decoder_heads, rngs)
    self.cross_norm, self.cross_attn = _norm(cfg, rngs), Attention(cfg, cfg.decoder_heads, rngs)
    self.mlp_norm, self.mlp = _norm(cfg, rngs), _MLP(cfg, cfg.decoder_ffn_dim, rngs)


class WhisperDecoder(nnx.Module):
  """Token + learned position embeddings, causal self-attention over the cache, cross-attention, tied head."""

  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    dt = jnp.dtype(cfg.param_dtype)
    self.embed = nnx.Param(jax.random.normal(rngs.params(), (cfg.vocab_size, cfg.d_model), dt) * 0.02)
    self.positions = nnx.Param(jnp.zeros((cfg.max_target_positions, cfg.d_model), dt))
    self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.decoder_layers)])
    self.norm = _norm(cfg, rngs)

  def __call__(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
               ) -> tuple[Float[Array, "B T V"], WhisperCache]:
    cfg = self.cfg
    batch, steps = tokens.shape
    max_len = cache.k.shape[2]
    if chunk_len is None:
      chunk_len = jnp.full((batch,), steps, jnp.int32)
    t = jnp.arange(steps, dtype=jnp.int32)[None, :]
    pos = cache.length[:, None] + t  # [B, T] absolute positions of the new tokens
    # Padding tokens (t >= chunk_len) get an out-of-range slot so the scatter drops them.
    slot = jnp.where(t < chunk_len[:, None], pos, max_len)
    rows = jnp.arange(batch)[:, None]
    self_mask = jnp.arange(max_len)[None, None, :] <= pos[:, :, None]  # [B, T, S] causal over the cache
    cdt = jnp.dtype(cfg.compute_dtype)
    x = (jnp.take(self.embed[...], tokens, axis=0) +
         jnp.take(self.positions[...], pos, axis=0, mode="clip")).astype(cdt)
    k_all, v_all = cache.k, cache.v
    for i, layer in enumerate(self.layers):
      h = layer.self_norm(x)
      k_new, v_new = layer.self_attn.key_value(h)
      k_all = k_all.at[i, rows, slot].set(k_new.astype(k_all.dtype), mode="drop")
      v_all = v_all.at[i, rows, slot].set(v_new.astype(v_all.dtype), mode="drop")
      o = _attend(layer.self_attn.query(h), k_all[i].astype(cdt), v_all[i].astype(cdt), self_mask)
      x = x + layer.self_attn.output(o)
      h = layer.cross_norm(x)
      o = _attend(layer.cross_attn.query(h), cache.cross_k[i].astype(cdt), cache.cross_v[i].astype(cdt), None,
                  heads_first=True)
      x = x + layer.cross_attn.output(o)
      x = x + layer.mlp(layer.mlp_norm(x))
    h = self.norm(x)
    logits = jnp.einsum("btd,vd->btv", h, self.embed[...].astype(cdt), preferred_element_type=jnp.float32)
    new_cache = cache.replace(k=k_all, v=v_all, length=cache.length + chunk_len)
    return logits, new_cache


class Whisper(nnx.Module):
  """Whisper = encoder + decoder; the instance itself is the sampler-drivable decoder (see module docstring)."""

  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.cfg = cfg
    self.encoder = WhisperEncoder(cfg, rngs)
    self.decoder = WhisperDecoder(cfg, rngs)

  def encode(self, features: Float[Array, "B M F"]) -> Float[Array, "B T D"]:
    return self.encoder(features)

  def init_cache(self, batch: int, max_len: int, dtype: Any = None,
                 encoder_out: Float[Array, "B T D"] | None = None) -> WhisperCache:
    """Empty self-attention cache plus the cross-attention K/V of `encoder_out`, projected once here.

    The sampler protocol calls `init_cache(batch, max_len)` without audio; the cross K/V are then zeros of the
    encoder's full length (attention to an all-zero memory), so callers with audio pass `encoder_out`.
    """
    cfg = self.cfg
    if max_len > cfg.max_target_positions:
      raise ValueError(f"Whisper decoder holds at most {cfg.max_target_positions} positions, asked {max_len}")
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    heads, dh = cfg.decoder_heads, cfg.d_model // cfg.decoder_heads
    zeros = jnp.zeros((cfg.decoder_layers, batch, max_len, heads, dh), dtype)
    if encoder_out is None:
      cross = jnp.zeros((cfg.decoder_layers, batch, heads, cfg.max_source_positions, dh), dtype)
      cross_k = cross_v = cross
    else:
      if encoder_out.shape[0] != batch:
        raise ValueError(f"encoder_out batch {encoder_out.shape[0]} != cache batch {batch}")
      kv = [layer.cross_attn.key_value(encoder_out) for layer in self.decoder.layers]
      cross_k = jnp.stack([jnp.swapaxes(k, 1, 2) for k, _ in kv]).astype(dtype)
      cross_v = jnp.stack([jnp.swapaxes(v, 1, 2) for _, v in kv]).astype(dtype)
    return WhisperCache(k=zeros, v=zeros, length=jnp.zeros((batch,), jnp.int32), cross_k=cross_k, cross_v=cross_v)

  def __call__(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
               ) -> tuple[Float[Array, "B T V"], WhisperCache]:
    return self.decoder(tokens, cache, chunk_len)

  def teacher_forced_logits(self, features: Float[Array, "B M F"], tokens: Int[Array, "B T"]) -> Float[Array, "B T V"]:
    """Teacher-forced logits for whole token rows (parity tests, scoring)."""
    cache = self.init_cache(tokens.shape[0], tokens.shape[1], encoder_out=self.encode(features))
    return self(tokens, cache)[0]
