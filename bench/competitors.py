"""`bench/.venv-bench/bin/python -m bench.competitors`: which competitors this interpreter has, and at which versions
(run it after bench/setup, before a comparison that depends on them; a benchmark checks its own with
`harness.require`)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import sys

from bench.harness import result_line

# Every benchmark's competitors (import name -> PyPI package).
COMPETITORS = {"torch": "torch", "transformers": "transformers", "tunix": "google-tunix",
               "resemblyzer": "resemblyzer", "ctranslate2": "ctranslate2"}


def main() -> None:
  found = {}
  for module, package in COMPETITORS.items():
    try:
      found[package] = importlib.metadata.version(package) if importlib.util.find_spec(module) else "missing"
    except importlib.metadata.PackageNotFoundError:
      found[package] = "missing"
  print(f"python {platform.python_version()} at {sys.prefix}")
  print(result_line(**found, missing=sum(v == "missing" for v in found.values())))


if __name__ == "__main__":
  main()
