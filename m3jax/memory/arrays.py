"""Growable struct-of-arrays columns with an incrementally synced device mirror.

Every column of the memory graph is a host numpy buffer whose capacity doubles when full, so appending a
clip costs amortised O(clip) and the device shapes (the capacities) change at most log2(size) times, which
bounds recompilation of the jitted search. The device copy is refreshed by scattering only the rows written
since the last sync (padded to a power-of-two bucket so the scatter compiles a bounded number of times); a
full upload happens only after growth or when most rows changed.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def next_pow2(n: int, minimum: int = 1) -> int:
  n = max(int(n), minimum)
  return 1 << (n - 1).bit_length()


@functools.partial(jax.jit, donate_argnums=(0,))
def _scatter_rows(dev: jax.Array, idx: jax.Array, rows: jax.Array) -> jax.Array:
  return dev.at[idx].set(rows)


class GrowableArray:
  """A host column `[capacity, *row_shape]` with `size` valid rows and a lazily synced device mirror."""

  def __init__(self, row_shape: tuple[int, ...], dtype: Any, capacity: int = 64, fill: Any = 0):
    self.row_shape = tuple(row_shape)
    self.dtype = np.dtype(dtype)
    self.fill = fill
    self.size = 0
    self.data = np.full((next_pow2(capacity),) + self.row_shape, fill, self.dtype)
    self._dev: jax.Array | None = None
    self._dirty: list[np.ndarray] = []
    self.growths = 0

  @property
  def capacity(self) -> int:
    return self.data.shape[0]

  @property
  def valid(self) -> np.ndarray:
    return self.data[: self.size]

  def reserve(self, n: int) -> None:
    """Makes room for `n` rows in total, doubling capacity as needed."""
    if n <= self.capacity:
      return
    new = np.full((next_pow2(n),) + self.row_shape, self.fill, self.dtype)
    new[: self.size] = self.data[: self.size]
    self.data = new
    self._dev = None
    self._dirty.clear()
    self.growths += 1

  def append(self, rows: Any) -> int:
    """Appends rows `[n, *row_shape]`; returns the index of the first one."""
    rows = np.asarray(rows, self.dtype).reshape((-1,) + self.row_shape)
    start = self.size
    self.reserve(start + rows.shape[0])
    self.data[start : start + rows.shape[0]] = rows
    self.size += rows.shape[0]
    self._mark(np.arange(start, self.size))
    return start

  def set(self, idx: Any, values: Any) -> None:
    idx = np.atleast_1d(np.asarray(idx, np.int64))
    if idx.size and (idx.min() < 0 or idx.max() >= self.size):
      raise IndexError(f"row index out of range [0, {self.size})")
    self.data[idx] = values
    self._mark(idx)

  def _mark(self, idx: np.ndarray) -> None:
    if self._dev is not None and idx.size:
      self._dirty.append(idx)

  def device(self) -> jax.Array:
    """The full-capacity device copy, refreshed with the rows changed since the last call."""
    if self._dev is None:
      self._dev = jnp.asarray(self.data)
      self._dirty.clear()
      return self._dev
    if self._dirty:
      idx = np.unique(np.concatenate(self._dirty))
      self._dirty.clear()
      if idx.size * 4 > self.capacity:
        self._dev = jnp.asarray(self.data)
      else:
        padded = np.full(next_pow2(idx.size, 8), idx[-1], np.int64)
        padded[: idx.size] = idx
        self._dev = _scatter_rows(self._dev, jnp.asarray(padded, jnp.int32), jnp.asarray(self.data[padded]))
    return self._dev

  def load(self, rows: np.ndarray) -> None:
    """Replaces the content with `rows` (used by persistence)."""
    rows = np.asarray(rows, self.dtype).reshape((-1,) + self.row_shape)
    self.size = 0
    self.reserve(rows.shape[0])
    self.data[: rows.shape[0]] = rows
    self.data[rows.shape[0]:] = self.fill
    self.size = rows.shape[0]
    self._dev = None
    self._dirty.clear()
