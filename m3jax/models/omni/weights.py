"""Hugging Face Qwen2.5-Omni / M3-Agent-Memorization directory -> m3jax thinker params (thinker tensors only).

Checkpoints come in two spellings: the hub's original (`thinker.model.layers.*`, `thinker.visual.*`,
`thinker.audio_tower.*`, `thinker.lm_head.*`) and transformers>=5's (`model.language_model.*`, `model.visual.*`,
`model.audio_tower.*`, `lm_head.*`). Both are normalised to the latter; talker/token2wav tensors (the speech
generator, which M3-Agent does not run) are never read. Every thinker tensor must be consumed, or the load fails
naming the ones left over.
Torch Linear weights are [out, in] and are transposed to [in, out]; per-layer tensors are stacked on a leading
"layers" axis. Every array is placed on its own sharding (from the *_LOGICAL tables) as it is built, so a 7B model
never needs a fully replicated host copy on one device.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from m3jax.models.decoder import Decoder
from m3jax.models.omni.audio import AUDIO_LOGICAL, AudioConfig, AudioEncoder
from m3jax.models.omni.thinker import Thinker, ThinkerConfig
from m3jax.models.omni.vision import VISION_LOGICAL, VisionConfig, VisionEncoder
from m3jax.models.weights.hf import load_params as load_decoder_params
from m3jax.models.weights.safetensors_dir import SafetensorsDir
from m3jax.models.weights.tracking import TensorSource
from m3jax.parallel import named_sharding


class OmniWeightsError(ValueError):
  """A checkpoint directory is missing tensors or has unexpected shapes."""


def canonical_name(name: str) -> str | None:
  """transformers-5 thinker name for a checkpoint key, or None when the key is not a thinker tensor."""
  if name.startswith("thinker."):
    name = name[len("thinker."):]
  elif name.startswith(("talker.", "token2wav.")):
    return None
  for old, new in (("model.layers.", "model.language_model.layers."),
                   ("model.embed_tokens.", "model.language_model.embed_tokens."),
                   ("model.norm.", "model.language_model.norm."),
                   ("visual.", "model.visual."), ("audio_tower.", "model.audio_tower.")):
    if name.startswith(old):
      return new + name[len(old):]
  return name


Getter = Callable[[str], np.ndarray]


def _stack(get: Getter, fmt: str, n: int, transpose: bool = False) -> np.ndarray:
  arrs = [get(fmt.format(i)) for i in range(n)]
  return np.stack([a.T if transpose else a for a in arrs])


def vision_params(get: Getter, cfg: VisionConfig, prefix: str = "model.visual.") -> dict[str, np.ndarray]:
  b = prefix + "blocks.{}."
  n = cfg.depth
  pe = get(prefix + "patch_embed.proj.weight")
  return {
      "patch_embed": pe.reshape(pe.shape[0], -1).T,
      "norm1": _stack(get, b + "norm1.weight", n), "norm2": _stack(get, b + "norm2.weight", n),
      "wq": _stack(get, b + "attn.q.weight", n, True), "bq": _stack(get, b + "attn.q.bias", n),
      "wk": _stack(get, b + "attn.k.weight", n, True), "bk": _stack(get, b + "attn.k.bias", n),
      "wv": _stack(get, b + "attn.v.weight", n, True), "bv": _stack(get, b + "attn.v.bias", n),
      "wo": _stack(get, b + "attn.proj.weight", n, True), "bo": _stack(get, b + "attn.proj.bias", n),
      "w_gate": _stack(get, b + "mlp.gate_proj.weight", n, True), "b_gate": _stack(get, b + "mlp.gate_proj.bias", n),
      "w_up": _stack(get, b + "mlp.up_proj.weight", n, True), "b_up": _stack(get, b + "mlp.up_proj.bias", n),
      "w_down": _stack(get, b + "mlp.down_proj.weight", n, True),
      "b_down": _stack(get, b + "mlp.down_proj.bias", n),
      "merger_ln": get(prefix + "merger.ln_q.weight"),
      "merger_w1": get(prefix + "merger.mlp.0.weight").T, "merger_b1": get(prefix + "merger.mlp.0.bias"),
      "merger_w2": get(prefix + "merger.mlp.2.weight").T, "merger_b2": get(prefix + "merger.mlp.2.bias"),
  }


def audio_params(get: Getter, cfg: AudioConfig, prefix: str = "model.audio_tower.") -> dict[str, np.ndarray]:
  b = prefix + "layers.{}."
  n = cfg.encoder_layers
  return {
      # torch Conv1d [out, in, k] -> [k, in, out]
      "conv1_w": get(prefix + "conv1.weight").transpose(2, 1, 0), "conv1_b": get(prefix + "conv1.bias"),
      "conv2_w": get(prefix + "conv2.weight").transpose(2, 1, 0), "conv2_b": get(prefix + "conv2.bias"),
      "ln1_w": _stack(get, b + "self_attn_layer_norm.weight", n),
      "ln1_b": _stack(get, b + "self_attn_layer_norm.bias", n),
      "wq": _stack(get, b + "self_attn.q_proj.weight", n, True), "bq": _stack(get, b + "self_attn.q_proj.bias", n),
      "wk": _stack(get, b + "self_attn.k_proj.weight", n, True),
      "wv": _stack(get, b + "self_attn.v_proj.weight", n, True), "bv": _stack(get, b + "self_attn.v_proj.bias", n),
      "wo": _stack(get, b + "self_attn.out_proj.weight", n, True), "bo": _stack(get, b + "self_attn.out_proj.bias", n),
      "ln2_w": _stack(get, b + "final_layer_norm.weight", n), "ln2_b": _stack(get, b + "final_layer_norm.bias", n),
      "fc1_w": _stack(get, b + "fc1.weight", n, True), "fc1_b": _stack(get, b + "fc1.bias", n),
      "fc2_w": _stack(get, b + "fc2.weight", n, True), "fc2_b": _stack(get, b + "fc2.bias", n),
      "ln_post_w": get(prefix + "ln_post.weight"), "ln_post_b": get(prefix + "ln_post.bias"),
      "proj_w": get(prefix + "proj.weight").T, "proj_b": get(prefix + "proj.bias"),
  }


def place(params: Mapping[str, np.ndarray], logical: Mapping[str, tuple], dtype,
          mesh: Mesh | None) -> dict[str, jax.Array]:
  """Cast and put each array on its sharding (replicated on the default device without a mesh)."""
  out = {}
  for k, v in params.items():
    arr = np.asarray(v, dtype=np.float32).astype(jnp.dtype(dtype))
    out[k] = jnp.asarray(arr) if mesh is None else jax.device_put(arr, named_sharding(mesh, logical[k], arr.shape))
  return out


class CheckpointReader(SafetensorsDir):
  """The thinker's tensors of an HF directory, keyed by canonical thinker names (talker tensors are dropped)."""

  def __init__(self, path: str):
    super().__init__(path, rename=canonical_name, error=OmniWeightsError)


