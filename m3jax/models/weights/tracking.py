"""Checkpoint tensors are consumed or the load fails naming them.

A loader reads its tensors through a `TensorSource`, which records every name read. Tensors a format legitimately
carries but the model does not need (runtime buffers, training-only heads) are consumed explicitly with `skip`,
each with the reason; `check_all_used` then fails on anything left, so an unexpected tensor (an o_proj bias, a
rope_freqs table, a second model in the file) can never be dropped silently.
"""

from __future__ import annotations

from typing import Callable, Iterable

import numpy as np


class TensorSource:
  """name -> tensor through `get`, over the checkpoint's `names`, remembering which were read."""

  def __init__(self, get: Callable[[str], np.ndarray], names: Iterable[str], error: type[Exception],
               where: object = "checkpoint"):
    self._get, self.names, self.error, self.where = get, frozenset(names), error, where
    self.used: set[str] = set()
    self.skipped: dict[str, str] = {}  # name -> why the model does not need it

  def __call__(self, name: str) -> np.ndarray:
    if name not in self.names:
      raise self.error(f"{self.where}: tensor {name!r} is missing")
    self.used.add(name)
    return self._get(name)

  __getitem__ = __call__

  def __contains__(self, name: str) -> bool:
    return name in self.names

  def skip(self, name: str, why: str) -> None:
    """Consumes a tensor the model does not need; `why` documents the reason at the call site."""
    if name in self.names:
      self.used.add(name)
      self.skipped[name] = why

  def check_all_used(self) -> None:
    unused = sorted(self.names - self.used)
    if unused:
      shown = ", ".join(repr(n) for n in unused[:8]) + (f" and {len(unused) - 8} more" if len(unused) > 8 else "")
      raise self.error(f"{self.where}: {len(unused)} checkpoint tensor(s) not used by the model: {shown}")
