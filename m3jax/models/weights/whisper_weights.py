"""Loads Whisper weights into the Flax model from a Hugging Face directory or a CTranslate2 model.bin.

Both sources go through one HF-named state dict (`ct2.ct2_whisper_to_hf` renames the CT2 tensors), so the
name/shape checks below cover every source, and a tensor the model does not read fails the load naming it.
Safetensors are read with `safetensors.numpy` (no torch).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from m3jax.models.weights.ct2 import ct2_whisper_to_hf, read_ct2
from m3jax.models.whisper import CrossAttention, LayerNorm, MLP, SelfAttention, Whisper, WhisperConfig
from m3jax.parallel import named_sharding


class WhisperWeightsError(ValueError):
  """A weight is missing or has the wrong shape for the configured model."""


def _place(param: nnx.Param, value: np.ndarray, key: str, mesh: Mesh | None) -> None:
  if value.shape != tuple(param.shape):
    raise WhisperWeightsError(f"Whisper weight {key!r} has shape {value.shape}, model wants {tuple(param.shape)}")
  value = value.astype(param.dtype)
  if mesh is None:
    param.set_value(jnp.asarray(value))
  else:
    param.set_value(jax.device_put(value, named_sharding(mesh, param.get_metadata()["logical"], value.shape)))


class _Reader:
  """HF-named numpy tensors, checked for presence and shape, converted to the model's layouts."""

  def __init__(self, sd: Mapping[str, np.ndarray], mesh: Mesh | None):
    self.sd, self.mesh, self.used = sd, mesh, set()

  def get(self, key: str) -> np.ndarray:
    if key not in self.sd:
      raise WhisperWeightsError(f"Whisper weights lack {key!r}")
    self.used.add(key)
    return np.asarray(self.sd[key], dtype=np.float32)

  def put(self, param: nnx.Param, key: str, transform=None) -> None:
    value = self.get(key)
    if transform is not None:
      try:
        value = transform(value)
      except ValueError as e:  # a reshape that does not fit: report the tensor, not numpy's message
        raise WhisperWeightsError(f"Whisper weight {key!r} of shape {self.sd[key].shape} does not fit "
                                  f"{tuple(param.shape)}") from e
    _place(param, np.ascontiguousarray(value), key, self.mesh)

  def layer_norm(self, norm: LayerNorm, key: str) -> None:
    self.put(norm.scale, f"{key}.weight")
    self.put(norm.bias, f"{key}.bias")

  def no_k_bias(self, key: str) -> None:
    """Whisper's k projection has no bias; a checkpoint that stores one must store zeros (CT2 does)."""
    bias = self.sd.get(f"{key}.k_proj.bias")
    if bias is not None:
      if np.any(np.asarray(bias) != 0):
        raise WhisperWeightsError(f"{key}.k_proj.bias is non-zero; Whisper's k projection has no bias")
      self.used.add(f"{key}.k_proj.bias")

  def self_attention(self, attn: SelfAttention, key: str) -> None:
    h, dh = attn.heads, attn.head_dim
    w = [self.get(f"{key}.{p}_proj.weight") for p in "qkv"]  # [out, in] each
    if any(x.shape != w[0].shape for x in w) or w[0].shape[0] != h * dh:
      raise WhisperWeightsError(f"{key} q/k/v weights have shapes {[x.shape for x in w]}, model wants "
                                f"{(h * dh, attn.wqkv.shape[0])} each")
    _place(attn.wqkv, np.ascontiguousarray(np.stack([x.T.reshape(-1, h, dh) for x in w], axis=1)), key, self.mesh)
    self.no_k_bias(key)
    self.put(attn.bq, f"{key}.q_proj.bias", lambda b: b.reshape(h, dh))
    self.put(attn.bv, f"{key}.v_proj.bias", lambda b: b.reshape(h, dh))
    self.put(attn.wo, f"{key}.out_proj.weight", lambda x: x.T.reshape(h, dh, -1))
    self.put(attn.bo, f"{key}.out_proj.bias")

  def cross_attention(self, attn: CrossAttention, key: str) -> None:
    h, dh = attn.heads, attn.head_dim
    self.put(attn.wq, f"{key}.q_proj.weight", lambda x: x.T.reshape(-1, h, dh))
    self.put(attn.bq, f"{key}.q_proj.bias", lambda b: b.reshape(h, dh))
    wk, wv = self.get(f"{key}.k_proj.weight"), self.get(f"{key}.v_proj.weight")
    if wk.shape != wv.shape or wk.shape[0] != h * dh:
      raise WhisperWeightsError(f"{key} k/v weights have shapes {wk.shape}, {wv.shape}; model wants "
                                f"{(h * dh, attn.wkv.shape[0])} each")
    _place(attn.wkv, np.ascontiguousarray(np.stack([x.T.reshape(-1, h, dh) for x in (wk, wv)], axis=1)), key,
           self.mesh)
    self.no_k_bias(key)
    self.put(attn.bv, f"{key}.v_proj.bias", lambda b: b.reshape(h, dh))
    self.put(attn.wo, f"{key}.out_proj.weight", lambda x: x.T.reshape(h, dh, -1))
    self.put(attn.bo, f"{key}.out_proj.bias")

  def mlp(self, mlp: MLP, key: str) -> None:
    self.put(mlp.w1, f"{key}.fc1.weight", np.transpose)
    self.put(mlp.b1, f"{key}.fc1.bias")
    self.put(mlp.w2, f"{key}.fc2.weight", np.transpose)
    self.put(mlp.b2, f"{key}.fc2.bias")


