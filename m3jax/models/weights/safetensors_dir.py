"""Lazy, zero-copy reader of a directory of *.safetensors shards (any dtype, bfloat16 included).

Parses each shard's JSON header and memory-maps the data, because `safe_open(framework="numpy")` cannot return
bfloat16 — the dtype most released checkpoints (Qwen3, Qwen2.5-Omni, M3-Agent) are stored in.
"""

from __future__ import annotations

import json
import pathlib
from typing import Callable, Iterable

import ml_dtypes
import numpy as np

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16, "F64": np.float64, "I64": np.int64,
          "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


class SafetensorsDir:
  """name -> numpy view over every shard of a directory; `rename` maps stored names (None drops a tensor)."""

  def __init__(self, directory: str | pathlib.Path, rename: Callable[[str], str | None] = lambda k: k,
               error: type[Exception] = ValueError):
    self.directory, self._error = pathlib.Path(directory), error
    files = sorted(self.directory.glob("*.safetensors"))
    if not files:
      raise error(f"no *.safetensors files in {self.directory}")
    self._where: dict[str, tuple[np.memmap, dict]] = {}
    for f in files:
      try:
        with open(f, "rb") as fh:
          n = int.from_bytes(fh.read(8), "little")
          header = json.loads(fh.read(n))
        data = np.memmap(f, dtype=np.uint8, mode="r", offset=8 + n)
      except (OSError, ValueError) as e:
        raise error(f"cannot read safetensors file {f}: {e}") from e
      for key, meta in header.items():
        name = rename(key) if key != "__metadata__" else None
        if name is None:
          continue
        if meta["dtype"] not in DTYPES:
          raise error(f"tensor {key!r} in {f.name} has unsupported dtype {meta['dtype']}")
        lo, hi = meta["data_offsets"]
        if hi > data.size:
          raise error(f"tensor {key!r} in {f.name} reaches past the end of the file (truncated?)")
        self._where[name] = (data, meta)

  def keys(self) -> Iterable[str]:
    return self._where.keys()

  def __contains__(self, name: str) -> bool:
    return name in self._where

  def __call__(self, name: str) -> np.ndarray:
    if name not in self._where:
      raise self._error(f"tensor {name!r} is missing from {self.directory}")
    data, meta = self._where[name]
    lo, hi = meta["data_offsets"]
    return data[lo:hi].view(DTYPES[meta["dtype"]]).reshape(meta["shape"])
