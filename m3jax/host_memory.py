"""Keep freed host memory for reuse, so XLA:CPU executions stop paying for fresh pages on every call.

XLA:CPU allocates an executable's temporaries (one buffer, tens of MB for a training step) with malloc on each
call. glibc serves blocks above its mmap threshold (at most 32 MB, dynamically) with a fresh mmap and returns them
to the kernel on free, so every call faults in and zero-fills the whole buffer again: the tiny thinker's SFT step
(62 MB of temporaries) took ~15k page faults and ~30 ms of system time per call on a 2-core CPU, half of its
wall time. Raising the mmap and trim thresholds keeps those pages in the heap between calls. This is what the
JAX docs get from preloading tcmalloc, without asking users to change how they launch Python.

Entry points (the CLI, train.py, serve.py, the benchmarks, the test session) call `retain_freed_memory()` once;
the library never changes process state on import. It is a no-op (returns False) where glibc's `mallopt` is
missing (macOS, musl).

The second thing a long process must watch is its count of memory mappings: see `release_executables`.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_THRESHOLD = 1 << 30  # blocks up to 1 GiB come from (and go back to) the heap, not fresh mappings
_TOP_PAD = 64 << 20  # grow the heap in 64 MB steps


def retain_freed_memory() -> bool:
  """Configure glibc malloc for XLA:CPU's per-call temporaries (see the module docstring); True if applied."""
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
  except (OSError, AttributeError):
    return False
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  return all(mallopt(param, value) == 1 for param, value in
             ((_M_MMAP_THRESHOLD, _THRESHOLD), (_M_TRIM_THRESHOLD, _THRESHOLD), (_M_TOP_PAD, _TOP_PAD)))


def map_limit() -> int:
  """The kernel's per-process limit on memory mappings (`vm.max_map_count`); 0 where there is none to read."""
  try:
    with open("/proc/sys/vm/max_map_count") as limit:
      return int(limit.read())
  except (OSError, ValueError):  # not Linux
    return 0


def release_executables(fraction: float = 0.5) -> bool:
  """Drops JAX's in-memory executables once this process holds `fraction` of its memory-map limit; True if so.

  WHY: XLA:CPU maps about three regions per compiled executable and JAX keeps every one it compiled. A long
  process that meets many shapes (an RL run's learner compiles one program per call shape; the ablation trains and
  evaluates nine runs in one process) passes `vm.max_map_count` (65530 by default), and the next compile's mmap
  fails inside LLVM ("Cannot allocate memory", then a segfault). Clearing unmaps them; what runs next compiles
  again, or loads from the persistent compile cache (`m3jax.compile_cache`). Long loops call this between steps;
  it costs one read of /proc/self/maps."""
  limit = map_limit()
  if not limit:
    return False
  try:
    with open("/proc/self/maps") as maps:
      held = sum(1 for _ in maps)
  except OSError:
    return False
  if held <= fraction * limit:
    return False
  import gc

  import jax

  jax.clear_caches()
  gc.collect()
  return True
