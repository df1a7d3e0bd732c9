"""Serving benchmark: questions/s and p50/p99 latency at concurrency 1, 8, 32, 64 against a local server.

  python -m bench.serve [--clips 64] [--requests 256] [--rounds 3] [--embedder minilm]

Two `serve.py` processes on 127.0.0.1 over copies of the same space (MiniLM embedder, retrieval answers, the
embedder's shapes precompiled before timing): m3jax with dynamic batching (max_batch 64, max_wait 5 ms) and the
same server with max_batch 1 (every question answered alone: one embedder call and one search call each) as
the baseline. Every question text is unique, so the embedding cache never answers for the model. Clients are
raw asyncio HTTP/1.1 keep-alive connections in this process. Each level is warmed up untimed first. At
concurrency 64 the two servers are timed in alternating rounds (medians reported), because the machine may be
shared and its load drifts; the server's CPU time per question is reported too (the work an answer costs,
whatever share of the machine the server got). `--embedder hashed` isolates the serving stack (no model).
Final line: RESULT ask_qps_c64=... batching_gain=... p99_ms_c64=... mean_batch_c64=... ask_qps_c1=...
p50_ms_c1=... cpu_ms_per_q_c64=... cpu_ms_per_q_batch1=... cpu_gain=...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import httpx
import numpy as np

from m3jax.serve.auth import hash_key
from bench.harness import machine, result_line

ROOT = pathlib.Path(__file__).resolve().parents[1]

KEY = "bench-key"
HEADERS = {"X-API-Key": KEY}
PEOPLE = ["Anna", "Ben", "Carla", "Dev", "Emil", "Fatima", "Gus", "Hana"]
ACTS = ["cooks soup", "reads a letter", "repairs a bike", "waters plants", "plays chess", "paints a wall",
        "feeds the cat", "writes an email"]
PLACES = ["in the kitchen", "on the balcony", "in the garage", "at the desk", "in the garden", "by the window"]


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def start_server(data: pathlib.Path, max_batch: int, embedder: str) -> tuple[subprocess.Popen, str]:
  port = _port()
  env = {**os.environ, "M3JAX_SERVE_KEYS": f"bench:{hash_key(KEY)}"}
  cmd = [sys.executable, str(ROOT / "serve.py"), "--config", str(ROOT / "configs/serve.py"), "--set",
         f"data_dir={data}", "--set", "keys_file=", "--set", f"embedder={embedder}", "--set", f"port={port}",
         "--set", f"max_batch={max_batch}", "--set", "max_wait_ms=5.0"]
  proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL)
  url = f"http://127.0.0.1:{port}"
  deadline = time.time() + 300
  while time.time() < deadline:
    if proc.poll() is not None:
      raise RuntimeError("server exited during start-up")
    try:
      health = httpx.get(url + "/healthz", timeout=1)
      if health.status_code == 200 and health.json()["warm"]:        # embedder shapes precompiled
        return proc, url
    except httpx.TransportError:
      pass
    time.sleep(0.2)
  proc.kill()
  raise RuntimeError("server did not start")


def populate(url: str, clips: int) -> str:
  rng = np.random.default_rng(0)
  with httpx.Client(base_url=url, timeout=300, headers=HEADERS) as c:
    sid = c.post("/v1/spaces", json={"name": "bench"}).json()["id"]
    for k in range(clips):
      ep = [f"{PEOPLE[rng.integers(8)]} {ACTS[rng.integers(8)]} {PLACES[rng.integers(6)]} in scene {k}."
            for _ in range(4)]
      r = c.post(f"/v1/spaces/{sid}/clips", json={"episodic": ep, "semantic": [f"{PEOPLE[k % 8]} is busy {k}."]})
      r.raise_for_status()
  return sid


async def _post(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, path: str,
                body: bytes) -> int:
  """One keep-alive HTTP/1.1 POST on an open connection; returns the status (the body is read and dropped)."""
  writer.write(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {KEY}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
  await writer.drain()
  head = await reader.readuntil(b"\r\n\r\n")
  status = int(head.split(b" ", 2)[1])
  length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
  await reader.readexactly(length)
  return status


_TOKENIZER = None


def questions(tag: str, n: int, tokens: int = 16) -> list[str]:
  """`n` distinct questions, each exactly `tokens` MiniLM tokens long (with [CLS]/[SEP]), so every run embeds
  the same amount of text whatever its tag (word pieces of the tag and the number vary in count)."""
  global _TOKENIZER
  if _TOKENIZER is None:
    from m3jax.models.bert import _load_tokenizer, default_model_dir
    _TOKENIZER = _load_tokenizer(default_model_dir(), 256)
  out, k = [], 0
  while len(out) < n:
    batch = [f"When did {PEOPLE[i % 8]} {ACTS[(i // 8) % 8].split()[0]} {PLACES[i % 6]}? ({tag} {i})"
             for i in range(k, k + 4 * n)]
    out += [q for q, ids in zip(batch, _TOKENIZER(batch)) if len(ids) == tokens]
    k += 4 * n
  return out[:n]


async def load(url: str, sid: str, concurrency: int, requests: int, tag: str) -> tuple[float, float, float]:
  """(questions/s, p50 ms, p99 ms) for `requests` single-question asks from `concurrency` keep-alive clients.

  WHY raw asyncio streams: on a small machine httpx's pooled client costs more CPU per request than the server
  and saturates first at high concurrency, so it would measure itself."""
  latencies: list[float] = []
  texts = questions(tag, requests)
  counter = iter(range(requests))
  host, port = url.removeprefix("http://").split(":")

  async def client():
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
      for i in counter:
        t = time.perf_counter()
        status = await _post(reader, writer, host, f"/v1/spaces/{sid}/ask",
                             json.dumps({"question": texts[i]}).encode())
        if status != 200:
          raise RuntimeError(f"ask answered {status}")
        latencies.append(time.perf_counter() - t)
    finally:
      writer.close()

  start = time.perf_counter()
  await asyncio.gather(*(client() for _ in range(concurrency)))
  wall = time.perf_counter() - start
  lat = np.asarray(latencies) * 1000
  return requests / wall, float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def batch_stats(url: str) -> tuple[float, float, float]:
  """(batches, questions, seconds inside batch calls) so far, from the server's /metrics."""
  text = httpx.get(url + "/metrics", timeout=30).text
  vals = dict(line.split() for line in text.splitlines() if line and not line.startswith("#") and "{" not in line)
  return (float(vals["m3jax_batches_total"]), float(vals["m3jax_batched_questions_total"]),
          float(vals["m3jax_batch_seconds_total"]))