def read_thinker_config(path: str) -> dict:
  """The thinker config dict from a full Omni config.json (`thinker_config`) or a thinker-only one."""
  with open(os.path.join(path, "config.json")) as fh:
    cfg = json.load(fh)
  return cfg.get("thinker_config", cfg)


def thinker_from_tensors(cfg: ThinkerConfig, get: Getter, names: Iterable[str], mesh: Mesh | None = None) -> Thinker:
  """Builds a Thinker from canonical-name tensors (a CheckpointReader, or a torch state_dict in tests) named by
  `names`; fails naming any of them the thinker does not use."""
  source = TensorSource(get, names, OmniWeightsError, "thinker checkpoint")
  get, has = source, source.__contains__
  abstract_lm = nnx.eval_shape(lambda: Decoder(cfg.text, rngs=nnx.Rngs(0)))
  # the decoder loader asks for Qwen2 names (model.layers.*); canonical_name maps them to the thinker's
  lm = load_decoder_params(abstract_lm, lambda k: get(canonical_name(k)), lambda k: has(canonical_name(k)), mesh)
  visual = VisionEncoder(cfg.vision, params=place(vision_params(get, cfg.vision), VISION_LOGICAL,
                                                  cfg.vision.param_dtype, mesh))
  audio = AudioEncoder(cfg.audio, params=place(audio_params(get, cfg.audio), AUDIO_LOGICAL,
                                               cfg.audio.param_dtype, mesh))
  source.skip("model.audio_tower.audio_bos_eos_token.weight",
              "transformers' Qwen2.5-Omni audio encoder declares this embedding but never uses it in its forward")
  source.check_all_used()
  return Thinker(cfg, lm=lm, visual=visual, audio_tower=audio)


def load_thinker(path: str, mesh: Mesh | None = None, param_dtype: str = "bfloat16",
                 compute_dtype: str = "bfloat16", attention_chunk: int = 0) -> Thinker:
  """Loads the thinker of a Qwen2.5-Omni / M3-Agent-Memorization HF directory (talker tensors are skipped)."""
  cfg = ThinkerConfig.from_hf(read_thinker_config(path), param_dtype=param_dtype, compute_dtype=compute_dtype,
                              attention_chunk=attention_chunk)
  reader = CheckpointReader(path)
  return thinker_from_tensors(cfg, reader, reader.keys(), mesh)
