"""Low-rank adapters (LoRA) on the Decoder's stacked projections: y = x·W + (alpha/r)·(x·A)·B.

Why not qwix (the JAX LoRA library tunix uses): qwix attaches adapters by model surgery, intercepting the
Linear/Einsum modules or `dot_general` calls of a traced forward pass and creating one adapter per intercepted
call site. Our Decoder has no per-layer modules: its projections are plain `jnp.dot`s on `[layers, ...]`-stacked
weights inside one `lax.scan` body, so qwix would see one call site per projection and create a single unstacked
adapter shared by every layer, without the logical axis names that `m3jax.parallel` shards by (and qwix is not a
dependency). This module instead stacks the adapters like the weights they adapt (`A: [L, *in, r]`,
`B: [L, r, *out]`), carries the weights' logical names (the rank axis is replicated), and the Decoder adds the
adapter inside its projection (`Decoder._layer`), so it rides the same layer scan.

Adapters are `LoRAParam`s (an `nnx.Param` subclass): `nnx.split(model, LoRAParam, ...)` separates them from the
frozen base, so a learner differentiates and keeps optimizer state for the adapters only, and zeroing them gives
the base model exactly (B = 0 adds an exact 0), which is how the base doubles as the KL reference policy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from m3jax import checkpoint

# target name -> (Decoder weight, number of leading input axes after the layer axis)
TARGETS = {"q": ("wq", 1), "k": ("wk", 1), "v": ("wv", 1), "o": ("wo", 2), "gate": ("w_gate", 1),
           "up": ("w_up", 1), "down": ("w_down", 1)}


class LoRAParam(nnx.Param):
  """An adapter array: with LoRA on, the only trainable parameters."""


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
  rank: int = 0  # 0 = no adapters (full fine-tuning)
  alpha: float = 16.0  # the update is scaled by alpha / rank
  targets: tuple[str, ...] = ("q", "k", "v", "o", "gate", "up", "down")

  def __post_init__(self):
    object.__setattr__(self, "targets", tuple(self.targets))
    if not isinstance(self.rank, int) or self.rank < 0:
      raise ValueError(f"lora_rank={self.rank!r} must be an integer >= 0 (0 = full fine-tuning)")
    if not self.alpha > 0:
      raise ValueError(f"lora_alpha={self.alpha!r} must be > 0")
    unknown = [t for t in self.targets if t not in TARGETS]
    if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
      raise ValueError(f"lora_targets={self.targets!r}: expected distinct names from {tuple(TARGETS)}")

  @property
  def scale(self) -> float:
    return self.alpha / self.rank


class LoRA(nnx.Module):
  """The adapters of one Decoder: `<weight>_a` `[L, *in, r]` (random) and `<weight>_b` `[L, r, *out]` (zeros)."""

  def __init__(self, model: nnx.Module, cfg: LoRAConfig, *, rngs: nnx.Rngs):
    if cfg.rank < 1:
      raise ValueError("LoRA needs rank >= 1")
    self.cfg = cfg
    for target in cfg.targets:
      name, n_in = TARGETS[target]
      w = getattr(model, name)
      logical = w.get_metadata()["logical"]
      shape, dtype = w.get_value().shape, w.get_value().dtype
      ins, outs = shape[1:1 + n_in], shape[1 + n_in:]
      a = jax.random.normal(rngs.params(), (shape[0], *ins, cfg.rank), dtype) / math.sqrt(math.prod(ins))
      setattr(self, f"{name}_a", LoRAParam(a, logical=(*logical[:1 + n_in], "lora_rank")))
      setattr(self, f"{name}_b", LoRAParam(jnp.zeros((shape[0], cfg.rank, *outs), dtype),
                                           logical=(logical[0], "lora_rank", *logical[1 + n_in:])))

  def layer_params(self) -> dict[str, tuple[jax.Array, jax.Array]]:
    """`{"lora_<weight>": (A, B)}`, stacked over layers (scanned alongside the Decoder's layer params)."""
    return {f"lora_{TARGETS[t][0]}": (getattr(self, f"{TARGETS[t][0]}_a")[...],
                                      getattr(self, f"{TARGETS[t][0]}_b")[...]) for t in self.cfg.targets}


def add_delta(y: jax.Array, x: jax.Array, a: jax.Array, b: jax.Array, n_in: int, scale: float, dtype) -> jax.Array:
  """y + scale·(x·A)·B for one layer's adapter, contracting x's last `n_in` axes (float32 accumulation, like
  `dense`). The optimization barrier keeps XLA from fusing y's product with the adapter's (which reorders its
  accumulation), so zero adapters leave y bitwise unchanged: the base policy, exactly. (Exception seen on
  XLA:CPU: with q/k norms (Qwen3) the jitted k path fuses differently and logits move by ~1 ulp.)"""
  lead = x.shape[:x.ndim - n_in]
  k, r = math.prod(a.shape[:n_in]), a.shape[-1]
  xa = jnp.dot(x.reshape(-1, k), a.astype(dtype).reshape(k, r), preferred_element_type=jnp.float32)
  d = jnp.dot(xa.astype(dtype), b.astype(dtype).reshape(r, -1), preferred_element_type=jnp.float32)
  y, d = jax.lax.optimization_barrier((y, d))
  return y + (scale * d).reshape(*lead, *b.shape[1:])


def attach(model: nnx.Module, cfg: LoRAConfig, seed: int = 0) -> nnx.Module:
  """Adds adapters to `model` in place (rank 0: leaves it untouched); returns it."""
  if cfg.rank:
    model.lora = LoRA(model, cfg, rngs=nnx.Rngs(seed))
  return model


def merged(model: nnx.Module) -> nnx.Module:
  """A copy of `model` with W + scale·A·B folded into its weights and no adapters (for decoding)."""
  out = nnx.clone(model)
  lora, out.lora = out.lora, None
  for target in lora.cfg.targets:
    name, n_in = TARGETS[target]
    w, a, b = getattr(out, name), getattr(lora, f"{name}_a")[...], getattr(lora, f"{name}_b")[...]
    ab = jnp.einsum("lkr,lrn->lkn", a.reshape(a.shape[0], -1, a.shape[-1]), b.reshape(b.shape[0], b.shape[1], -1))
    w[...] = w[...] + (lora.cfg.scale * ab).reshape(w[...].shape).astype(w[...].dtype)
  return out


def adapter_state(model: nnx.Module) -> nnx.State:
  return nnx.state(model, LoRAParam)


ADAPTER_FORMAT = "m3jax-lora-1"


ADAPTER_KINDS = ("controller", "writer")  # what an adapter was trained to do; loaders refuse the other kind


def export_adapter_file(path: str | pathlib.Path, model: nnx.Module, kind: str, meta: dict | None = None,
                        dtype: str = "float32") -> pathlib.Path:
  """Writes the adapters as one compressed `.npz` (arrays named `<weight>_a|b`, plus a JSON `__meta__` entry with
  kind, rank, alpha, targets and `meta`): the shippable form. Unlike an orbax directory it reads from a read-only
  install (site-packages) and is one file to commit. `dtype="float16"` halves a shipped file; loading casts back
  to the model's dtype."""
  lora = getattr(model, "lora", None)
  if lora is None:
    raise ValueError("the model has no adapters to export (lora_rank = 0)")
  if kind not in ADAPTER_KINDS or dtype not in ("float32", "float16"):
    raise ValueError(f"adapter kind {kind!r} / dtype {dtype!r}: expected one of {ADAPTER_KINDS} / float32|float16")
  arrays = {f"{TARGETS[t][0]}_{ab}": np.asarray(getattr(lora, f"{TARGETS[t][0]}_{ab}")[...], dtype)
            for t in lora.cfg.targets for ab in "ab"}
  info = {"format": ADAPTER_FORMAT, "kind": kind, "rank": lora.cfg.rank, "alpha": lora.cfg.alpha,
          "targets": list(lora.cfg.targets), **(meta or {})}
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")  # renamed when complete: a kill leaves old or new
  with open(tmp, "wb") as f:
    np.savez_compressed(f, __meta__=np.frombuffer(json.dumps(info, sort_keys=True).encode(), np.uint8), **arrays)
  os.replace(tmp, path)
  return path


def read_adapter_meta(path: str | pathlib.Path, kind: str | None = None) -> dict:
  """The JSON metadata of an exported adapter file (refuses anything else, or another `kind`, by name)."""
  try:
    with np.load(path) as z:
      info = json.loads(bytes(z["__meta__"]).decode())
  except (OSError, ValueError, KeyError) as e:
    raise checkpoint.CheckpointError(f"{path} is not an m3jax LoRA adapter file: {e}") from e
  if info.get("format") != ADAPTER_FORMAT:
    raise checkpoint.CheckpointError(f"{path}: adapter format {info.get('format')!r}, expected {ADAPTER_FORMAT!r}")
  if kind is not None and info.get("kind") != kind:
    raise checkpoint.CheckpointError(f"{path} is a {info.get('kind')} adapter, not a {kind} adapter")
  return info


def load_adapter_file(path: str | pathlib.Path, model: nnx.Module, kind: str, seed: int = 0
                      ) -> tuple[nnx.Module, dict]:
  """Attaches adapters of the file's rank/alpha/targets to `model` and fills them from the file; every array is
  consumed and shape-checked, or the load fails naming it. Returns (model, metadata)."""
  info = read_adapter_meta(path, kind)
  cfg = LoRAConfig(int(info["rank"]), float(info["alpha"]), tuple(info["targets"]))
  attach(model, cfg, seed=seed)
  with np.load(path) as z:
    stored = {k: z[k] for k in z.files if k != "__meta__"}
  for t in cfg.targets:
    for ab in "ab":
      key = f"{TARGETS[t][0]}_{ab}"
      param = getattr(model.lora, key)
      if key not in stored:
        raise checkpoint.CheckpointError(f"{path}: adapter array {key} is missing")
      value = stored.pop(key)
      if value.shape != param[...].shape:
        raise checkpoint.CheckpointError(f"{path}: {key} has shape {value.shape}, the model needs "
                                         f"{param[...].shape} (another base model?)")
      param[...] = jnp.asarray(value, param[...].dtype)
  if stored:
    raise checkpoint.CheckpointError(f"{path}: unused adapter arrays {sorted(stored)}")
  return model, info
