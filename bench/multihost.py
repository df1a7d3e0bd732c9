"""Overhead of the distributed runtime: the RL learner step on 1 process x 8 CPU devices vs 2 processes x 4.

  python -m bench.multihost [--rounds 3] [--steps 5] [--rows 32] [--seq 128] [--hidden 128] [--layers 4]
                            [--micro-batch 8]

Both sides run the same jitted DAPO update (`Learner.update`, one optimizer step on a `rows` x `seq` batch in
micro-batches of `micro-batch` rows, mesh data=2 x fsdp=2 x tensor=2) on a random small Decoder.
The default sizes make a step that accumulates gradients over micro-batches as the RL configs do (4 here;
configs/rl_smollm2.py: 4 rows each) and whose compute outweighs the fixed cost of a collective: at the earlier
16 x 64 rows on a 64-wide 2-layer model, a step was a few ms of compute against ~65 collectives per step,
each a gloo round trip between the processes, so the ratio measured latency, not a training step (a real
step has ~100x more FLOPs per gradient byte still). They stay small enough for a 2-core machine (a step of
~1-2 s there under load; `--rounds 2 --steps 3` takes ~10 minutes). The 2-process side joins through
`m3jax.distributed` (coordinator on a free local port, gloo collectives between the processes); each process
feeds its rows with `jax.make_array_from_process_local_data`. Each round starts the 1-process run and then
the 2-process run (interleaved, so drifting machine load hits both alike); each run times `steps` updates after a
warm-up (compilation excluded) and reports its median; the result is the ratio of the medians over rounds.
Prints the CPU model and load; writes nothing. Final line:
RESULT multihost_overhead=<2-process step time / 1-process step time> one_ms=... two_ms=...
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

from bench.harness import machine, result_line

ROOT = pathlib.Path(__file__).resolve().parents[1]


def child(args) -> None:
  """One process of a run: joins (2 processes), times the learner update, process 0 prints its step times."""
  from m3jax import distributed
  if args.nproc > 1:
    distributed.initialize(distributed.DistributedConfig(
        enabled=True, coordinator_address=f"localhost:{args.port}", num_processes=args.nproc, process_id=args.pid,
        initialization_timeout=120, heartbeat_timeout=30))
  import jax
  import numpy as np
  from flax import nnx

  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.rl import learner as learner_lib
  cfg = DecoderConfig(vocab_size=512, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_layers=args.layers, num_heads=4, num_kv_heads=2, head_dim=args.hidden // 4,
                      tie_embeddings=True)
  lcfg = learner_lib.LearnerConfig(optim=learner_lib.OptimConfig(lr=1e-4), seq_chunk=args.seq, vocab_chunk=512,
                                   micro_batch=args.micro_batch)
  learner = learner_lib.Learner(Decoder(cfg, rngs=nnx.Rngs(0)), lcfg, mesh=distributed.global_mesh(2, 2, 2))
  rng = np.random.default_rng(0)
  n, t = args.rows, args.seq
  mask = np.ones((n, t), np.float32)
  mask[:, :t // 4] = 0
  batch = {"tokens": rng.integers(1, 512, (n, t)).astype(np.int32), "lengths": np.full(n, t, np.int32),
           "mask": mask, "advantages": rng.normal(size=(n, 1)).astype(np.float32) * mask,
           "old_logp": np.zeros((n, t), np.float32)}
  learner.update(batch, seed=0)  # compile
  times = []
  for s in range(args.steps):
    t0 = time.perf_counter()
    learner.update(batch, seed=s + 1)  # returns after the metrics reach the host: the step is complete
    times.append(time.perf_counter() - t0)
  if jax.process_index() == 0:
    print("TIMES " + json.dumps(times), flush=True)


def run(nproc: int, args, timeout: float = 600) -> float:
  """Median step time (s) of one run with `nproc` processes x 8 / nproc devices; every process is killed."""
  import portpicker
  port = portpicker.pick_unused_port() if nproc > 1 else 0
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // nproc}")
  flags = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in ("steps", "rows", "seq", "hidden", "layers",
                                                                    "micro_batch")]
  procs = [subprocess.Popen([sys.executable, "-m", "bench.multihost", "--child", f"--nproc={nproc}", f"--pid={pid}",
                             f"--port={port}", *flags], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True) for pid in range(nproc)]
  try:
    out = procs[0].communicate(timeout=timeout)[0]
    for p in procs[1:]:
      p.wait(timeout=60)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  if any(p.returncode for p in procs):
    raise SystemExit(f"multihost bench: a {nproc}-process run failed (exit codes {[p.returncode for p in procs]})")
  times = json.loads(next(line for line in out.splitlines() if line.startswith("TIMES "))[6:])
  return statistics.median_high(times)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--rounds", type=int, default=3)
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--rows", type=int, default=32)
  ap.add_argument("--seq", type=int, default=128)
  ap.add_argument("--hidden", type=int, default=128)
  ap.add_argument("--layers", type=int, default=4)
  ap.add_argument("--micro-batch", type=int, default=8, help="rows per accumulation step (0: the whole batch)")
  ap.add_argument("--child", action="store_true")
  ap.add_argument("--nproc", type=int, default=1)
  ap.add_argument("--pid", type=int, default=0)
  ap.add_argument("--port", type=int, default=0)
  args = ap.parse_args()
  if args.child:
    return child(args)
  print(machine(), flush=True)
  one, two = [], []
  for r in range(args.rounds):
    one.append(run(1, args))
    two.append(run(2, args))
    print(f"round {r}: 1x8 {one[-1] * 1e3:.1f} ms  2x4 {two[-1] * 1e3:.1f} ms  load {os.getloadavg()[0]:.1f}")
  med = statistics.median_high
  print(result_line(multihost_overhead=f"{med(two) / med(one):.2f}", one_ms=f"{med(one) * 1e3:.1f}",
                    two_ms=f"{med(two) * 1e3:.1f}"))


if __name__ == "__main__":
  main()
