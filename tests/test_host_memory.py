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
