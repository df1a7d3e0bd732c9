"""Whisper encoder–decoder in Flax NNX, decodable by the m3jax sampler.

The decoder follows the sampler's model protocol `model(tokens, cache, chunk_len) -> (logits, cache)` plus
`init_cache(batch, max_len)`, and `hidden` + `logits` (the sampler's prefill then projects only each row's last
position onto the 51k-token vocabulary). Its cache carries, besides the self-attention K/V, the cross-attention
K/V of every decoder layer: they depend only on the encoder output, so they are projected once per audio segment
(in `init_cache(..., encoder_out=...)`) instead of once per generated token.

Layout choices (each measured on XLA:CPU, see bench/whisper.py):
* the cross-attention K/V are one `[B, H, T, Dh]` array *per layer* (a tuple), not a stacked `[L, ...]` array:
  XLA:CPU materialises every slice of a stacked array, which cost 8 copies of 18 MB per decode step (about half
  of a batch-8 step); heads before time lets the per-token attention read `[T, Dh]` blocks without a transpose;
* self-attention q/k/v are one fused kernel `[D, 3, H, Dh]` (one matmul and one layer-norm read per layer);
* every parameter carries logical axis names (`logical=` metadata, as in `decoder.py`), so `load_whisper(...,
  mesh=...)` places it on its `NamedSharding` and XLA partitions the forward.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

# Logical axes of the cache (the sampler shards the self-attention K/V with the same names as the LLM cache).
SELF_KV_LOGICAL = ("layers", "batch", "seq", "kv_heads", "head_dim")
CROSS_KV_LOGICAL = ("batch", "kv_heads", "seq", "head_dim")


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
    """Builds the config from a Hugging Face WhisperConfig dict (config.json); the two architecture switches of
    WhisperConfig this model does not implement must hold Whisper's values (else the logits would differ)."""
    for key, want in (("activation_function", "gelu"), ("scale_embedding", False)):
      if cfg.get(key, want) != want:
        raise ValueError(f"Whisper config {key}={cfg[key]!r} is not supported (only {want!r})")
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
  cross_k: tuple[Float[Array, "B H T Dh"], ...]  # one array per decoder layer (see the module docstring)
  cross_v: tuple[Float[Array, "B H T Dh"], ...]

  @property
  def max_len(self) -> int:
    return self.k.shape[2]

  def padded(self, max_len: int) -> "WhisperCache":
    """This cache with empty self-attention slots appended up to `max_len`."""
    pad = [(0, 0), (0, 0), (0, max_len - self.max_len), (0, 0), (0, 0)]
    return self.replace(k=jnp.pad(self.k, pad), v=jnp.pad(self.v, pad))


def _param(rngs: nnx.Rngs, shape: tuple[int, ...], cfg: WhisperConfig, logical: tuple, *, fill: float | None = None,
           scale: float = 0.02) -> nnx.Param:
  dtype = jnp.dtype(cfg.param_dtype)
  value = jnp.full(shape, fill, dtype) if fill is not None else scale * jax.random.normal(rngs.params(), shape, dtype)
  return nnx.Param(value, logical=logical)


def _dense(x: Array, w: Array, n_in: int, bias: Array | None = None) -> Array:
  """Contracts the last `n_in` axes of x with the first `n_in` of w as one flat 2-D matmul (+ bias), in x's dtype."""
  lead, ins, outs = x.shape[:x.ndim - n_in], w.shape[:n_in], w.shape[n_in:]
  k = 1
  for s in ins:
    k *= s
  y = jnp.dot(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1), preferred_element_type=jnp.float32)
  y = y.reshape(*lead, *outs)
  if bias is not None:
    y = y + bias.astype(jnp.float32)
  return y.astype(x.dtype)


