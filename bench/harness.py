"""What every benchmark shares, so that each states only what it measures: the machine line a speed number needs
beside it, the timer, the competitor check and the final `RESULT key=value ...` line the README and the tests read.
Benchmarks run from the repository root as `python -m bench.NAME`, which puts m3jax and bench/ on the path."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time


def require(modules: dict[str, str]) -> None:
  """Competitors are not m3jax dependencies (`bench/setup` installs them, pinned, into bench/.venv-bench); a
  benchmark calls this before importing one. `modules`: import name -> the package that provides it. Exits (status
  2) with one line naming the missing packages and the command to run instead of an ImportError traceback."""
  missing = [package for module, package in modules.items() if importlib.util.find_spec(module) is None]
  if missing:
    script = f"bench.{os.path.splitext(os.path.basename(sys.argv[0]))[0]}"
    print(f"{script}: its competitor needs {', '.join(missing)}, not installed in {sys.prefix}; run bench/setup, "
          f"then bench/.venv-bench/bin/python -m {script}", file=sys.stderr)
    sys.exit(2)


def cpu_model() -> str:
  """lscpu's model name: a speed ratio only means something next to the CPU it was measured on."""
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
  except OSError:
    return "unknown"
  return next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")),
              "unknown")


def machine() -> str:
  """The line a benchmark prints first: on a shared machine the load says how far its times can be trusted. Cores
  are those this process may run on (`taskset -c 0` makes it 1), which is what thread pools size themselves to."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  load = " ".join(f"{x:.2f}" for x in os.getloadavg())
  return f"cpu: {cpu_model()}, {cores} cores; load average {load}"


def best_time(fn, repeats: int) -> tuple[float, object]:
  """(seconds of the fastest of `repeats` calls of `fn`, the last call's output): the fastest run is the one least
  disturbed by other work on the machine."""
  out, best = None, float("inf")
  for _ in range(repeats):
    t = time.perf_counter()
    out = fn()
    best = min(best, time.perf_counter() - t)
  return best, out


def result_line(**fields) -> str:
  """`RESULT k=v ...` in the order given; a value with a space is quoted so the line still splits on spaces."""
  return "RESULT " + " ".join(f'{k}="{v}"' if " " in str(v) else f"{k}={v}" for k, v in fields.items())
