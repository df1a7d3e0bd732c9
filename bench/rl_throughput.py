"""DAPO wall clock: steps and kept trajectories per hour, and where a step's time goes.

  python bench/rl_throughput.py [--steps 2] [--out runs/rl_throughput] [--set k=v ...]

The shipped controller's training setup (configs/rl_controller.py: SmolLM2-135M-Instruct, rank-8 LoRA, MiniLM
retrieval, the 5-round protocol, 48-token turns, sampling T=0.6 / top-p 0.95 / top-k 20, token-mean DAPO loss with
clip-higher) at bench/rl_learn.py's batch: 8 questions x G=4 per step, dynamic sampling of mixed-outcome groups
over at most 2 generation rounds. It starts from the shipped adapter with no warm start, so the groups are mixed as
in a real run from it (a prompted 135M model answers nothing and no group would be kept). Each of `--steps`
`RLProgram.train_step`s is timed: `rollout_s` and `learner_s` as the program measures them, `other_s` the rest of
the step (judging, batch building, advantages); checkpoints are not written. Medians over the steps.

Printed per step, then the final line:
RESULT dapo_steps_per_hour=... trajectories_kept_per_hour=... rollout_s=... learner_s=... other_s=...
prefill_tokens_saved=... slot_utilisation=... steps=... updates=... cpu=...
`prefill_tokens_saved` is the share of prompt tokens not prefilled because a group's rows forked one prefill;
`slot_utilisation` is sampled tokens / (batch rows x decode steps): how much of each decode step's batch did work;
`updates` counts the steps that kept a group and so trained (a step that kept none still counts as a step).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(1, str(ROOT.parent))

from competitors import cpu_model  # noqa: E402  (bench/ leads sys.path)
from m3jax.agent.answer import SHIPPED_CONTROLLER  # noqa: E402
from m3jax.config import apply_overrides, load_config  # noqa: E402
from m3jax.host_memory import retain_freed_memory  # noqa: E402
from m3jax.rl.dynamic_sampling import DynamicSamplingConfig  # noqa: E402
from m3jax.rl.program import RLConfig, RLProgram  # noqa: E402


def bench_config(out: str) -> RLConfig:
  recipe = load_config(ROOT.parent / "configs" / "rl_controller.py")
  return dataclasses.replace(recipe, init_adapter=str(SHIPPED_CONTROLLER), warm_start_steps=0, eval_every=0,
                             batch_questions=8, group_size=4, steps=1_000_000, out_dir=out,
                             sampling=DynamicSamplingConfig(enabled=True, max_rounds=2, carry_over=False))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--out", default="runs/rl_throughput")
  ap.add_argument("--set", dest="overrides", action="append", default=[])
  args = ap.parse_args()
  retain_freed_memory()
  cpu = cpu_model()
  print(f"cpu: {cpu}, {os.cpu_count()} cores; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
        flush=True)
  program = RLProgram(apply_overrides(bench_config(args.out), args.overrides))
  c = program.cfg
  it = iter(program.dataset)
  walls, rollout, learn, kept = [], [], [], []
  for step in range(1, args.steps + 1):
    t0 = time.perf_counter()
    m = program.train_step(it, step)
    walls.append(time.perf_counter() - t0)
    rollout.append(m["time/rollout_s"])
    learn.append(m.get("time/learn_s", 0.0))
    kept.append(m.get("ds/batch_groups", 0.0) * c.group_size)
    print(f"step {step}: {walls[-1]:.1f} s (rollout {rollout[-1]:.1f}, learner {learn[-1]:.1f}); "
          f"{kept[-1]:.0f} trajectories kept; load {os.getloadavg()[0]:.2f}", flush=True)
  wall = statistics.median(walls)
  saved = program.prefill_tokens_saved / max(program.prefill_tokens + program.prefill_tokens_saved, 1)
  util = program.decode_tokens / max(program.decode_row_steps, 1)
  print(f"RESULT dapo_steps_per_hour={3600 / wall:.2f} trajectories_kept_per_hour={3600 * sum(kept) / sum(walls):.1f} "
        f"rollout_s={statistics.median(rollout):.1f} learner_s={statistics.median(learn):.1f} "
        f"other_s={wall - statistics.median(rollout) - statistics.median(learn):.1f} "
        f"prefill_tokens_saved={saved:.3f} slot_utilisation={util:.3f} steps={args.steps} "
        f"updates={sum(k > 0 for k in kept)} cpu={cpu.replace(' ', '_')}")


if __name__ == "__main__":
  main()
