"""One decoder for the Llama, Mistral, Qwen2 and Qwen3 families (Flax NNX).

Family differences are config flags, not subclasses: Qwen2 has q/k/v biases (`qkv_bias`), Llama/Qwen3 may bias o
too (`o_bias`) and the MLP (`mlp_bias`), Qwen3 RMS-normalises q and k per head (`qk_norm`), Qwen2/Mistral may
attend within a sliding window (`layer_windows`), variants differ in RoPE scaling and activation, and Qwen2.5-Omni's
LM uses multimodal RoPE (`mrope_section`). `from_hf` maps a transformers config through `hf_config`, which refuses
every field it does not implement. Layers are stored stacked (`[layers, ...]`) and run with `lax.scan`, so a
30-layer model compiles once per shape instead of 30 times, and the KV cache is one
`[layers, batch, kv_heads, seq, head_dim]` array pair that the sampler donates between calls (seq next to
head_dim, so a run of slots of one head is contiguous: attention reads key blocks without transposing them).

The cache is slot-addressed per sequence: `cache.length[b]` tokens of row b are already written, new tokens are
appended at that offset (ragged batches, multi-turn continuation) and attend to every slot `<=` their own. Cached
attention reads only the key blocks below the batch's longest fill (`kv_attention`), so a step costs what is
written, not the bucket the cache was padded to. The sampler's CPU decode loop runs on a `LayerKV` instead: each
layer's first W slots as arrays of their own, read whole each step (no slice copies); when it ends only the slots
it filled are written back (`KVCache.with_window`), as a prefill of a few rows (`prefill_subset`) writes back only
its new slots.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from m3jax.models import lora as lora_lib
from m3jax.models import rope as rope_lib
from m3jax.models.causal_attention import causal_attention
from m3jax.models.hf_config import ACTIVATIONS, decoder_kwargs
from m3jax.models.kv_attention import cached_attention, prefill_attention, visible, window_attention

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
_ACT = {"silu": jax.nn.silu, "swish": jax.nn.silu, "gelu": functools.partial(jax.nn.gelu, approximate=False),
        "gelu_new": functools.partial(jax.nn.gelu, approximate=True),
        "gelu_pytorch_tanh": functools.partial(jax.nn.gelu, approximate=True)}


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
  """Architecture + dtype policy. `from_hf` reads a Hugging Face `config.json` dict."""

  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 10000.0
  # RoPE scaling parameters as sorted (key, value) pairs: the config is hashed when jit takes the model's graphdef
  # as a static argument (the sampler), so it holds no dict; a dict passed in is converted in __post_init__
  rope_scaling: tuple[tuple[str, Any], ...] | None = None
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = False
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  qk_norm: bool = False
  hidden_act: str = "silu"
  layer_windows: tuple[int, ...] = ()  # per-layer sliding window (0 = full attention); () = every layer full
  mrope_section: tuple[int, ...] | None = None
  max_position_embeddings: int = 8192
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  remat: bool = False  # recompute each layer in the backward pass (training memory ~ one layer's activations)
  model_type: str = "llama"
  # > 0: queries attend in blocks of this many (without a KV cache `causal_attention`, with one
  # `kv_attention.prefill_attention`), so a long prefill / training sequence never materialises [B, H, T, S]
  # scores; 0 (default) = one block
  attention_chunk: int = 0

  def __post_init__(self):
    if isinstance(self.rope_scaling, dict):
      object.__setattr__(self, "rope_scaling", tuple(sorted(self.rope_scaling.items())) or None)
    object.__setattr__(self, "layer_windows", tuple(int(w) for w in self.layer_windows))
    rope_lib.inv_frequencies(self.head_dim, self.rope_theta, self.rope_scaling, self.max_position_embeddings)
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"hidden_act={self.hidden_act!r}; expected one of {ACTIVATIONS}")
    if self.layer_windows and (len(self.layer_windows) != self.num_layers or min(self.layer_windows) < 0):
      raise ValueError(f"layer_windows={self.layer_windows} needs one window >= 0 per layer ({self.num_layers})")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
    if self.mrope_section is not None and 2 * sum(self.mrope_section) != self.head_dim:
      raise ValueError(f"mrope_section {self.mrope_section} must sum to head_dim/2={self.head_dim // 2}")
    if self.attention_chunk < 0:
      raise ValueError(f"attention_chunk={self.attention_chunk} must be >= 0 (0 = unchunked)")
    for name in ("param_dtype", "compute_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(f"{name}={getattr(self, name)!r}; expected one of {sorted(_DTYPES)}")

  @property
  def dtype(self):
    return _DTYPES[self.compute_dtype]

  @property
  def pdtype(self):
    return _DTYPES[self.param_dtype]

  @classmethod
  def from_hf(cls, hf: dict[str, Any], **overrides) -> "DecoderConfig":
    """Maps a Hugging Face config dict (Llama / Mistral / Qwen2 / Qwen3 / Qwen2.5-Omni text config) to a
    DecoderConfig; raises `hf_config.UnsupportedConfig` naming any field that it would not reproduce exactly."""
    return cls(**{**decoder_kwargs(hf), **overrides})

  def to_hf(self) -> dict[str, Any]:
    """The inverse of `from_hf` (used when saving a Hugging Face directory); refuses a config that its family's
    transformers config cannot express (e.g. a Qwen2 o bias), checked by mapping the result back."""
    rope = {"rope_type": "default", "rope_theta": self.rope_theta, **dict(self.rope_scaling or ())}
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
            "qwen3": "Qwen3ForCausalLM", "smollm3": "SmolLM3ForCausalLM"}
    if self.model_type not in arch:
      raise ValueError(f"model_type {self.model_type!r} cannot be saved as a Hugging Face causal LM")
    hf = {
        "architectures": [arch[self.model_type]], "model_type": self.model_type,
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size, "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads, "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "rope_parameters": rope, "rms_norm_eps": self.rms_norm_eps, "hidden_act": self.hidden_act,
        "tie_word_embeddings": self.tie_embeddings, "max_position_embeddings": self.max_position_embeddings,
        "torch_dtype": "float32"}
    if self.model_type in ("llama", "qwen3", "smollm3"):
      hf["attention_bias"] = self.qkv_bias
    if self.model_type in ("llama", "smollm3"):
      hf["mlp_bias"] = self.mlp_bias
    window = max(self.layer_windows, default=0)
    if self.model_type == "mistral":
      hf["sliding_window"] = window or None
    elif window:
      hf.update(use_sliding_window=True, sliding_window=window,
                layer_types=["sliding_attention" if w else "full_attention" for w in self.layer_windows])
    runtime = {k: getattr(self, k) for k in ("param_dtype", "compute_dtype", "remat", "attention_chunk")}
    if DecoderConfig.from_hf(hf, **runtime) != self:
      raise ValueError(f"this {self.model_type} config (o_bias={self.o_bias}, qkv_bias={self.qkv_bias}, "
                       f"layer_windows={self.layer_windows}) has no exact Hugging Face {self.model_type} form")
    return hf


@flax.struct.dataclass
class KVCache:
  """Per-layer keys/values plus the number of filled slots per sequence."""

  k: Float[Array, "L B K S Dh"]
  v: Float[Array, "L B K S Dh"]
  length: Int[Array, "B"]

  @property
  def max_len(self) -> int:
    return self.k.shape[3]

  def padded(self, max_len: int) -> "KVCache":
    """This cache with empty slots appended up to `max_len`."""
    pad = [(0, 0), (0, 0), (0, 0), (0, max_len - self.max_len), (0, 0)]
    return self.replace(k=jnp.pad(self.k, pad), v=jnp.pad(self.v, pad))

  def take_rows(self, index: Int[Array, "N"]) -> "KVCache":
    """The cache of rows `index` (repeats allowed): forks one prefilled prompt into the rows that share it."""
    return KVCache(self.k[:, index], self.v[:, index], self.length[index])

  def layer_window(self, slots: int) -> "LayerKV":
    """The first `slots` slots of every layer as arrays of their own (`LayerKV`): one copy, made once per decode
    loop, so that each step reads them without slicing."""
    def split(x):
      return tuple(x[i, :, :, :slots] for i in range(x.shape[0]))
    return LayerKV(split(self.k), split(self.v), self.length)

  def with_window(self, kv: "LayerKV", start: Int[Array, "B"], n: int) -> "KVCache":
    """This cache with the slots `kv` filled from `start` on (at most `n` a row: a decode loop's new tokens)
    written back from its per-layer arrays (the inverse of `layer_window` for what the loop changed).

    WHY only those: writing the whole window back (a stack of every layer, then the update) cost 0.6-0.8 s a
    decode call at 32 rows x 768 slots on 2 cores, while a loop of <= n steps changes at most n slots a row."""
    rows = jnp.arange(start.shape[0])[:, None]
    read, write = self._new_slots(start, kv.length, n, kv.max_len)

    def join(x, layers):  # advanced indices split by a slice come first: [B, n, L, K, Dh]
      new = jnp.stack([layer[rows, :, read] for layer in layers], axis=2)
      return x.at[:, rows, :, write].set(new.astype(x.dtype), mode="drop")
    return KVCache(join(self.k, kv.k), join(self.v, kv.v), kv.length)

  def with_rows_filled(self, sub: "KVCache", index: Int[Array, "N"], start: Int[Array, "N"], n: int) -> "KVCache":
    """This cache with the slots that `sub` (its rows `index`, distinct, then prefilled) filled from `start` on,
    at most `n` a row, written back to rows `index`: the rest of those rows is unchanged, so only the new slots
    move, not whole rows."""
    rows = jnp.arange(index.shape[0])[:, None]
    read, write = self._new_slots(start, sub.length, n, sub.max_len)

    def put(x, y):
      return x.at[:, index[:, None], :, write].set(y[:, rows, :, read].astype(x.dtype), mode="drop")
    return KVCache(put(self.k, sub.k), put(self.v, sub.v), self.length.at[index].set(sub.length))

  def _new_slots(self, start, length, n: int, slots: int):
    """(read, write) slot indices [N, n] of the slots [start, length) of each row, at most n: read clamped into
    the source's `slots`, write past this cache's end (dropped) where a row filled fewer than n."""
    pos = start[:, None] + jnp.arange(n)[None]
    return jnp.minimum(pos, slots - 1), jnp.where(pos < length[:, None], pos, self.max_len)


@flax.struct.dataclass
class LayerKV:
  """The decode loop's cache: per layer, keys and values `[B, K, W, Dh]` of the first W slots (`window_attention`).

  WHY: XLA:CPU copies any slice of the stacked cache that a dot reads, every step and layer; separate arrays are
  read in place. Unrolled layers only (`Decoder.hidden(layers=...)`)."""

  k: tuple[Float[Array, "B K W Dh"], ...]
  v: tuple[Float[Array, "B K W Dh"], ...]
  length: Int[Array, "B"]

  @property
  def max_len(self) -> int:
    return self.k[0].shape[2]


def _param(rngs: nnx.Rngs, shape, dtype, logical, *, scale=0.02, fill=None):
  value = jnp.full(shape, fill, dtype) if fill is not None else scale * jax.random.normal(rngs.params(), shape, dtype)
  return nnx.Param(value, logical=logical)


def rms_norm(x: Array, w: Array, eps: float) -> Array:
  """HF RMSNorm: normalise in float32, cast back, then scale."""
  xf = x.astype(jnp.float32)
  y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
  return w.astype(x.dtype) * y.astype(x.dtype)


class Decoder(nnx.Module):
  """Decoder-only transformer; see the module docstring for the cache contract."""

  def __init__(self, cfg: DecoderConfig, *, rngs: nnx.Rngs | None = None):
    rngs = rngs or nnx.Rngs(0)
    c, pd = cfg, cfg.pdtype
    L, D, F, H, K, Dh = c.num_layers, c.hidden_size, c.intermediate_size, c.num_heads, c.num_kv_heads, c.head_dim
    self.cfg = cfg
    self.embed = _param(rngs, (c.vocab_size, D), pd, ("vocab", "embed"))
    self.attn_norm = _param(rngs, (L, D), pd, ("layers", "norm"), fill=1.0)
    self.wq = _param(rngs, (L, D, H, Dh), pd, ("layers", "embed", "heads", "head_dim"))
    self.wk = _param(rngs, (L, D, K, Dh), pd, ("layers", "embed", "kv_heads", "head_dim"))
    self.wv = _param(rngs, (L, D, K, Dh), pd, ("layers", "embed", "kv_heads", "head_dim"))
    self.wo = _param(rngs, (L, H, Dh, D), pd, ("layers", "heads", "head_dim", "embed"))
    if c.o_bias:
      self.bo = _param(rngs, (L, D), pd, ("layers", "embed"))
    if c.qkv_bias:
      self.bq = _param(rngs, (L, H, Dh), pd, ("layers", "heads", "head_dim"))
      self.bk = _param(rngs, (L, K, Dh), pd, ("layers", "kv_heads", "head_dim"))
      self.bv = _param(rngs, (L, K, Dh), pd, ("layers", "kv_heads", "head_dim"))
    if c.qk_norm:
      self.q_norm = _param(rngs, (L, Dh), pd, ("layers", "norm"), fill=1.0)
      self.k_norm = _param(rngs, (L, Dh), pd, ("layers", "norm"), fill=1.0)
    self.mlp_norm = _param(rngs, (L, D), pd, ("layers", "norm"), fill=1.0)
    self.w_gate = _param(rngs, (L, D, F), pd, ("layers", "embed", "mlp"))
    self.w_up = _param(rngs, (L, D, F), pd, ("layers", "embed", "mlp"))
    self.w_down = _param(rngs, (L, F, D), pd, ("layers", "mlp", "embed"))
    if c.mlp_bias:
      self.b_gate = _param(rngs, (L, F), pd, ("layers", "mlp"))
      self.b_up = _param(rngs, (L, F), pd, ("layers", "mlp"))
      self.b_down = _param(rngs, (L, D), pd, ("layers", "embed"))
    self.final_norm = _param(rngs, (D,), pd, ("norm",), fill=1.0)
    if not c.tie_embeddings:
      self.lm_head = _param(rngs, (D, c.vocab_size), pd, ("embed", "vocab"))
    self.lora: lora_lib.LoRA | None = nnx.data(None)  # low-rank adapters (`lora_lib.attach`)

  # ---------------------------------------------------------------------------------------------------- API
  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    c = self.cfg
    shape = (c.num_layers, batch, c.num_kv_heads, max_len, c.head_dim)
    dtype = dtype or c.dtype
    return KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch,), jnp.int32))

  def lm_head_weight(self) -> Float[Array, "D V"]:
    return self.embed[...].T if self.cfg.tie_embeddings else self.lm_head[...]

  def __call__(self, tokens: Int[Array, "B T"], cache: KVCache | None = None, chunk_len: Int[Array, "B"] | None = None,
               positions: Array | None = None, layers: Sequence[dict[str, Any]] | None = None,
               ) -> tuple[Float[Array, "B T V"], KVCache | None]:
    h, cache = self.hidden(tokens, cache, chunk_len, positions, layers=layers,
                           layer_loop="scan" if layers is None else "unroll")
    return self.logits(h), cache

  def logits(self, h: Float[Array, "B T D"]) -> Float[Array, "B T V"]:
    w = self.lm_head_weight().astype(self.cfg.dtype)
    return jnp.einsum("btd,dv->btv", h.astype(self.cfg.dtype), w, preferred_element_type=jnp.float32)

  def embed_tokens(self, tokens: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    return jnp.take(self.embed[...], tokens, axis=0).astype(self.cfg.dtype)

  def hidden(self, tokens: Int[Array, "B T"] | None, cache: KVCache | LayerKV | None = None,
             chunk_len: Int[Array, "B"] | None = None, positions: Array | None = None, *,
             inputs_embeds: Float[Array, "B T D"] | None = None, layer_loop: str = "scan",
             remat: bool | None = None, layers: Sequence[dict[str, Any]] | None = None,
             prefix_kv: tuple[Float[Array, "L B P K Dh"], Float[Array, "L B P K Dh"]] | None = None,
             return_kv: bool = False) -> tuple[Float[Array, "B T D"], Any]:
    """Final-norm hidden states. `inputs_embeds` replaces the token embedding (multimodal merging).

    Without a cache, for training: `return_kv` returns every layer's keys and values `[L, B, T, K, Dh]` in place
    of the cache; `prefix_kv` (such keys and values of P earlier tokens) makes these tokens continue them, at
    positions P.. (the learner's shared prefixes, `m3jax.rl.learner`).

    `layer_loop="scan"` compiles one layer body (deep models, compile time); `"unroll"` lets XLA fuse across
    layers, which makes the backward pass of training ~15-20% faster on small models. `remat` (default
    `cfg.remat`) recomputes each layer in the backward pass. `layers` (unroll only) are the per-layer weights as
    separate arrays (`split_layers`, made once outside jit): a decode step reads each weight once from them, where
    a scan's dynamic slice of the stacked weights, and a static slice too, costs XLA:CPU a copy of every weight per
    step (bench/decode.py's `split_over_scan_b1`: SmolLM2-135M at batch 1).
    """
    x = self.embed_tokens(tokens) if inputs_embeds is None else inputs_embeds.astype(self.cfg.dtype)
    B, T = x.shape[:2]
    chunk_len = jnp.full((B,), T, jnp.int32) if chunk_len is None else chunk_len.astype(jnp.int32)
    if (prefix_kv is not None or return_kv) and cache is not None:
      raise ValueError("prefix_kv and return_kv are for cache-free (training) passes")
    if cache is not None:
      start = cache.length
    else:
      start = jnp.full((B,), 0 if prefix_kv is None else prefix_kv[0].shape[2], jnp.int32)
    slots = start[:, None] + jnp.arange(T, dtype=jnp.int32)[None, :]  # cache slot of every query [B, T]
    if positions is None:
      positions = slots
    c = self.cfg
    inv_freq, rope_scale = rope_lib.inv_frequencies(c.head_dim, c.rope_theta, c.rope_scaling, c.max_position_embeddings)
    cos, sin = rope_lib.cos_sin(positions, inv_freq, c.mrope_section, rope_scale)
    valid_len = start + chunk_len
    layer_params = self._stacked_layer_params() if layers is None else None
    # per-layer sliding windows ride along the layer scan (0 = full); without any, no window mask is built at all
    windows = jnp.asarray(c.layer_windows, jnp.int32) if c.layer_windows else None

    def body(carry, xs):
      x, ck, cv = carry
      p, layer, prefix = xs
      window = None if windows is None else windows[layer]
      x, ck, cv, kv = self._layer(x, p, layer, ck, cv, slots, valid_len, cos, sin, cache is not None, window,
                                  prefix)
      return (x, ck, cv), kv if return_kv else None

    if layer_loop not in ("scan", "unroll") or (layers is not None and layer_loop != "unroll"):
      raise ValueError(f"layer_loop={layer_loop!r}: expected 'scan' or 'unroll' ('unroll' with `layers`)")
    if layers is not None and len(layers) != c.num_layers:
      raise ValueError(f"layers: {len(layers)} given, the model has {c.num_layers}")
    if isinstance(cache, LayerKV):
      if layer_loop != "unroll":
        raise ValueError("a LayerKV cache needs layer_loop='unroll'")
      ks, vs = list(cache.k), list(cache.v)
      for i in range(c.num_layers):
        p = jax.tree.map(lambda v: v[i], layer_params) if layers is None else layers[i]
        window = None if windows is None else windows[i]
        x, ks[i], vs[i], _ = self._layer(x, p, i, ks[i], vs[i], slots, valid_len, cos, sin, True, window)
      return rms_norm(x, self.final_norm[...], c.rms_norm_eps), LayerKV(tuple(ks), tuple(vs), valid_len)
    if self.cfg.remat if remat is None else remat:
      body = jax.checkpoint(body, prevent_cse=layer_loop == "unroll")
    dummy = jnp.zeros((0,), x.dtype)
    carry = (x, dummy, dummy) if cache is None else (x, cache.k, cache.v)
    if layer_loop == "unroll":
      kvs = []
      for i in range(c.num_layers):
        p = jax.tree.map(lambda v: v[i], layer_params) if layers is None else layers[i]
        prefix = None if prefix_kv is None else (prefix_kv[0][i], prefix_kv[1][i])
        carry, kv = body(carry, (p, i, prefix))
        kvs.append(kv)
      kvs = tuple(jnp.stack(a) for a in zip(*kvs)) if return_kv else None
    else:
      carry, kvs = jax.lax.scan(body, carry, (layer_params, jnp.arange(c.num_layers), prefix_kv))
    x, ck, cv = carry
    h = rms_norm(x, self.final_norm[...], self.cfg.rms_norm_eps)
    if return_kv:
      return h, kvs
    return h, None if cache is None else KVCache(ck, cv, valid_len)

  def split_layers(self, fuse: bool = True) -> list[dict[str, Any]]:
    """The layer weights (and adapters) as one dict of separate arrays per layer, for `hidden(layers=...)`; with
    `fuse` and no adapters attached, q/k/v and gate/up as one matrix each (`_fuse_projections`).
    Copies every weight once: call it outside jit, again after the weights change."""
    stacked = self._stacked_layer_params()
    layers = [jax.tree.map(lambda v: jnp.array(v[i]), stacked) for i in range(self.cfg.num_layers)]
    return [_fuse_projections(p) for p in layers] if fuse and self.lora is None else layers

  # ---------------------------------------------------------------------------------------------- internals
  def _stacked_layer_params(self) -> dict[str, Any]:
    params = {k: getattr(self, k)[...] for k in self._layer_keys()}
    if self.lora is not None:
      params.update(self.lora.layer_params())
    return params

  def _layer_keys(self) -> list[str]:
    keys = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down"]
    if self.cfg.qkv_bias:
      keys += ["bq", "bk", "bv"]
    if self.cfg.o_bias:
      keys += ["bo"]
    if self.cfg.mlp_bias:
      keys += ["b_gate", "b_up", "b_down"]
    if self.cfg.qk_norm:
      keys += ["q_norm", "k_norm"]
    return keys

  def _layer(self, x, p, layer, ck, cv, slots, valid_len, cos, sin, use_cache, window, prefix=None):
    """One layer; returns (x, ck, cv, (k, v)): the updated cache arrays and this layer's own keys and values.
    `prefix`: keys and values [B, P, K, Dh] of earlier tokens (not in a cache) these queries also attend."""
    c, dt = self.cfg, self.cfg.dtype

    def mm(x, name, bias, n_in):  # a projection, its bias if any, plus its low-rank adapter where one is attached
      y = dense(x, p[name], n_in, dt)
      y = y if bias not in p else y + p[bias]  # before the adapter: XLA may fuse it into the product
      adapter = p.get("lora_" + name)
      return y if adapter is None else lora_lib.add_delta(y, x, *adapter, n_in, self.lora.cfg.scale, dt)

    h = rms_norm(x, p["attn_norm"], c.rms_norm_eps)
    if "w_qkv" in p:  # `_fuse_projections`
      qkv = mm(h, "w_qkv", "b_qkv", 1)
      q_end, k_end = c.num_heads * c.head_dim, (c.num_heads + c.num_kv_heads) * c.head_dim
      heads = lambda y: y.reshape(*y.shape[:-1], -1, c.head_dim)
      q, k, v = heads(qkv[..., :q_end]), heads(qkv[..., q_end:k_end]), heads(qkv[..., k_end:])
    else:
      q, k, v = mm(h, "wq", "bq", 1), mm(h, "wk", "bk", 1), mm(h, "wv", "bv", 1)
    q, k, v = q.astype(dt), k.astype(dt), v.astype(dt)
    if c.qk_norm:
      q, k = rms_norm(q, p["q_norm"], c.rms_norm_eps), rms_norm(k, p["k_norm"], c.rms_norm_eps)
    q, k = rope_lib.apply(q, cos, sin), rope_lib.apply(k, cos, sin)
    per_layer = use_cache and ck.ndim == 4  # this layer's own [B, K, W, Dh] arrays (LayerKV)
    if use_cache:
      B, T = slots.shape
      rows = jnp.broadcast_to(jnp.arange(B)[:, None], (B, T))
      write = jnp.where(slots < valid_len[:, None], slots, ck.shape[-2])  # padding tokens write nothing
      at = (rows, slice(None), write) if per_layer else (layer, rows, slice(None), write)  # updates [B, T, K, Dh]
      ck = ck.at[at].set(k.astype(ck.dtype), mode="drop")
      cv = cv.at[at].set(v.astype(cv.dtype), mode="drop")
    blocked = c.attention_chunk and q.shape[1] > c.attention_chunk
    if prefix is not None:  # key slots 0..P-1 are the prefix's, P.. these tokens' (queries at slots P..)
      keys = jnp.concatenate([prefix[0].astype(k.dtype), k], axis=1)
      values = jnp.concatenate([prefix[1].astype(v.dtype), v], axis=1)
      if blocked:
        attn = causal_attention(q, keys, values, valid_len, c.attention_chunk, window=window, offset=prefix[0].shape[1])
      else:
        attn = attention(q, keys, values, slots, valid_len, window)
    elif per_layer:
      attn = window_attention(q, ck, cv, slots, valid_len, window)
    elif blocked and not use_cache:
      # without a cache query t is slot t
      attn = causal_attention(q, k, v, valid_len, c.attention_chunk, window=window)
    elif blocked:
      attn = prefill_attention(q, ck, cv, layer, slots, valid_len, c.attention_chunk, window)
    elif use_cache:  # decode and short prefills: only the filled key blocks are read
      attn = cached_attention(q, ck, cv, layer, slots, valid_len, window)
    else:
      attn = attention(q, k, v, slots, valid_len, window)
    x = x + mm(attn, "wo", "bo", 2).astype(dt)
    h = rms_norm(x, p["mlp_norm"], c.rms_norm_eps)
    if "w_gate_up" in p:
      gate, up = jnp.split(mm(h, "w_gate_up", "b_gate_up", 1), 2, axis=-1)
    else:
      gate, up = mm(h, "w_gate", "b_gate", 1), mm(h, "w_up", "b_up", 1)
    down = mm((_ACT[c.hidden_act](gate) * up).astype(dt), "w_down", "b_down", 1)
    x = x + down.astype(dt)
    return x, ck, cv, (k, v)


def _fuse_projections(p: dict[str, Array]) -> dict[str, Array]:
  """One layer's q/k/v and gate/up weights (and biases) concatenated along their outputs: the decode step then runs
  two matmuls where it ran five. At batch 8-32 a row of a decode step is too small for XLA:CPU to keep its cores
  busy, so one wider matmul beats several narrow ones over the same input (bench/decode.py)."""
  p = dict(p)
  d = p["wq"].shape[0]
  flat = lambda name: p.pop(name).reshape(d, -1)
  p["w_qkv"] = jnp.concatenate([flat("wq"), flat("wk"), flat("wv")], axis=-1)
  p["w_gate_up"] = jnp.concatenate([p.pop("w_gate"), p.pop("w_up")], axis=-1)
  if "bq" in p:
    p["b_qkv"] = jnp.concatenate([p.pop(b).reshape(-1) for b in ("bq", "bk", "bv")])
  if "b_gate" in p:
    p["b_gate_up"] = jnp.concatenate([p.pop("b_gate"), p.pop("b_up")])
  return p


def dense(x: Array, w: Array, n_in: int, dtype) -> Array:
  """Contracts the last `n_in` axes of x with the first `n_in` of w as one 2-D matmul (float32 accumulation).

  A flat [tokens, in] @ [in, out] dot: XLA:CPU differentiates it 1.6-1.8x faster than the equivalent 3-D einsum.
  """
  lead, ins, outs = x.shape[:x.ndim - n_in], w.shape[:n_in], w.shape[n_in:]
  k, n = math.prod(ins), math.prod(outs)
  y = jnp.dot(x.reshape(-1, k), w.astype(dtype).reshape(k, n), preferred_element_type=jnp.float32)
  return y.reshape(*lead, *outs)


def key_mask(n_keys: int, q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
             window: Int[Array, ""] | None = None) -> Array:
  """[B, T, S] visibility of all `n_keys` cache slots (`kv_attention.visible`)."""
  return visible(jnp.arange(n_keys), q_slots, valid_len, window)


def attention(q: Float[Array, "B T H Dh"], k: Float[Array, "B S K Dh"], v: Float[Array, "B S K Dh"],
              q_slots: Int[Array, "B T"], valid_len: Int[Array, "B"],
              window: Int[Array, ""] | None = None) -> Float[Array, "B T H Dh"]:
  """Grouped-query attention; query at slot t sees the key slots `key_mask` allows."""
  B, T, H, Dh = q.shape
  K = k.shape[2]
  qg = q.reshape(B, T, K, H // K, Dh)
  scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32) * (Dh ** -0.5)
  mask = key_mask(k.shape[1], q_slots, valid_len, window)
  scores = jnp.where(mask[:, None, None], scores, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
  out = jnp.einsum("bkgts,bskd->btkgd", probs, v, preferred_element_type=jnp.float32)
  return out.reshape(B, T, H, Dh).astype(q.dtype)


def logical_axes(model: nnx.Module) -> Any:
  """The `logical` metadata of every parameter, in the structure of `nnx.state(model, nnx.Param)`."""
  state = nnx.state(model, nnx.Param)
  return jax.tree.map(lambda var: var.get_metadata().get("logical"), state,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))
