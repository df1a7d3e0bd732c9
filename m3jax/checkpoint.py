"""Orbax checkpoints for exact resume: arrays (params, optimizer state, RNG key data) + JSON metadata.

A training program saves `arrays` (any pytree of arrays: params, optax state, `jax.random.key_data(rng)`) and
`meta` (JSON: the step, the grain iterator's `get_state()`, the dynamic-sampling buffer size, ...). Restoring
into a template of the same structure (e.g. the freshly initialised state) brings back every leaf with the
template's sharding, so a killed run continues with bit-identical next steps.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
  """No checkpoint to restore, or a checkpoint that does not match the template."""


class Checkpointer:
  """A directory of numbered checkpoints; keeps the newest `max_to_keep`."""

  def __init__(self, directory: str | pathlib.Path, max_to_keep: int = 3):
    self.directory = pathlib.Path(directory).absolute()
    # a checkpoint is written to a temporary directory and renamed when complete; one a kill left half-written
    # is never restored, and is removed when the next run opens the directory
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True, enable_async_checkpointing=False,
                                           cleanup_tmp_directories=True)
    self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("arrays", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, arrays: Any, meta: dict[str, Any]) -> None:
    """Writes checkpoint `step` synchronously (a crash right after still leaves it complete)."""
    self._manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(arrays),
                                                     meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """(arrays shaped and sharded like `template`, meta) of `step` (default: the newest)."""
    step = self.latest_step() if step is None else step
    if step is None:
      raise CheckpointError(f"no checkpoint in {self.directory}")
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, template)
    try:
      out = self._manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(abstract),
                                                                meta=ocp.args.JsonRestore()))
    except (ValueError, KeyError) as e:
      raise CheckpointError(f"checkpoint {step} in {self.directory} does not match the template: {e}") from e
    return out["arrays"], out["meta"]

  def steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def prune(self, keep: int = 1) -> None:
    """Deletes all but the newest `keep` checkpoints (a chunk's end: what a commit of the run carries)."""
    for step in self.steps()[:-keep]:
      self._manager.delete(step)

  def close(self) -> None:
    self._manager.close()
