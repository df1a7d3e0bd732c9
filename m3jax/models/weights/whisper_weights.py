"""Loads Whisper weights into the Flax model from a Hugging Face directory or a CTranslate2 model.bin.

Both sources go through one HF-named state dict (`ct2.ct2_whisper_to_hf` renames the CT2 tensors), so the
name/shape checks below cover every source. Safetensors are read with `safetensors.numpy` (no torch).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import nnx

from m3jax.models.weights.ct2 import ct2_whisper_to_hf, read_ct2
from m3jax.models.whisper import Attention, Whisper, WhisperConfig


class WhisperWeightsError(ValueError):
  """A weight is missing or has the wrong shape for the configured model."""


def _put(param: nnx.Param, sd: Mapping[str, np.ndarray], key: str, used: set[str], transpose=None) -> None:
  if key not in sd:
    raise WhisperWeightsError(f"Whisper weights lack {key!r}")
  value = np.asarray(sd[key], dtype=np.float32)
  if transpose is not None:
    value = value.transpose(transpose)
  if value.shape != param.shape:
    raise WhisperWeightsError(f"Whisper weight {key!r} has shape {value.shape}, model wants {param.shape}")
  param.set_value(jnp.asarray(value, dtype=param.dtype))
  used.add(key)


def _linear(lin: nnx.Linear, sd, key: str, used: set[str]) -> None:
  _put(lin.kernel, sd, f"{key}.weight", used, (1, 0))
  if lin.bias is not None:
    _put(lin.bias, sd, f"{key}.bias", used)


def _layer_norm(norm: nnx.LayerNorm, sd, key: str, used: set[str]) -> None:
  _put(norm.scale, sd, f"{key}.weight", used)
  _put(norm.bias, sd, f"{key}.bias", used)


def _attention(attn: Attention, sd, key: str, used: set[str]) -> None:
  for name, sub in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("out", "out_proj")):
    _linear(getattr(attn, name), sd, f"{key}.{sub}", used)


def load_state_dict(model: Whisper, sd: Mapping[str, np.ndarray]) -> Whisper:
  """Copies an HF `WhisperForConditionalGeneration` state dict (numpy) into `model` in place."""
  if not any(k.startswith("model.") for k in sd):  # WhisperModel checkpoints have no "model." prefix
    sd = {f"model.{k}": v for k, v in sd.items()}
  used: set[str] = set()
  enc, dec = model.encoder, model.decoder
  for conv in ("conv1", "conv2"):
    _put(getattr(enc, conv).kernel, sd, f"model.encoder.{conv}.weight", used, (2, 1, 0))
    _put(getattr(enc, conv).bias, sd, f"model.encoder.{conv}.bias", used)
  _put(enc.positions, sd, "model.encoder.embed_positions.weight", used)
  _layer_norm(enc.norm, sd, "model.encoder.layer_norm", used)
  for i, layer in enumerate(enc.layers):
    p = f"model.encoder.layers.{i}"
    _attention(layer.attn, sd, f"{p}.self_attn", used)
    _layer_norm(layer.attn_norm, sd, f"{p}.self_attn_layer_norm", used)
    _linear(layer.mlp.fc1, sd, f"{p}.fc1", used)
    _linear(layer.mlp.fc2, sd, f"{p}.fc2", used)
    _layer_norm(layer.mlp_norm, sd, f"{p}.final_layer_norm", used)
  _put(dec.embed, sd, "model.decoder.embed_tokens.weight", used)
  _put(dec.positions, sd, "model.decoder.embed_positions.weight", used)
  _layer_norm(dec.norm, sd, "model.decoder.layer_norm", used)
  for i, layer in enumerate(dec.layers):
    p = f"model.decoder.layers.{i}"
    _attention(layer.self_attn, sd, f"{p}.self_attn", used)
    _layer_norm(layer.self_norm, sd, f"{p}.self_attn_layer_norm", used)
    _attention(layer.cross_attn, sd, f"{p}.encoder_attn", used)
    _layer_norm(layer.cross_norm, sd, f"{p}.encoder_attn_layer_norm", used)
    _linear(layer.mlp.fc1, sd, f"{p}.fc1", used)
    _linear(layer.mlp.fc2, sd, f"{p}.fc2", used)
    _layer_norm(layer.mlp_norm, sd, f"{p}.final_layer_norm", used)
  if "proj_out.weight" in sd and not np.array_equal(sd["proj_out.weight"], sd["model.decoder.embed_tokens.weight"]):
    raise WhisperWeightsError("untied proj_out.weight is not supported (Whisper ties it to the token embedding)")
  return model


def _read_safetensors(directory: pathlib.Path) -> dict[str, np.ndarray]:
  from safetensors.numpy import load_file

  index = directory / "model.safetensors.index.json"
  if index.is_file():
    files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
  else:
    files = [p.name for p in sorted(directory.glob("*.safetensors"))]
  if not files:
    raise FileNotFoundError(f"no *.safetensors in {directory}")
  sd: dict[str, np.ndarray] = {}
  for name in files:
    sd.update(load_file(str(directory / name)))
  return sd


def read_whisper_checkpoint(path: str | pathlib.Path) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
  """(HF config dict, HF state dict) from a CTranslate2 dir/model.bin or an HF safetensors directory."""
  path = pathlib.Path(path)
  if (path.is_file() and path.suffix == ".bin") or (path / "model.bin").is_file():
    spec, tensors = read_ct2(path)
    if spec != "WhisperSpec":
      raise WhisperWeightsError(f"{path} holds a CTranslate2 {spec!r} model, not a WhisperSpec")
    return ct2_whisper_to_hf(tensors)
  if (path / "config.json").is_file():
    return json.loads((path / "config.json").read_text()), _read_safetensors(path)
  raise FileNotFoundError(f"{path} is neither a CTranslate2 model (model.bin) nor an HF Whisper dir (config.json)")


def load_whisper(path: str | pathlib.Path, **config_overrides) -> Whisper:
  """Builds a `Whisper` from a checkpoint directory; `config_overrides` set e.g. `compute_dtype`."""
  hf_config, sd = read_whisper_checkpoint(path)
  cfg = WhisperConfig.from_hf(hf_config, **config_overrides)
  model = nnx.eval_shape(lambda: Whisper(cfg, nnx.Rngs(0)))
  return load_state_dict(model, sd)