def load_state_dict(model: Whisper, sd: Mapping[str, np.ndarray], mesh: Mesh | None = None) -> Whisper:
  """Copies an HF `WhisperForConditionalGeneration` state dict (numpy) into `model` in place; with `mesh`, every
  parameter is placed on the `NamedSharding` of its logical axes."""
  if not any(k.startswith("model.") for k in sd):  # WhisperModel checkpoints have no "model." prefix
    sd = {f"model.{k}": v for k, v in sd.items()}
  r = _Reader(sd, mesh)
  enc, dec = model.encoder, model.decoder
  for conv in ("conv1", "conv2"):
    r.put(getattr(enc, conv).kernel, f"model.encoder.{conv}.weight", lambda w: w.transpose(2, 1, 0))
    r.put(getattr(enc, conv).bias, f"model.encoder.{conv}.bias")
  r.put(enc.positions, "model.encoder.embed_positions.weight")
  r.layer_norm(enc.norm, "model.encoder.layer_norm")
  for i, layer in enumerate(enc.layers):
    p = f"model.encoder.layers.{i}"
    r.self_attention(layer.attn, f"{p}.self_attn")
    r.layer_norm(layer.attn_norm, f"{p}.self_attn_layer_norm")
    r.mlp(layer.mlp, p)
    r.layer_norm(layer.mlp_norm, f"{p}.final_layer_norm")
  r.put(dec.embed, "model.decoder.embed_tokens.weight")
  r.put(dec.positions, "model.decoder.embed_positions.weight")
  r.layer_norm(dec.norm, "model.decoder.layer_norm")
  for i, layer in enumerate(dec.layers):
    p = f"model.decoder.layers.{i}"
    r.self_attention(layer.self_attn, f"{p}.self_attn")
    r.layer_norm(layer.self_norm, f"{p}.self_attn_layer_norm")
    r.cross_attention(layer.cross_attn, f"{p}.encoder_attn")
    r.layer_norm(layer.cross_norm, f"{p}.encoder_attn_layer_norm")
    r.mlp(layer.mlp, p)
    r.layer_norm(layer.mlp_norm, f"{p}.final_layer_norm")
  if "proj_out.weight" in sd:
    if not np.array_equal(sd["proj_out.weight"], sd["model.decoder.embed_tokens.weight"]):
      raise WhisperWeightsError("untied proj_out.weight is not supported (Whisper ties it to the token embedding)")
    r.used.add("proj_out.weight")  # equal to the embedding, which the model projects with
  unused = sorted(set(sd) - r.used)
  if unused:
    raise WhisperWeightsError(f"{len(unused)} Whisper checkpoint tensor(s) not used by the model: {unused[:8]}")
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


def load_whisper(path: str | pathlib.Path, mesh: Mesh | None = None, **config_overrides) -> Whisper:
  """Builds a `Whisper` from a checkpoint directory (its parameters sharded over `mesh` if given);
  `config_overrides` set e.g. `compute_dtype`."""
  return build_whisper(*read_whisper_checkpoint(path), mesh=mesh, **config_overrides)


def build_whisper(hf_config: Mapping[str, Any], sd: Mapping[str, np.ndarray], mesh: Mesh | None = None,
                  **config_overrides) -> Whisper:
  """A `Whisper` from an HF config dict and HF-named state dict (what `read_whisper_checkpoint` or
  `ct2.ct2_whisper_to_hf` return), every tensor checked and consumed by `load_state_dict`."""
  cfg = WhisperConfig.from_hf(hf_config, **config_overrides)
  model = nnx.eval_shape(lambda: Whisper(cfg, nnx.Rngs(0)))
  return load_state_dict(model, sd, mesh)