class LayerNorm(nnx.Module):
  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.scale = _param(rngs, (cfg.d_model,), cfg, ("norm",), fill=1.0)
    self.bias = _param(rngs, (cfg.d_model,), cfg, ("norm",), fill=0.0)

  def __call__(self, x: Float[Array, "... D"]) -> Float[Array, "... D"]:
    xf = x.astype(jnp.float32)
    mean = xf.mean(axis=-1, keepdims=True)
    centred = xf - mean
    var = jnp.mean(centred * centred, axis=-1, keepdims=True)
    y = centred * jax.lax.rsqrt(var + 1e-5) * self.scale[...].astype(jnp.float32) + self.bias[...].astype(jnp.float32)
    return y.astype(x.dtype)


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
                    max_block: int = 750) -> Float[Array, "B T H Dh"]:
  """Unmasked self-attention one (batch, head, query block) at a time.

  The encoder's 1500x1500 score matrices are too big for the CPU caches; computing them in query blocks (exp,
  row sums and the value matmul on the same block) is ~3x faster than the whole-matrix softmax on CPU, and equal
  up to float rounding. Per layer of an 8-window batch on 2 cores: 750-row blocks 198 ms, 500 206 ms, 250 249 ms,
  whole heads 229 ms (torch's SDPA kernel: 193 ms); batching the heads of a block measured slower.
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


class SelfAttention(nnx.Module):
  """Whisper self-attention (q/v biased, k unbiased) with one fused q/k/v kernel [D, 3, H, Dh]."""

  def __init__(self, cfg: WhisperConfig, heads: int, rngs: nnx.Rngs):
    d, dh = cfg.d_model, cfg.d_model // heads
    self.heads, self.head_dim = heads, dh
    self.wqkv = _param(rngs, (d, 3, heads, dh), cfg, ("embed", None, "heads", "head_dim"))
    self.bq = _param(rngs, (heads, dh), cfg, ("heads", "head_dim"), fill=0.0)
    self.bv = _param(rngs, (heads, dh), cfg, ("heads", "head_dim"), fill=0.0)
    self.wo = _param(rngs, (heads, dh, d), cfg, ("heads", "head_dim", "embed"))
    self.bo = _param(rngs, (d,), cfg, ("embed",), fill=0.0)

  def qkv(self, h: Float[Array, "B T D"]):
    """(q pre-scaled, k, v), each [B, T, H, Dh]."""
    qkv = _dense(h, self.wqkv[...], 1)
    q = (qkv[:, :, 0] + self.bq[...].astype(h.dtype)) * (self.head_dim ** -0.5)
    return q, qkv[:, :, 1], qkv[:, :, 2] + self.bv[...].astype(h.dtype)

  def output(self, o: Float[Array, "B T H Dh"]) -> Float[Array, "B T D"]:
    return _dense(o, self.wo[...], 2, self.bo[...])


class CrossAttention(nnx.Module):
  """Decoder→encoder attention: q from the decoder, one fused k/v kernel [D, 2, H, Dh] for the encoder output."""

  def __init__(self, cfg: WhisperConfig, heads: int, rngs: nnx.Rngs):
    d, dh = cfg.d_model, cfg.d_model // heads
    self.heads, self.head_dim = heads, dh
    self.wq = _param(rngs, (d, heads, dh), cfg, ("embed", "heads", "head_dim"))
    self.bq = _param(rngs, (heads, dh), cfg, ("heads", "head_dim"), fill=0.0)
    self.wkv = _param(rngs, (d, 2, heads, dh), cfg, ("embed", None, "heads", "head_dim"))
    self.bv = _param(rngs, (heads, dh), cfg, ("heads", "head_dim"), fill=0.0)
    self.wo = _param(rngs, (heads, dh, d), cfg, ("heads", "head_dim", "embed"))
    self.bo = _param(rngs, (d,), cfg, ("embed",), fill=0.0)

  def query(self, h: Float[Array, "B T D"]) -> Float[Array, "B T H Dh"]:
    return _dense(h, self.wq[...], 1, self.bq[...]) * (self.head_dim ** -0.5)

  def key_value(self, enc: Float[Array, "B S D"]) -> tuple[Float[Array, "B H S Dh"], Float[Array, "B H S Dh"]]:
    """The cached K/V, heads before time."""
    kv = jnp.transpose(_dense(enc, self.wkv[...], 1), (2, 0, 3, 1, 4))  # [2, B, H, S, Dh]
    return kv[0], kv[1] + self.bv[...].astype(enc.dtype)[None, :, None, :]

  def output(self, o: Float[Array, "B T H Dh"]) -> Float[Array, "B T D"]:
    return _dense(o, self.wo[...], 2, self.bo[...])


class MLP(nnx.Module):
  def __init__(self, cfg: WhisperConfig, ffn_dim: int, rngs: nnx.Rngs):
    d = cfg.d_model
    self.w1 = _param(rngs, (d, ffn_dim), cfg, ("embed", "mlp"))
    self.b1 = _param(rngs, (ffn_dim,), cfg, ("mlp",), fill=0.0)
    self.w2 = _param(rngs, (ffn_dim, d), cfg, ("mlp", "embed"))
    self.b2 = _param(rngs, (d,), cfg, ("embed",), fill=0.0)

  def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    return _dense(jax.nn.gelu(_dense(x, self.w1[...], 1, self.b1[...]), approximate=False), self.w2[...], 1,
                  self.b2[...])


class Conv1d(nnx.Module):
  """Width-3, 'same'-padded 1-D convolution over [B, T, C] (kernel [W, C_in, C_out], as flax's nnx.Conv)."""

  def __init__(self, cfg: WhisperConfig, c_in: int, c_out: int, stride: int, rngs: nnx.Rngs):
    self.stride = stride
    self.kernel = _param(rngs, (3, c_in, c_out), cfg, (None, None, "embed"))
    self.bias = _param(rngs, (c_out,), cfg, ("embed",), fill=0.0)

  def __call__(self, x: Float[Array, "B T C"]) -> Float[Array, "B T2 D"]:
    y = jax.lax.conv_general_dilated(x, self.kernel[...].astype(x.dtype), (self.stride,), ((1, 1),),
                                     dimension_numbers=("NWC", "WIO", "NWC"))
    return y + self.bias[...].astype(x.dtype)


class EncoderLayer(nnx.Module):
  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.attn_norm, self.attn = LayerNorm(cfg, rngs), SelfAttention(cfg, cfg.encoder_heads, rngs)
    self.mlp_norm, self.mlp = LayerNorm(cfg, rngs), MLP(cfg, cfg.encoder_ffn_dim, rngs)

  def __call__(self, x: Float[Array, "B T D"]) -> Float[Array, "B T D"]:
    x = x + self.attn.output(_attend_blocked(*self.attn.qkv(self.attn_norm(x))))
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
    self.conv1 = Conv1d(cfg, cfg.num_mel_bins, cfg.d_model, 1, rngs)
    self.conv2 = Conv1d(cfg, cfg.d_model, cfg.d_model, 2, rngs)
    self.positions = nnx.Param(sinusoids(cfg.max_source_positions, cfg.d_model).astype(jnp.dtype(cfg.param_dtype)),
                               logical=("seq", "embed"))
    self.layers = nnx.List([EncoderLayer(cfg, rngs) for _ in range(cfg.encoder_layers)])
    self.norm = LayerNorm(cfg, rngs)

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
    self.self_norm, self.self_attn = LayerNorm(cfg, rngs), SelfAttention(cfg, cfg.decoder_heads, rngs)
    self.cross_norm, self.cross_attn = LayerNorm(cfg, rngs), CrossAttention(cfg, cfg.decoder_heads, rngs)
    self.mlp_norm, self.mlp = LayerNorm(cfg, rngs), MLP(cfg, cfg.decoder_ffn_dim, rngs)


class WhisperDecoder(nnx.Module):
  """Token + learned position embeddings, causal self-attention over the cache, cross-attention, tied head."""

  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs):
    self.cfg = cfg
    self.embed = _param(rngs, (cfg.vocab_size, cfg.d_model), cfg, ("vocab", "embed"))
    self.positions = _param(rngs, (cfg.max_target_positions, cfg.d_model), cfg, ("seq", "embed"), fill=0.0)
    self.layers = nnx.List([DecoderLayer(cfg, rngs) for _ in range(cfg.decoder_layers)])
    self.norm = LayerNorm(cfg, rngs)

  def hidden(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
             ) -> tuple[Float[Array, "B T D"], WhisperCache]:
    """Final-norm hidden states of `tokens` appended at each row's cache offset (padding t >= chunk_len is not
    written to the cache)."""
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
      q, k_new, v_new = layer.self_attn.qkv(layer.self_norm(x))
      k_all = k_all.at[i, rows, slot].set(k_new.astype(k_all.dtype), mode="drop")
      v_all = v_all.at[i, rows, slot].set(v_new.astype(v_all.dtype), mode="drop")
      x = x + layer.self_attn.output(_attend(q, k_all[i].astype(cdt), v_all[i].astype(cdt), self_mask))
      q = layer.cross_attn.query(layer.cross_norm(x))
      o = _attend(q, cache.cross_k[i].astype(cdt), cache.cross_v[i].astype(cdt), None, heads_first=True)
      x = x + layer.cross_attn.output(o)
      x = x + layer.mlp(layer.mlp_norm(x))
    return self.norm(x), cache.replace(k=k_all, v=v_all, length=cache.length + chunk_len)

  def logits(self, h: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    """Tied head: hidden states onto the token embedding (float32 logits)."""
    cdt = jnp.dtype(self.cfg.compute_dtype)
    return jnp.einsum("btd,vd->btv", h.astype(cdt), self.embed[...].astype(cdt), preferred_element_type=jnp.float32)

  def __call__(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
               ) -> tuple[Float[Array, "B T V"], WhisperCache]:
    h, cache = self.hidden(tokens, cache, chunk_len)
    return self.logits(h), cache


class Whisper(nnx.Module):
  """Whisper = encoder + decoder; the instance itself is the sampler-drivable decoder (see module docstring)."""

  def __init__(self, cfg: WhisperConfig, rngs: nnx.Rngs | None = None):
    rngs = rngs if rngs is not None else nnx.Rngs(0)
    self.cfg = cfg
    self.encoder = WhisperEncoder(cfg, rngs)
    self.decoder = WhisperDecoder(cfg, rngs)

  def encode(self, features: Float[Array, "B M F"]) -> Float[Array, "B T D"]:
    return self.encoder(features)

  def cross_kv(self, encoder_out: Float[Array, "B T D"], dtype: Any = None
               ) -> tuple[tuple[Float[Array, "B H T Dh"], ...], tuple[Float[Array, "B H T Dh"], ...]]:
    """Every decoder layer's cross-attention K and V of `encoder_out` (heads before time)."""
    dtype = jnp.dtype(dtype or self.cfg.compute_dtype)
    kv = [layer.cross_attn.key_value(encoder_out) for layer in self.decoder.layers]
    return tuple(k.astype(dtype) for k, _ in kv), tuple(v.astype(dtype) for _, v in kv)

  def init_cache(self, batch: int, max_len: int, dtype: Any = None,
                 encoder_out: Float[Array, "B T D"] | None = None, cross_kv=None) -> WhisperCache:
    """Empty self-attention cache plus the cross-attention K/V of `encoder_out` (projected once here), or the
    precomputed `cross_kv` (a `cross_kv()` result).

    The sampler protocol calls `init_cache(batch, max_len)` without audio; the cross K/V are then zeros of the
    encoder's full length (attention to an all-zero memory), so callers with audio pass `encoder_out`.
    """
    cfg = self.cfg
    if max_len > cfg.max_target_positions:
      raise ValueError(f"Whisper decoder holds at most {cfg.max_target_positions} positions, asked {max_len}")
    dtype = jnp.dtype(dtype or cfg.compute_dtype)
    heads, dh = cfg.decoder_heads, cfg.d_model // cfg.decoder_heads
    zeros = jnp.zeros((cfg.decoder_layers, batch, max_len, heads, dh), dtype)
    if encoder_out is not None:
      if encoder_out.shape[0] != batch:
        raise ValueError(f"encoder_out batch {encoder_out.shape[0]} != cache batch {batch}")
      cross_kv = self.cross_kv(encoder_out, dtype)
    if cross_kv is None:
      cross = jnp.zeros((batch, heads, cfg.max_source_positions, dh), dtype)
      cross_kv = ((cross,) * cfg.decoder_layers,) * 2
    cross_k, cross_v = cross_kv
    if len(cross_k) != cfg.decoder_layers or any(k.shape[0] != batch for k in cross_k):
      raise ValueError(f"cross_kv must hold {cfg.decoder_layers} layers of batch {batch}")
    return WhisperCache(k=zeros, v=zeros, length=jnp.zeros((batch,), jnp.int32), cross_k=tuple(cross_k),
                        cross_v=tuple(cross_v))

  def hidden(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
             ) -> tuple[Float[Array, "B T D"], WhisperCache]:
    return self.decoder.hidden(tokens, cache, chunk_len)

  def logits(self, h: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    return self.decoder.logits(h)

  def __call__(self, tokens: Int[Array, "B T"], cache: WhisperCache, chunk_len: Int[Array, "B"] | None = None
               ) -> tuple[Float[Array, "B T V"], WhisperCache]:
    return self.decoder(tokens, cache, chunk_len)

  def teacher_forced_logits(self, features: Float[Array, "B M F"], tokens: Int[Array, "B T"]) -> Float[Array, "B T V"]:
    """Teacher-forced logits for whole token rows (parity tests, scoring)."""
    cache = self.init_cache(tokens.shape[0], tokens.shape[1], encoder_out=self.encode(features))
    return self(tokens, cache)[0]


def cache_logical_axes(cache: WhisperCache) -> WhisperCache:
  """Logical axis names of every cache array (for `parallel.shard_like`)."""
  cross = (CROSS_KV_LOGICAL,) * len(cache.cross_k)
  return WhisperCache(k=SELF_KV_LOGICAL, v=SELF_KV_LOGICAL, length=("batch",), cross_k=cross, cross_v=cross)
