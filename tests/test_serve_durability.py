"""`kill -9` of a serving process while clips stream in loses no acknowledged clip (4 kills, 4 writers).

The server runs as a real `python serve.py` subprocess on 127.0.0.1. Each round: four client threads append
clips (the server picks the clip id) until the process is SIGKILLed at a varying moment; the restarted server
must hold every clip whose write was acknowledged (201), with exactly the memories that were sent, and accept
new clips after it. Snapshots every 3 clips put kills both mid-snapshot and mid-replay-log.
"""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from m3jax.serve.auth import hash_key

ROOT = pathlib.Path(__file__).resolve().parents[1]
KEY = "durable-key"
HEADERS = {"X-API-Key": KEY}


def _start(data: pathlib.Path, port: int, extra: list[str] = ()) -> subprocess.Popen:
  env = {**os.environ, "M3JAX_SERVE_KEYS": f"alice:{hash_key(KEY)}", "JAX_PLATFORMS": "cpu"}
  cmd = [sys.executable, str(ROOT / "serve.py"), "--config", str(ROOT / "configs/serve.py"), "--set",
         f"data_dir={data}", "--set", "keys_file=", "--set", "embedder=hashed", "--set", f"port={port}",
         "--set", "snapshot_every=3", "--set", "max_wait_ms=1.0", *extra]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 120
  while time.time() < deadline:
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    try:
      if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
        return proc
    except httpx.TransportError:
      time.sleep(0.1)
  proc.kill()
  raise AssertionError("server did not come up")


def _writer(url: str, sid: str, tag: str, acked: list, stop: threading.Event) -> None:
  with httpx.Client(base_url=url, timeout=10) as c:
    n = 0
    while not stop.is_set():
      body = {"episodic": [f"{tag} episode {n} happens.", f"{tag} sees item {n}."], "semantic": [f"{tag} fact {n}."]}
      try:
        r = c.post(f"/v1/spaces/{sid}/clips", json=body, headers=HEADERS)
      except httpx.TransportError:
        return                                   # the server died mid-request: not acknowledged
      if r.status_code != 201:
        return
      acked.append((r.json()["clip_id"], body))
      n += 1


def test_kill_9_loses_no_acknowledged_clip(tmp_path):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  proc = _start(tmp_path / "data", port)
  sid = httpx.post(f"{url}/v1/spaces", json={"name": "stream"}, headers=HEADERS).json()["id"]
  acked: list = []
  try:
    for round_index in range(4):
      stop = threading.Event()
      threads = [threading.Thread(target=_writer, args=(url, sid, f"r{round_index}w{w}", acked, stop))
                 for w in range(4)]
      for t in threads:
        t.start()
      time.sleep(0.4 + 0.23 * round_index)
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      stop.set()
      for t in threads:
        t.join()
      proc = _start(tmp_path / "data", port)
      with httpx.Client(base_url=url, timeout=30) as c:
        stored = {}
        for clip_id in sorted({cid for cid, _ in acked}):
          r = c.get(f"/v1/spaces/{sid}/clips/{clip_id}", headers=HEADERS)
          assert r.status_code == 200, f"round {round_index}: acknowledged clip {clip_id} lost"
          stored[clip_id] = [m["text"] for m in r.json()["memories"]]
        for clip_id, body in acked:
          assert stored[clip_id] == body["episodic"] + body["semantic"]
        info = c.get(f"/v1/spaces/{sid}", headers=HEADERS).json()
        assert info["max_clip"] >= max(cid for cid, _ in acked)
    assert len(acked) >= 16                      # the kills really interrupted a stream of writes
  finally:
    proc.kill()
    proc.wait()
