"""A plain clone works anywhere: no source file reaches outside the checkout for data, and everything the installed
package reads ships with it. `.ci/run` also runs the suite from a copy with nothing beside it; these checks name
the offending line directly."""

import fnmatch
import pathlib
import re
import tomllib

from m3jax.config import load_config
from m3jax.memory.embedders import make_embedder

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCANNED = ("m3jax", "configs", "bench", "tests", ".ci", "train.py", "serve.py", "m3", "pyproject.toml", "README.md")
SKIPPED_DIRS = {"__pycache__", ".pytest_cache", ".hypothesis"}
BINARY = {".pkl", ".npz", ".npy", ".pyc", ".png", ".jpg", ".wav", ".mp4"}
# a path into the sibling directory DIR beside the checkout: the parent directory then DIR, DIR then fixtures (data,
# reference, hooks),
# or a pathlib join with a DIR component; plain words ("shared prefix", "shared by both") do not match
# (the directory's name is spelled through DIR so that this file holds no such path itself)
DIR = "sha" + "red"
UP, SEP = re.escape(".."), "/"
OUTSIDE = re.compile(UP + SEP + DIR + r"\b|\b" + DIR + SEP + r"(?:fixtures|data|reference|hooks)\b"
                     + r"|/\s*[\"']" + DIR + r"[\"']|[\"']" + DIR + r"[\"']\s*/")


def _path(*parts: str) -> str:
  return SEP.join(parts)


def _files():
  for name in SCANNED:
    path = ROOT / name
    for f in sorted(path.rglob("*")) if path.is_dir() else [path]:
      if f.is_file() and f.suffix not in BINARY and not SKIPPED_DIRS & set(f.relative_to(ROOT).parts):
        yield f


def test_outside_pattern_is_precise():
  hits = [f'FIX = ROOT.parent / "{DIR}" / "fixtures"', "annotations=" + _path("..", DIR, "data", "robot.json"),
          "see " + _path(DIR, "reference", "architecture.md"), f"parents[2] / '{DIR}'"]
  misses = ["a shared prefix of the prompt", "shared by both sides", "on a shared machine", "shared_cache",
            "shared/ beside it", '"shared"']
  assert all(OUTSIDE.search(s) for s in hits)
  assert not any(OUTSIDE.search(s) for s in misses)


def test_no_source_reads_a_shared_directory_beside_the_checkout():
  me = pathlib.Path(__file__).resolve()
  found = [f"{f.relative_to(ROOT)}:{i}: {line.strip()}" for f in _files() if f != me
           for i, line in enumerate(f.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
           if OUTSIDE.search(line)]
  assert not found, "paths outside the checkout:\n" + "\n".join(found)


def test_package_files_are_declared_package_data():
  """A wheel carries only `.py` files and what `[tool.setuptools.package-data]` lists."""
  declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
  missing = []
  for f in _files():
    rel = f.relative_to(ROOT)
    if rel.parts[0] != "m3jax" or f.suffix == ".py":
      continue
    if not any(fnmatch.fnmatch(f.relative_to(ROOT / pkg.replace(".", "/")).as_posix(), g)
               for pkg, globs in declared.items() if f.is_relative_to(ROOT / pkg.replace(".", "/")) for g in globs):
      missing.append(str(rel))
  assert not missing, f"not in [tool.setuptools.package-data]: {missing}"


def test_config_embedders_are_built_in():
  """The RL, eval and serve configs name embedders that need no file outside the package."""
  for name in ("rl_tiny.py", "rl_smollm2.py", "eval.py", "serve.py"):
    embedder = load_config(ROOT / "configs" / name, []).embedder
    assert embedder in ("hashed", "minilm"), (name, embedder)
  assert make_embedder(load_config(ROOT / "configs" / "rl_tiny.py", []).embedder)(["x"]).shape == (1, 64)
