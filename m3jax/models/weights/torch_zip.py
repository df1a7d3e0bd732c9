"""Read PyTorch checkpoints (`torch.save` files) into numpy WITHOUT importing torch.

Two on-disk layouts exist and both are handled:
  * zip (torch >= 1.6): `<root>/data.pkl` + one raw file per storage in `<root>/data/<key>`;
  * legacy (what Resemblyzer's `pretrained.pt` is): a stream of pickles, magic number, protocol, sys-info,
    the object pickle, the list of storage keys, then each storage as `int64 numel` + raw little-endian bytes.

TorchScript archives (`torch.jit.save`, e.g. Silero VAD's `silero_vad.jit`) are zip checkpoints whose pickle
holds `__torch__.*` module objects; `load_torchscript_tensors` maps those to inert attribute records and
returns every tensor by dotted name.

Pickle can run arbitrary code, so the unpickler is restricted: it resolves only `collections.OrderedDict`,
the tensor rebuild functions, the typed storage classes (mapped to numpy dtypes) and, for TorchScript only,
`__torch__.*` names (inert records, no code) and `build_intlist`. Anything else raises
`UnsafeCheckpointError` naming the offending global, so a hostile file cannot execute code.
"""

from __future__ import annotations

import collections
import functools
import io
import pathlib
import pickle
import pickletools
import zipfile
from typing import Any, Callable

import numpy as np

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C

_STORAGE_DTYPES: dict[str, np.dtype] = {
    "FloatStorage": np.dtype("<f4"), "DoubleStorage": np.dtype("<f8"), "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"), "IntStorage": np.dtype("<i4"), "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"), "ByteStorage": np.dtype("u1"), "BoolStorage": np.dtype("?"),
}


class CheckpointFormatError(ValueError):
  """The file is not a readable torch checkpoint (truncated, wrong magic, missing storage...)."""


class UnsafeCheckpointError(CheckpointFormatError):
  """The pickle references a global outside the allowed tensor-only set."""


class _StorageType:
  """Stand-in for `torch.FloatStorage` etc.: only carries the numpy dtype."""

  def __init__(self, name: str):
    self.name, self.dtype = name, _STORAGE_DTYPES[name]


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...], stride: tuple[int, ...],
                    *_unused: Any) -> np.ndarray:
  """numpy equivalent of `torch._utils._rebuild_tensor_v2` (element strides -> byte strides, then copy).

  `as_strided` does not bounds-check, so the view's extent is checked against the storage first: a hostile
  file must not be able to read memory outside its own data.
  """
  if any(n < 0 for n in size) or any(st < 0 for st in stride) or len(size) != len(stride) or offset < 0:
    raise CheckpointFormatError(f"invalid tensor geometry size={size} stride={stride} offset={offset}")
  extent = offset + (sum((n - 1) * st for n, st in zip(size, stride)) + 1 if all(size) else 0)
  if extent > storage.size or (not size and offset >= storage.size):
    raise CheckpointFormatError(f"tensor (offset {offset}, size {size}) exceeds its storage of {storage.size}")
  if not size:
    return storage[offset].copy()
  item = storage.itemsize
  view = np.lib.stride_tricks.as_strided(storage[offset:], shape=tuple(size),
                                         strides=tuple(s * item for s in stride), writeable=False)
  return np.ascontiguousarray(view)


def _rebuild_parameter(data: np.ndarray, *_unused: Any) -> np.ndarray:
  return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class ScriptRecord:
  """Inert stand-in for a pickled TorchScript module: only keeps its attributes (no methods, no code)."""

  torch_class = ""

  def __setstate__(self, state: Any) -> None:
    if isinstance(state, dict):
      self.__dict__.update(state)


@functools.cache
def _script_record_class(module: str, name: str) -> type:
  return type(name, (ScriptRecord,), {"torch_class": f"{module}.{name}"})