def server_cpu_s(proc: subprocess.Popen) -> float:
  """CPU seconds (user + system, all threads) the server process has used so far."""
  fields = pathlib.Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_level(proc: subprocess.Popen, url: str, sid: str, conc: int, n: int, tag: str) -> dict:
  """load() plus the server's mean batch size, the share of wall time spent inside batch calls and the server's
  CPU milliseconds per question (the work each answer costs, whatever share of the machine the server got)."""
  before, cpu = batch_stats(url), server_cpu_s(proc)
  t = time.perf_counter()
  qps, p50, p99 = asyncio.run(load(url, sid, conc, n, tag))
  wall = time.perf_counter() - t
  cpu = server_cpu_s(proc) - cpu
  batches, items, secs = (a - b for a, b in zip(batch_stats(url), before))
  return {"qps": qps, "p50": p50, "p99": p99, "batch": items / max(batches, 1), "share": secs / wall,
          "cpu_ms_q": 1000 * cpu / n, "cpus": cpu / wall}


def report(name: str, conc: int, r: dict) -> None:
  print(f"{name} c={conc:2d}: {r['qps']:7.1f} q/s  p50 {r['p50']:7.1f} ms  p99 {r['p99']:7.1f} ms  mean batch "
        f"{r['batch']:5.1f}  in-batch share {r['share']:.2f}  server CPU {r['cpu_ms_q']:5.2f} ms/question "
        f"({r['cpus']:.2f} cores)", flush=True)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--clips", type=int, default=64)
  p.add_argument("--requests", type=int, default=256)
  p.add_argument("--rounds", type=int, default=3, help="alternating batched / batch=1 rounds at concurrency 64")
  p.add_argument("--embedder", default="minilm")
  args = p.parse_args()
  tmp = pathlib.Path(tempfile.mkdtemp(prefix="m3jax_bench_serve_"))
  print(machine(), flush=True)
  results: dict = {}
  procs = []
  try:
    proc, url = start_server(tmp / "batched", 64, args.embedder)
    try:
      t = time.perf_counter()
      sid = populate(url, args.clips)
      print(f"populated {args.clips} clips in {time.perf_counter() - t:.1f}s", flush=True)
    finally:
      proc.terminate()
      proc.wait()
    shutil.copytree(tmp / "batched", tmp / "single")                 # the same space for the baseline
    servers = {}
    for name, max_batch in (("batched", 64), ("single", 1)):
      proc, url = start_server(tmp / name, max_batch, args.embedder)
      procs.append(proc)
      servers[name] = (proc, url)
    proc, url = servers["batched"]
    for conc in (1, 8, 32, 64):
      asyncio.run(load(url, sid, conc, 4 * conc, f"w{conc}"))   # untimed: compiles this level's batch shapes
      n = args.requests if conc > 1 else max(16, args.requests // 8)
      results[("batched", conc)] = [timed_level(proc, url, sid, conc, n, f"b{conc}")]
      report("batched ", conc, results[("batched", conc)][0])
    asyncio.run(load(servers["single"][1], sid, 64, 128, "warm"))
    # WHY alternate: the machine is shared, and its load drifts; interleaved rounds see the same conditions
    results[("single", 64)] = []
    for i, name in enumerate((["single", "batched"] * args.rounds)[:-1]):   # b s b s ... s: `rounds` of each
      proc, url = servers[name]
      results[(name, 64)].append(timed_level(proc, url, sid, 64, args.requests, f"r{i}"))
      report("batched " if name == "batched" else "batch=1 ", 64, results[(name, 64)][-1])
  finally:
    for proc in procs:
      proc.terminate()
      proc.wait()
    shutil.rmtree(tmp, ignore_errors=True)
  med = {k: {f: float(np.median([r[f] for r in v])) for f in v[0]} for k, v in results.items()}
  b, s1 = med[("batched", 64)], med[("single", 64)]
  print(f"load average (1 min) at end {os.getloadavg()[0]:.2f}")
  print(result_line(ask_qps_c64=f"{b['qps']:.1f}", batching_gain=f"{b['qps'] / s1['qps']:.2f}",
                    p99_ms_c64=f"{b['p99']:.1f}", mean_batch_c64=f"{b['batch']:.1f}",
                    ask_qps_c1=f"{med['batched', 1]['qps']:.1f}", p50_ms_c1=f"{med['batched', 1]['p50']:.1f}",
                    cpu_ms_per_q_c64=f"{b['cpu_ms_q']:.2f}", cpu_ms_per_q_batch1=f"{s1['cpu_ms_q']:.2f}",
                    cpu_gain=f"{s1['cpu_ms_q'] / b['cpu_ms_q']:.2f}"))


if __name__ == "__main__":
  main()
