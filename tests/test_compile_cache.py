"""The entry points' persistent compile cache: used only where a reload was seen to hit, per CPU, and never over a
user's own JAX cache setting."""

import json
import os
import subprocess
import sys

from m3jax import compile_cache

# a fresh process enables the cache, then compiles one program; prints the cache directory and the hits JAX counted
_CHILD = """
import jax, jax.numpy as jnp
from m3jax import compile_cache
hits = []
jax.monitoring.register_event_listener(lambda e, **_: hits.append(e == "/jax/compilation_cache/cache_hits"))
path = compile_cache.enable()
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)  # the tiny program below compiles in ms
jax.jit(lambda x: jnp.sin(x @ x.T).sum() * 3)(jnp.ones((16, 16))).block_until_ready()
print(path, sum(hits))
"""


def _child(tmp_path, **env):
  base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  out = subprocess.run([sys.executable, "-c", _CHILD], env=dict(base, M3JAX_CACHE=str(tmp_path), **env),
                       capture_output=True, text=True, timeout=300, cwd=os.path.dirname(os.path.dirname(__file__)))
  assert out.returncode == 0, out.stderr[-2000:]
  path, hits = out.stdout.split()
  return path, int(hits)


def test_a_second_process_loads_what_the_first_compiled_where_the_load_check_passed(tmp_path):
  path, first = _child(tmp_path)
  check, = (tmp_path / "xla").glob("*/load_check.json")
  verdict = json.loads(check.read_text())
  assert check.parent.name == f"{os.uname().machine}-{compile_cache.cpu_fingerprint()}"
  if not verdict["usable"]:  # a CPU whose loader rejects its own entries (jax-ml/jax#38445): nothing is used
    assert path == "None" and verdict["why"]
    return
  assert path == str(check.parent) and first == 0
  _, second = _child(tmp_path)
  assert second > 0, "the second process compiled again"


def test_off_by_environment_and_a_recorded_failed_check_is_respected(tmp_path):
  assert _child(tmp_path, M3JAX_COMPILE_CACHE="0") == ("None", 0)
  assert not (tmp_path / "xla").exists()
  own = tmp_path / "xla" / f"{os.uname().machine}-{compile_cache.cpu_fingerprint()}"
  own.mkdir(parents=True)
  (own / "load_check.json").write_text(json.dumps({"usable": False, "why": "rejected"}))
  assert _child(tmp_path) == ("None", 0)
  assert sorted(p.name for p in own.iterdir()) == ["load_check.json"]  # the check did not run again


def test_a_cache_directory_the_user_set_is_kept(tmp_path):
  mine = tmp_path / "mine"
  path, _ = _child(tmp_path, JAX_COMPILATION_CACHE_DIR=str(mine))
  assert path == str(mine) and not (tmp_path / "xla").exists()
