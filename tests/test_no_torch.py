"""No runtime command imports torch (a test-only dependency): tests/no_torch_paths.py runs each of them in a
subprocess whose site-packages lacks torch, with an empty m3jax cache."""

import pathlib
import subprocess
import sys
import sysconfig

import pytest

pytestmark = pytest.mark.slow
SCRIPT = pathlib.Path(__file__).with_name("no_torch_paths.py")


def test_every_runtime_command_runs_where_torch_is_not_installed(tmp_path):
  from test_omni_writer import save_tiny_omni  # made here, with torch: the omni writer's model directory
  omni = save_tiny_omni(tmp_path / "tiny_omni")
  try:
    out = subprocess.run([sys.executable, "-S", str(SCRIPT), str(tmp_path), sysconfig.get_paths()["purelib"], omni],
                         capture_output=True, text=True, timeout=1500)
  except subprocess.TimeoutExpired as e:  # which commands finished, and the last one's stderr
    pytest.fail(f"timed out after {e.timeout} s:\n{e.stdout or ''}\n{(e.stderr or '')[-3000:]}")
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
  assert "all runtime paths ran without torch" in out.stdout
  assert "Traceback" not in out.stderr and "PyTorch was not found" not in out.stderr, out.stderr[-3000:]
