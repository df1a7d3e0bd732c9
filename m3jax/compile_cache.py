"""A persistent compile cache for the entry points, so a second `ask`, a resumed training chunk or a new process
of the ablation loads its programs from disk instead of compiling them again.

WHY a directory per CPU and a load check before use: an XLA:CPU executable is built for its host's features, so
one from another CPU kind (a shared home directory, a copied cache) is rejected or, worse, run where it does not
fit. The directory name carries a digest of the host's CPU flags. And on some CPUs the loader rejects every entry,
even on the machine that wrote it (jax-ml/jax#38445: tuning attributes read as required features): there the cache
only costs disk and logs an error per program. So the first use on a machine runs the check in two short child
processes (one writes a program, the next must load it) and records the verdict in the directory; the cache is
used only where a reload was seen to hit.

Entry points (the CLI, train.py, serve.py, the ablation) call `enable()` once; the library never changes process
state on import. `M3JAX_COMPILE_CACHE=0` turns it off; `M3JAX_CACHE` moves it with the other caches.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import platform
import shutil
import subprocess
import sys

from m3jax.models.tokenizer import cache_dir

MAX_BYTES = 4 << 30  # least recently used entries are evicted past this
MIN_COMPILE_S = 0.5  # programs that compile faster than this are not worth a disk round trip
_CHECK = """
import sys, jax, jax.numpy as jnp
jax.config.update("jax_compilation_cache_dir", sys.argv[1])
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
hits = []
jax.monitoring.register_event_listener(lambda e, **_: hits.append(e == "/jax/compilation_cache/cache_hits"))
jax.jit(lambda x: jnp.tanh(x @ x.T).sum())(jnp.ones((8, 8))).block_until_ready()
print(sum(hits))
"""


def cpu_fingerprint() -> str:
  """A digest of what decides whether an executable runs here: machine, CPU model and feature flags."""
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    keep = [ln for ln in info.splitlines() if ln.split(":")[0].strip() in ("vendor_id", "model name", "flags",
                                                                           "Features", "CPU part")]
  except OSError:
    keep = [platform.processor()]
  return hashlib.sha256("\n".join([platform.machine(), *keep]).encode()).hexdigest()[:12]


def cache_path() -> pathlib.Path:
  return cache_dir() / "xla" / f"{platform.machine()}-{cpu_fingerprint()}"


def _load_check(path: pathlib.Path) -> dict:
  """Whether a program compiled into a cache here by one process loads in the next (hits counted by JAX)."""
  probe = path / f"load_check.{os.getpid()}"  # its own: processes that start together check side by side
  shutil.rmtree(probe, ignore_errors=True)
  runs = []
  for _ in range(2):
    out = subprocess.run([sys.executable, "-c", _CHECK, str(probe)], capture_output=True, text=True, timeout=300)
    runs.append(int(out.stdout.split()[-1]) if out.returncode == 0 and out.stdout.split() else -1)
  shutil.rmtree(probe, ignore_errors=True)
  verdict = {"reload_hits": runs[1], "first_hits": runs[0], "usable": runs[0] == 0 and runs[1] > 0}
  if not verdict["usable"]:
    verdict["why"] = "a program written to the cache by one process was not loaded by the next"
  return verdict


def enable() -> pathlib.Path | None:
  """Point JAX at this CPU's cache directory if the load check passes there; returns it, or None if unused. A
  cache directory the user set for JAX (`JAX_COMPILATION_CACHE_DIR`) is kept as it is."""
  import jax

  if os.environ.get("M3JAX_COMPILE_CACHE", "1") == "0":
    return None
  if jax.config.jax_compilation_cache_dir:
    return pathlib.Path(jax.config.jax_compilation_cache_dir)
  path = cache_path()
  verdict_file = path / "load_check.json"
  try:
    verdict = json.loads(verdict_file.read_text())
  except (OSError, ValueError):
    try:
      path.mkdir(parents=True, exist_ok=True)
      verdict = _load_check(path)
      tmp = verdict_file.with_suffix(f".{os.getpid()}.tmp")
      tmp.write_text(json.dumps(verdict))
      tmp.replace(verdict_file)  # atomic: processes that start together agree
    except (OSError, subprocess.SubprocessError, ValueError):
      return None  # no writable cache directory: compile as before
  if not verdict.get("usable"):
    return None
  jax.config.update("jax_compilation_cache_dir", str(path / "programs"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
  return path
