"""The benchmarks' competitors are not m3jax dependencies: `bench/setup` installs them, pinned, into
bench/.venv-bench. A benchmark calls `require` before importing one, so a missing competitor ends it with one line
saying what to run instead of an ImportError traceback."""

from __future__ import annotations

import importlib.util
import pathlib
import sys


def require(modules: dict[str, str]) -> None:
  """`modules`: import name -> the package that provides it. Exits (status 2) with one line naming the missing
  packages and the command that installs them."""
  missing = [package for module, package in modules.items() if importlib.util.find_spec(module) is None]
  if missing:
    script = f"bench/{pathlib.Path(sys.argv[0]).name}"
    print(f"{script}: its competitor needs {', '.join(missing)}, not installed in {sys.prefix}; run bench/setup, "
          f"then bench/.venv-bench/bin/python {script}", file=sys.stderr)
    sys.exit(2)


def cpu_model() -> str:
  """lscpu's model name: a speed ratio only means something next to the CPU it was measured on."""
  import subprocess

  out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")


# Every benchmark's competitors (import name -> PyPI package), for the check below.
COMPETITORS = {"torch": "torch", "transformers": "transformers", "tunix": "google-tunix",
               "resemblyzer": "resemblyzer", "ctranslate2": "ctranslate2"}


def main() -> None:
  """`bench/.venv-bench/bin/python bench/competitors.py`: which competitors this interpreter has, and at which
  versions (run it after bench/setup, before a comparison that depends on them)."""
  import importlib.metadata
  import platform

  found = {}
  for module, package in COMPETITORS.items():
    try:
      found[package] = importlib.metadata.version(package) if importlib.util.find_spec(module) else "missing"
    except importlib.metadata.PackageNotFoundError:
      found[package] = "missing"
  print(f"python {platform.python_version()} at {sys.prefix}")
  print("RESULT " + " ".join(f"{p}={v}" for p, v in found.items())
        + f" missing={sum(v == 'missing' for v in found.values())}")


if __name__ == "__main__":
  main()
