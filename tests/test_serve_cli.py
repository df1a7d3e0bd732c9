"""`python serve.py` as a user runs it: the address it prints on start, and one-line errors (exit status 2, no
traceback: m3jax.errors.run_cli) for a bad setting, a busy port (found before any model loads) and a malformed tenant name."""

import os
import socket
import subprocess
import sys
import time

import httpx

from m3jax.serve.auth import hash_key

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "M3JAX_SERVE_KEYS": f"alice:{hash_key('k')}", "JAX_PLATFORMS": "cpu"}


def _serve(tmp_path, *args: str, **kw) -> subprocess.CompletedProcess | subprocess.Popen:
  cmd = [sys.executable, os.path.join(ROOT, "serve.py"), "--set", f"data_dir={tmp_path / 'data'}", "--set",
         "embedder=hashed", "--set", "keys_file=", "--set", "answerer=retrieval", *args]
  if kw.get("background"):
    return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)


def _one_line_error(out: subprocess.CompletedProcess, *needles: str) -> None:
  lines = out.stderr.strip().splitlines()
  assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("serve.py: error: "), out.stderr
  assert all(n in lines[0] for n in needles), lines[0]


def test_bad_setting_busy_port_and_bad_tenant_are_one_line_errors(tmp_path):
  _one_line_error(_serve(tmp_path, "--set", "port=99999"), "port", "99999")
  _one_line_error(_serve(tmp_path, "--set", "colour=red"), "unknown config field 'colour'")
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    # an embedder file that does not exist: had it been loaded first, that would be the error reported
    out = _serve(tmp_path, "--set", f"port={port}", "--set", f"embedder={tmp_path / 'missing.embedder.json'}")
    _one_line_error(out, f"cannot listen on 127.0.0.1:{port}", "in use")
  keys = tmp_path / "keys.txt"
  _one_line_error(_serve(tmp_path, "--set", f"keys_file={keys}", "add-key", "../x"), "tenant name '../x'")
  assert not keys.exists()


def test_prints_the_listening_address_and_serves_there(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  proc = _serve(tmp_path, "--set", f"port={port}", background=True)
  try:
    line = proc.stdout.readline()
    assert line.strip() == f"m3jax memory service listening on http://127.0.0.1:{port} (API docs at /docs)", \
        line + proc.stderr.read() if proc.poll() is not None else line
    deadline = time.time() + 60
    while True:
      try:
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).json()["status"] == "ok"
        break
      except httpx.TransportError:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.05)
  finally:
    proc.kill()
    proc.wait()
