"""DAPO steps per hour with the next step's rollout beside the update (`RLConfig.rollout_ahead`) against the same
steps one after the other, in one process, interleaved.

  python -m bench.rl_ahead [--steps 4] [--set k=v ...]

Two `RLProgram`s on bench/rl_throughput.py's configuration (the shipped controller's recipe, 8 questions x G=4,
dynamic sampling over at most 2 rounds), both taking the sampler's log-probs as the old policy
(recompute_old_logp=False, the learner at the sampler's temperature) so that they differ only in scheduling:
`serial` rolls out and then updates; `ahead` updates while a second thread rolls out its next step with the
parameters that update starts from. Their steps alternate (serial 1, ahead 1, serial 2, ...), so both see the
machine in the same state. Step 1 is left out of the medians: there the ahead program has nothing rolled out yet,
and both compile most of their programs. Each step's compile seconds (`m3jax.rl.step_work`) are printed; the
`*_no_compile` keys use wall - compile, the steady step of a long run.

RESULT serial_steps_per_hour=... ahead_steps_per_hour=... ahead_speedup=... serial_steps_per_hour_no_compile=...
ahead_steps_per_hour_no_compile=... ahead_speedup_no_compile=... serial_wall_s=... ahead_wall_s=...
ahead_update_s=... ahead_rollout_s=... ahead_wait_s=... steps=... cpu=...
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from m3jax.config import apply_overrides
from m3jax.host_memory import retain_freed_memory
from m3jax.rl.program import RLProgram
from bench.harness import cpu_model, machine, result_line
from bench.rl_throughput import bench_config

SAMPLER_LOGP = ["learner.temperature=0.6", "recompute_old_logp=false"]  # the recipe samples at T = 0.6


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=4)
  ap.add_argument("--out", default="runs/rl_ahead")
  ap.add_argument("--set", dest="overrides", action="append", default=[])
  args = ap.parse_args()
  if args.steps < 2:
    raise SystemExit("--steps must be >= 2 (step 1 is left out of the medians)")
  retain_freed_memory()
  print(machine(), flush=True)
  programs = {name: RLProgram(apply_overrides(bench_config(f"{args.out}/{name}"),
                                              SAMPLER_LOGP + [f"rollout_ahead={ahead}"] + args.overrides))
              for name, ahead in (("serial", "false"), ("ahead", "true"))}
  iters = {name: iter(p.dataset) for name, p in programs.items()}
  rows = {name: [] for name in programs}
  for step in range(1, args.steps + 1):
    for name, program in programs.items():
      t0 = time.perf_counter()
      m = program.train_step(iters[name], step)
      wall = time.perf_counter() - t0
      rows[name].append({"wall": wall, "compile": m.get("time/compile_s", 0.0), "update": m.get("time/update_s", 0.0),
                         "rollout": m["time/rollout_s"], "wait": m.get("time/ahead_wait_s", 0.0),
                         "kept": m.get("ds/batch_groups", 0.0)})
      r = rows[name][-1]
      print(f"{name} step {step}: wall {wall:.1f} s (compiling {r['compile']:.1f}), update {r['update']:.1f} s, its "
            f"rollout {r['rollout']:.1f} s{' (ran ahead)' if m.get('rollout/ahead') else ''}, waited for the next "
            f"rollout {r['wait']:.1f} s, {r['kept']:.0f} groups kept; load {os.getloadavg()[0]:.2f}", flush=True)
  med = lambda name, f: statistics.median(f(r) for r in rows[name][1:])
  wall = {n: med(n, lambda r: r["wall"]) for n in programs}
  steady = {n: med(n, lambda r: r["wall"] - r["compile"]) for n in programs}
  print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  print(result_line(
      serial_steps_per_hour=f"{3600 / wall['serial']:.2f}", ahead_steps_per_hour=f"{3600 / wall['ahead']:.2f}",
      ahead_speedup=f"{wall['serial'] / wall['ahead']:.3f}",
      serial_steps_per_hour_no_compile=f"{3600 / steady['serial']:.2f}",
      ahead_steps_per_hour_no_compile=f"{3600 / steady['ahead']:.2f}",
      ahead_speedup_no_compile=f"{steady['serial'] / steady['ahead']:.3f}",
      serial_wall_s=f"{wall['serial']:.1f}", ahead_wall_s=f"{wall['ahead']:.1f}",
      ahead_update_s=f"{med('ahead', lambda r: r['update']):.1f}",
      ahead_rollout_s=f"{med('ahead', lambda r: r['rollout']):.1f}",
      ahead_wait_s=f"{med('ahead', lambda r: r['wait']):.1f}", steps=args.steps,
      cpu=cpu_model().replace(" ", "_")))


if __name__ == "__main__":
  main()