class _RestrictedUnpickler(pickle.Unpickler):
  """Unpickler that resolves storages through `load_storage` and refuses every non-tensor global."""

  def __init__(self, stream: io.BufferedIOBase, load_storage: Callable[[tuple], np.ndarray],
               script: bool = False):
    super().__init__(stream)
    self._load_storage = load_storage
    self._script = script

  def find_class(self, module: str, name: str) -> Any:
    if (module, name) in _ALLOWED:
      return _ALLOWED[(module, name)]
    if module == "torch" and name in _STORAGE_DTYPES:
      return _StorageType(name)
    if self._script and module.startswith("__torch__."):
      return _script_record_class(module, name)
    if self._script and (module, name) == ("torch.jit._pickle", "build_intlist"):
      return list
    raise UnsafeCheckpointError(f"checkpoint references forbidden global {module}.{name}")

  def persistent_load(self, pid: Any) -> np.ndarray:
    if not (isinstance(pid, tuple) and pid and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
      raise UnsafeCheckpointError(f"unsupported persistent id {pid!r}")
    return self._load_storage(pid)


def load_torch_checkpoint(path: str | pathlib.Path) -> Any:
  """Loads a `torch.save` file; tensors come back as numpy arrays, containers as dict/OrderedDict/list."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"torch checkpoint not found: {path}")
  if zipfile.is_zipfile(path):
    return _load_zip(path)
  return _load_legacy(path.read_bytes(), str(path))


def load_torchscript_tensors(path: str | pathlib.Path) -> dict[str, np.ndarray]:
  """All tensors of a TorchScript archive by dotted attribute path, e.g. `_model.decoder.rnn.weight_ih`."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"TorchScript file not found: {path}")
  if not zipfile.is_zipfile(path):
    raise CheckpointFormatError(f"{path}: not a TorchScript zip archive")
  out: dict[str, np.ndarray] = {}

  def walk(obj: Any, prefix: str) -> None:
    for key, value in (obj.__dict__ if isinstance(obj, ScriptRecord) else obj).items():
      if isinstance(value, np.ndarray):
        out[prefix + str(key)] = value
      elif isinstance(value, (ScriptRecord, dict)):
        walk(value, f"{prefix}{key}.")

  walk(_load_zip(path, script=True), "")
  return out


def _load_zip(path: pathlib.Path, script: bool = False) -> Any:
  with zipfile.ZipFile(path) as archive:
    names = archive.namelist()
    pkl = [n for n in names if n.endswith("/data.pkl") or n == "data.pkl"]
    if not pkl:
      raise CheckpointFormatError(f"{path}: zip checkpoint has no data.pkl")
    root = pkl[0][: -len("data.pkl")]

    def load_storage(pid: tuple) -> np.ndarray:
      _, storage_type, key, _location, numel = pid[:5]
      member = f"{root}data/{key}"
      if member not in names:
        raise CheckpointFormatError(f"{path}: storage {key} missing from the archive")
      raw = archive.read(member)
      return np.frombuffer(raw, dtype=storage_type.dtype, count=numel)

    return _RestrictedUnpickler(io.BytesIO(archive.read(pkl[0])), load_storage, script).load()


def _load_legacy(data: bytes, name: str) -> Any:
  stream = io.BytesIO(data)

  def no_storage(pid: tuple) -> np.ndarray:
    raise CheckpointFormatError(f"{name}: storage referenced outside the object pickle")

  try:
    header = [_RestrictedUnpickler(stream, no_storage).load() for _ in range(3)]
  except (pickle.UnpicklingError, EOFError) as e:
    raise CheckpointFormatError(f"{name}: not a torch checkpoint ({e})") from e
  if header[0] != _LEGACY_MAGIC or not isinstance(header[2], dict):
    raise CheckpointFormatError(f"{name}: bad magic number {header[0]!r}")
  if not header[2].get("little_endian", True):
    raise CheckpointFormatError(f"{name}: big-endian checkpoints are not supported")
  # The object pickle comes BEFORE the storage bytes, so skip it once to find the storages, then load it.
  main_start = stream.tell()
  try:
    main_end = main_start + _pickle_length(data[main_start:])
  except ValueError as e:
    raise CheckpointFormatError(f"{name}: truncated object pickle ({e})") from e
  stream.seek(main_end)
  keys = _RestrictedUnpickler(stream, no_storage).load()
  obj_pickle = data[main_start:main_end]
  # First pass over the object pickle only learns each storage's dtype (zeros stand in for the data).
  dtypes: dict[str, np.dtype] = {}

  def record(pid: tuple) -> np.ndarray:
    dtypes[pid[2]] = pid[1].dtype
    return np.zeros(pid[4], dtype=pid[1].dtype)

  _RestrictedUnpickler(io.BytesIO(obj_pickle), record).load()
  storages: dict[str, np.ndarray] = {}
  pos = stream.tell()
  for key in keys:
    if key not in dtypes:
      raise CheckpointFormatError(f"{name}: storage key {key} is never referenced")
    if pos + 8 > len(data):
      raise CheckpointFormatError(f"{name}: truncated before storage {key}")
    numel = int(np.frombuffer(data, dtype="<i8", count=1, offset=pos)[0])
    nbytes = numel * dtypes[key].itemsize
    if numel < 0 or pos + 8 + nbytes > len(data):
      raise CheckpointFormatError(f"{name}: storage {key} truncated")
    storages[key] = np.frombuffer(data, dtype=dtypes[key], count=numel, offset=pos + 8)
    pos += 8 + nbytes

  def load_storage(pid: tuple) -> np.ndarray:
    key = pid[2]
    if key not in storages:
      raise CheckpointFormatError(f"{name}: storage {key} not listed")
    return storages[key]

  return _RestrictedUnpickler(io.BytesIO(obj_pickle), load_storage).load()


def _pickle_length(data: bytes) -> int:
  """Byte length of the first pickle in `data` (walks opcodes without executing anything)."""
  for op, _arg, pos in pickletools.genops(io.BytesIO(data)):
    if op.name == "STOP":
      return pos + 1
  raise ValueError("no STOP opcode")
