"""m3jax.host_memory: with freed memory retained (what the entry points and the test session do), repeated
XLA:CPU executions reuse their host buffers instead of faulting in fresh pages on every call."""

import subprocess
import sys

PROGRAM = """
import resource, sys
import jax, jax.numpy as jnp
from m3jax.host_memory import retain_freed_memory
if sys.argv[1] == "retain":
  assert retain_freed_memory()

@jax.jit
def f(x):  # 4 MB intermediates (above glibc's default mmap threshold)
  a = jnp.tanh(x @ x.T)
  b = jnp.tanh(a @ a)
  return jnp.sum(b @ a)

x = jnp.full((1024, 1024), 1e-3, jnp.float32)
for _ in range(3):
  jax.block_until_ready(f(x))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
  jax.block_until_ready(f(x))
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _page_faults(mode: str) -> int:
  out = subprocess.run([sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True)
  return int(out.stdout.split()[-1])


def test_repeated_executions_stop_faulting_in_fresh_pages():
  default, retained = _page_faults("default"), _page_faults("retain")
  assert default > 50_000  # glibc's defaults: every call maps and zero-fills its buffers again (~17k faults/call)
  assert retained < default / 10, (retained, default)


def test_executables_are_released_only_past_the_map_limit_share(monkeypatch):
  """Near the kernel's map limit JAX's executables are dropped (a long RL run or the ablation otherwise segfaults
  inside LLVM once its compiles pass vm.max_map_count); below it nothing is touched."""
  import jax
  import jax.numpy as jnp
  from m3jax import host_memory

  f = jax.jit(lambda x: jnp.cos(x) * 2 + 1)
  f(jnp.ones(3))
  with open("/proc/self/maps") as maps:
    held = sum(1 for _ in maps)
  monkeypatch.setattr(host_memory, "map_limit", lambda: 4 * held)
  assert not host_memory.release_executables(0.5) and f._cache_size() == 1  # a quarter of the limit: kept
  monkeypatch.setattr(host_memory, "map_limit", lambda: held)
  assert host_memory.release_executables(0.5) and f._cache_size() == 0  # past half of it: released
  monkeypatch.setattr(host_memory, "map_limit", lambda: 0)  # no limit to read (not Linux): never
  f(jnp.ones(3))
  assert not host_memory.release_executables(0.0) and f._cache_size() == 1
