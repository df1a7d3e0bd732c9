"""Hugging Face directories (config.json + one or many *.safetensors) <-> m3jax Decoder.

Loading never builds a full host copy of a sharded model: every parameter is created with
`jax.make_array_from_callback`, so each device shard reads (one layer's tensor at a time) only what it holds.
Missing tensors and shape mismatches fail with the tensor's name before anything is allocated; a checkpoint tensor
the model does not read fails the load naming it (`tracking.TensorSource`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from safetensors.numpy import save_file

from m3jax.models.decoder import Decoder, DecoderConfig, logical_axes
from m3jax.models.weights.safetensors_dir import SafetensorsDir
from m3jax.models.weights.tracking import TensorSource
from m3jax.parallel import named_sharding


class WeightLoadError(ValueError):
  """A checkpoint does not match the model (missing tensor, wrong shape, unreadable file)."""


# param name -> (HF key template with {i} for the layer, to_m3jax(np, cfg), to_hf(np, cfg))
def _param_table(cfg: DecoderConfig) -> dict[str, tuple[str, Callable, Callable]]:
  D, H, K, Dh = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
  lin_in = lambda heads: (lambda w: w.T.reshape(D, heads, Dh), lambda w: w.reshape(D, heads * Dh).T)
  same = (lambda w: w, lambda w: w)
  t = {
      "attn_norm": ("model.layers.{i}.input_layernorm.weight", *same),
      "wq": ("model.layers.{i}.self_attn.q_proj.weight", *lin_in(H)),
      "wk": ("model.layers.{i}.self_attn.k_proj.weight", *lin_in(K)),
      "wv": ("model.layers.{i}.self_attn.v_proj.weight", *lin_in(K)),
      "wo": ("model.layers.{i}.self_attn.o_proj.weight",
             lambda w: w.T.reshape(H, Dh, D), lambda w: w.reshape(H * Dh, D).T),
      "mlp_norm": ("model.layers.{i}.post_attention_layernorm.weight", *same),
      "w_gate": ("model.layers.{i}.mlp.gate_proj.weight", np.transpose, np.transpose),
      "w_up": ("model.layers.{i}.mlp.up_proj.weight", np.transpose, np.transpose),
      "w_down": ("model.layers.{i}.mlp.down_proj.weight", np.transpose, np.transpose),
      "embed": ("model.embed_tokens.weight", *same),
      "final_norm": ("model.norm.weight", *same),
  }
  if cfg.qkv_bias:
    for name, heads, proj in (("bq", H, "q"), ("bk", K, "k"), ("bv", K, "v")):
      t[name] = (f"model.layers.{{i}}.self_attn.{proj}_proj.bias",
                 lambda w, h=heads: w.reshape(h, Dh), lambda w: w.reshape(-1))
  if cfg.o_bias:
    t["bo"] = ("model.layers.{i}.self_attn.o_proj.bias", *same)
  if cfg.mlp_bias:
    for name, proj in (("b_gate", "gate"), ("b_up", "up"), ("b_down", "down")):
      t[name] = (f"model.layers.{{i}}.mlp.{proj}_proj.bias", *same)
  if cfg.qk_norm:
    t["q_norm"] = ("model.layers.{i}.self_attn.q_norm.weight", *same)
    t["k_norm"] = ("model.layers.{i}.self_attn.k_norm.weight", *same)
  if not cfg.tie_embeddings:
    t["lm_head"] = ("lm_head.weight", np.transpose, np.transpose)
  return t


def load_params(abstract_model: Decoder, get_tensor: Callable[[str], np.ndarray],
                has_tensor: Callable[[str], bool], mesh: Mesh | None = None) -> Decoder:
  """Fills an abstract (eval_shape'd) Decoder from a name -> tensor function, placing each tensor on its sharding.

  A tied model's checkpoint may still store `lm_head.weight`; it is read (so a tracking source counts it used)
  and must equal the embedding, since the model will use the embedding in its place."""
  cfg = abstract_model.cfg
  graphdef, abstract_state = nnx.split(abstract_model)
  logical = nnx.to_pure_dict(logical_axes(abstract_model))
  table = _param_table(cfg)
  pure = nnx.to_pure_dict(nnx.state(abstract_model, nnx.Param))
  missing = [tmpl.format(i=0) for name, (tmpl, _, _) in table.items() if not has_tensor(tmpl.format(i=0))]
  if missing:
    raise WeightLoadError(f"checkpoint is missing tensor(s) {missing[:5]} (expected for {cfg.model_type})")
  values = {}
  for name, (tmpl, to_m3, _) in table.items():
    target = pure[name]
    stacked = "{i}" in tmpl

    def read(i, tmpl=tmpl, to_m3=to_m3, target=target, stacked=stacked):
      key = tmpl.format(i=i)
      raw = get_tensor(key)
      want = tuple(target.shape[1:] if stacked else target.shape)
      try:
        w = np.asarray(to_m3(raw))
      except ValueError:
        w = None
      if w is None or w.shape != want:
        raise WeightLoadError(f"tensor {key!r} has shape {tuple(raw.shape)}, which does not fit parameter {name!r} "
                              f"of shape {want}")
      return w.astype(target.dtype)

    if stacked:
      for i in range(cfg.num_layers):
        if not has_tensor(tmpl.format(i=i)):
          raise WeightLoadError(f"tensor {tmpl.format(i=i)!r} is missing")
      read_full = lambda idx, read=read: np.stack([read(i) for i in range(cfg.num_layers)[idx[0]]])[(slice(None),)
                                                                                                  + tuple(idx[1:])]
    else:
      read_full = lambda idx, read=read: read(None)[idx]
    values[name] = _materialise(target, logical[name], read_full, mesh)
  if cfg.tie_embeddings and has_tensor("lm_head.weight"):
    head, embed = get_tensor("lm_head.weight"), get_tensor("model.embed_tokens.weight")
    if not np.array_equal(np.asarray(head), np.asarray(embed)):
      raise WeightLoadError("checkpoint has an lm_head.weight that differs from the embedding, but the config ties "
                            "them (tie_word_embeddings)")
  state = nnx.state(abstract_model)
  nnx.replace_by_pure_dict(state, values)
  return nnx.merge(graphdef, state)


def _materialise(target, names, read: Callable, mesh: Mesh | None):
  if mesh is None:
    full = read(tuple(slice(None) for _ in target.shape))
    return jnp.asarray(full)
  sharding = named_sharding(mesh, names, target.shape)
  return jax.make_array_from_callback(target.shape, sharding, lambda idx: read(tuple(idx)))


def read_config(directory: str | pathlib.Path) -> dict:
  path = pathlib.Path(directory) / "config.json"
  if not path.exists():
    raise WeightLoadError(f"{directory} has no config.json")
  hf = json.loads(path.read_text())
  return hf.get("text_config", hf) if hf.get("model_type") not in ("llama", "qwen2", "qwen3") else hf


def load_hf(directory: str | pathlib.Path, mesh: Mesh | None = None, **config_overrides) -> Decoder:
  """Loads a Llama/Qwen2/Qwen3 Hugging Face directory into a Decoder (sharded over `mesh` if given)."""
  directory = pathlib.Path(directory)
  cfg = DecoderConfig.from_hf(read_config(directory), **config_overrides)
  files = SafetensorsDir(directory, error=WeightLoadError)
  source = TensorSource(files, files.keys(), WeightLoadError, directory)
  abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
  model = load_params(abstract, source, source.__contains__, mesh)
  source.check_all_used()
  return model


def hf_tensors(model: Decoder) -> Iterable[tuple[str, np.ndarray]]:
  """(HF name, numpy tensor) pairs for every parameter of the model."""
  cfg = model.cfg
  pure = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  for name, (tmpl, _, to_hf) in _param_table(cfg).items():
    value = np.asarray(jax.device_get(pure[name]))
    if "{i}" in tmpl:
      for i in range(cfg.num_layers):
        yield tmpl.format(i=i), np.ascontiguousarray(to_hf(value[i]))
    else:
      yield tmpl, np.ascontiguousarray(to_hf(value))


def save_hf(model: Decoder, directory: str | pathlib.Path, tokenizer=None,
            max_shard_bytes: int = 4 << 30) -> pathlib.Path:
  """Writes config.json + safetensors shards (+ index when sharded) that transformers loads directly."""
  hf_cfg = model.cfg.to_hf()  # first: a config with no exact HF form fails before anything is written
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for key, value in hf_tensors(model):
    if size + value.nbytes > max_shard_bytes and shards[-1]:
      shards.append({})
      size = 0
    shards[-1][key] = value
    size += value.nbytes
  hf_cfg["torch_dtype"] = str(np.dtype(model.cfg.pdtype).name) if model.cfg.param_dtype != "bfloat16" else "bfloat16"
  (directory / "config.json").write_text(json.dumps(hf_cfg, indent=2))
  if len(shards) == 1:
    save_file(shards[0], str(directory / "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for n, shard in enumerate(shards):
      fname = f"model-{n + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, str(directory / fname), metadata={"format": "pt"})
      weight_map.update({k: fname for k in shard})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
  if tokenizer is not None:
    tokenizer.save_pretrained(str(directory))
  return directory
