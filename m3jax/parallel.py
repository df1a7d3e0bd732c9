"""Meshes and logical-axis sharding.

Every parameter and main activation is annotated with *logical* axis names ("embed", "mlp", "heads", ...).
`LOGICAL_RULES` maps them to mesh axes (`data`, `fsdp`, `tensor`). The same model runs unsharded on one CPU
(no mesh: everything is replicated on the one device) and sharded on any mesh: a logical axis whose size is
not divisible by its mesh axes is replicated instead, so odd head counts never make a model unloadable.
"""

from __future__ import annotations

from typing import Mapping, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated)
LOGICAL_RULES: Mapping[str, str | tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": "fsdp",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "vocab": "tensor",
    "head_dim": None,
    "layers": None,
    "seq": None,
    "norm": None,
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh with Auto axis types (jax>=0.10's make_mesh defaults to Explicit)."""
  devices = list(devices if devices is not None else jax.devices())
  n = data * fsdp * tensor
  if n > len(devices):
    raise ValueError(f"mesh data={data} fsdp={fsdp} tensor={tensor} needs {n} devices, have {len(devices)}")
  return Mesh(np.asarray(devices[:n]).reshape(data, fsdp, tensor), MESH_AXES)


def logical_to_spec(logical: Sequence[str | None], shape: Sequence[int] | None = None,
                    mesh: Mesh | None = None, rules: Mapping = LOGICAL_RULES) -> P:
  """PartitionSpec for logical axis names; axes that do not divide evenly (or repeat) are replicated."""
  used: set[str] = set()
  out = []
  for i, name in enumerate(logical):
    target = rules.get(name) if name is not None else None
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    axes = tuple(a for a in axes if a not in used and (mesh is None or a in mesh.shape))
    if mesh is not None and shape is not None and axes:
      size = int(np.prod([mesh.shape[a] for a in axes]))
      if shape[i] % size != 0:
        axes = ()
    used.update(axes)
    out.append(None if not axes else axes[0] if len(axes) == 1 else axes)
  return P(*out)


def named_sharding(mesh: Mesh, logical: Sequence[str | None], shape: Sequence[int]) -> NamedSharding:
  return NamedSharding(mesh, logical_to_spec(logical, shape, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def shard_like(tree, logical_tree, mesh: Mesh | None):
  """Places every array of `tree` on the sharding given by the matching logical names (no-op without mesh)."""
  if mesh is None:
    return tree
  return jax.tree.map(lambda x, names: jax.device_put(x, named_sharding(mesh, names, x.shape)), tree, logical_tree,
                      is_leaf=lambda n: isinstance(n, tuple) and all(isinstance(a, (str, type(None))) for a in n))
