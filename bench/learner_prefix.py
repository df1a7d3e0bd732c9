"""The DAPO learner with and without shared-prefix calls, on the rollout batches of real DAPO steps, one process.

  python -m bench.learner_prefix [--steps 1] [--reps 2] [--bucket 64] [--plain-bucket 256] [--set k=v ...]

bench/rl_throughput.py's configuration (the shipped controller's recipe at 8 questions x G=4, dynamic sampling over
2 rounds, from the shipped adapter) runs `--steps` DAPO steps; every rollout batch its learner trains on is kept.
Then two learners over the same model, both starting from the adapter and optimizer state the first step started
from, train on each kept batch in turn, interleaved, `--reps` times after one compiling call each: the recipe's
learner without shared prefixes (`plain`: rows sorted by length in micro-batches of 2, each cut to a multiple of
`--plain-bucket`, as the recipe ran before) and with `share_prefix` = G and `length_bucket` = `--bucket`
(`shared`: each group's common prefix computed once, m3jax.rl.learner). Both must
give the same losses and gradient norms (printed: their largest relative difference). `compile_s` is each
learner's first call minus its median: what the extra shapes cost a process once.

Final line: RESULT shared_speedup=<plain median / shared median, summed over batches> plain_s=... shared_s=...
compile_plain_s=... compile_shared_s=... positions_ratio=<positions the shared calls compute / the plain ones>
max_loss_rel_diff=... batches=... cpu=...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import jax
import numpy as np

from m3jax.config import apply_overrides
from m3jax.host_memory import retain_freed_memory
from m3jax.rl.learner import Learner
from m3jax.rl.program import RLProgram
from bench.harness import cpu_model, machine, result_line
from bench.rl_throughput import bench_config


def positions(learner: Learner, batch: dict) -> int:
  """Token positions the learner's calls compute on `batch` (a shared prefix once per call)."""
  return sum(p + idx.size * (w - p) for idx, w, p in learner._calls(batch, np.arange(len(batch["lengths"]))))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=1)
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--bucket", type=int, default=64)
  ap.add_argument("--plain-bucket", type=int, default=256)
  ap.add_argument("--set", dest="overrides", action="append", default=[])
  args = ap.parse_args()
  retain_freed_memory()
  print(machine(), flush=True)
  program = RLProgram(apply_overrides(bench_config("runs/learner_prefix"), args.overrides))
  c = program.cfg
  start = jax.tree.map(np.array, jax.device_get(program.learner.state()))
  batches, update = [], program.learner.update

  def keep(batch, seed):
    batches.append(({k: np.array(v) for k, v in batch.items()}, seed))
    return update(batch, seed)

  program.learner.update = keep
  it = iter(program.dataset)
  for step in range(1, args.steps + 1):
    program.train_step(it, step)
  print(f"{len(batches)} rollout batches kept over {args.steps} steps", flush=True)
  plain_cfg = dataclasses.replace(c.learner, share_prefix=0, length_bucket=args.plain_bucket)
  shared_cfg = dataclasses.replace(c.learner, share_prefix=c.group_size, length_bucket=args.bucket)
  learners = {"plain": Learner(program.model, plain_cfg), "shared": Learner(program.model, shared_cfg)}
  times = {name: [[] for _ in batches] for name in learners}
  losses = {name: [None for _ in batches] for name in learners}
  for rep in range(args.reps + 1):  # rep 0 compiles
    for b, (batch, seed) in enumerate(batches):
      for name, lrn in learners.items():
        lrn.restore(jax.tree.map(lambda x: jax.device_put(x, jax.devices()[0]), start))
        t0 = time.perf_counter()
        hist = lrn.update(dict(batch), seed)
        times[name][b].append(time.perf_counter() - t0)
        losses[name][b] = np.array([[h["loss"], h["grad_norm"]] for h in hist])
        print(f"rep {rep} batch {b} {name:6s} {times[name][b][-1]:7.1f} s  loss {hist[0]['loss']:.6f} "
              f"grad_norm {hist[0]['grad_norm']:.6f}  load {os.getloadavg()[0]:.2f}", flush=True)
  med = {n: [statistics.median(t[1:]) for t in times[n]] for n in learners}
  comp = {n: sum(t[0] - m for t, m in zip(times[n], med[n])) for n in learners}
  rel = max(float(np.max(np.abs(s - p) / np.maximum(np.abs(p), 1e-12)))
            for s, p in zip(losses["shared"], losses["plain"]))
  pos = {n: sum(positions(lrn, b) for b, _ in batches) for n, lrn in learners.items()}
  print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(result_line(shared_speedup=f"{sum(med['plain']) / sum(med['shared']):.2f}", plain_s=f"{sum(med['plain']):.1f}",
                    shared_s=f"{sum(med['shared']):.1f}", compile_plain_s=f"{comp['plain']:.1f}",
                    compile_shared_s=f"{comp['shared']:.1f}", positions_ratio=f"{pos['shared'] / pos['plain']:.3f}",
                    max_loss_rel_diff=f"{rel:.1e}", batches=len(batches), cpu=cpu_model().replace(" ", "_")))


if __name__ == "__main__":
  main()
