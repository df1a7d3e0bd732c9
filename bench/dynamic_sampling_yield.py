"""Dynamic-sampling yield with and without pass-rate selection, on the shipped controller's real outcomes.

  python -m bench.dynamic_sampling_yield [--questions 32] [--samples 8] [--steps 300]

DAPO keeps only groups with mixed outcomes, so every group of G trajectories on a question the policy always or
never solves is rollout time spent for nothing. `DynamicSamplingConfig(skip_after=G, oversample=2)` skips a
question whose last G outcomes were all equal and sizes each round by the recent yield (`m3jax.rl.dynamic_sampling`).

Measuring that on live DAPO steps costs 10-16 minutes a step on a 2-core CPU, so the bench does it in two parts:
1. real rollouts: the shipped controller (its adapter on SmolLM2-135M-Instruct, the RL recipe's sampling:
   T=0.6, top-p 0.95, top-k 20) answers each of `--questions` training questions `--samples` times; the
   `contains` judge scores every answer. This is the policy's per-question outcome distribution, measured.
2. replay: `--steps` DAPO batches (4 questions x G=4, at most 2 rounds per batch, the recipe's settings) are
   filled from a seeded, repeating shuffle of those questions by `DynamicBatcher` exactly as `train.py rl`
   fills them, each drawn group's G outcomes sampled from the question's measured ones; once without and once
   with pass-rate selection. The policy does not change during the replay (no learning), which is the case
   where skipping helps most: a live run's pass rates drift, and a skipped question comes back after `skip_for`.

Final line: RESULT yield_before=... yield_after=... groups_per_batch_before=... groups_per_batch_after=...
full_batches_before=... full_batches_after=... saturated_share=... questions=... samples=...
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

from m3jax.config import load_config
from m3jax.rl.dynamic_sampling import DynamicBatcher, DynamicSamplingConfig, Group
from bench.harness import cpu_model, machine, result_line

ROOT = pathlib.Path(__file__).resolve().parents[1]


def measure_outcomes(n_questions: int, samples: int, seed: int) -> dict[str, np.ndarray]:
  """Per training question, `samples` judged outcomes of the shipped controller (real rollouts)."""
  from m3jax.control import trained_adapter_path
  from m3jax.rl.program import RLProgram

  cfg = load_config(ROOT / "configs" / "rl_controller.py",
                    [f"init_adapter={trained_adapter_path(None)}", "warm_start_steps=0", "train_seeds=(0, 16)",
                     "eval_seeds=(1000000, 1000000)"])
  program = RLProgram(cfg)
  records = [program.train_records[i] for i in
             np.random.default_rng(seed).permutation(len(program.train_records))[:n_questions]]
  out = {}
  for start in range(0, len(records), 8):  # 8 questions x `samples` rows per rollout call
    chunk = records[start:start + 8]
    _, parts = program.rollout(chunk, seed=seed + start, group=samples,
                               row_ids=list(range(len(chunk) * samples)))
    for i, r in enumerate(chunk):
      out[r.question_id] = parts["outcome"][i * samples:(i + 1) * samples]
    print(f"  rolled out {start + len(chunk)}/{len(records)} questions", flush=True)
  return out


def replay(outcomes: dict[str, np.ndarray], cfg: DynamicSamplingConfig, steps: int, batch: int, group: int,
           seed: int) -> dict[str, float]:
  """Fills `steps` batches with `DynamicBatcher` as `RLProgram.train_step` does, from measured outcomes."""
  rng = np.random.default_rng(seed)
  ids = sorted(outcomes)
  order, pos = [], [0]

  def draw() -> str:
    if pos[0] == len(order):
      order[:] = [ids[i] for i in rng.permutation(len(ids))]
      pos[0] = 0
    pos[0] += 1
    return order[pos[0] - 1]

  batcher = DynamicBatcher(cfg, batch)
  generated = kept = full = skipped = 0
  for step in range(1, steps + 1):
    def generate(n, step=step):
      nonlocal skipped
      drawn = []
      for _ in range(4 * n):
        if len(drawn) == n:
          break
        q = draw()
        if batcher.skips(q, step):
          skipped += 1
        else:
          drawn.append(q)
      return [Group(payload=q, outcomes=rng.choice(outcomes[q], size=group), question_id=q) for q in drawn]

    groups, stats = batcher.fill(generate, step)
    generated += stats["ds/generated_groups"]
    kept += stats["ds/kept_groups"]
    full += len(groups) == batch
  return {"yield": kept / generated, "groups_per_batch": generated / steps, "full_batches": full / steps,
          "skipped_per_batch": skipped / steps}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--questions", type=int, default=32)
  ap.add_argument("--samples", type=int, default=8)
  ap.add_argument("--steps", type=int, default=300)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  print(machine(), flush=True)
  t0 = time.perf_counter()
  outcomes = measure_outcomes(args.questions, args.samples, args.seed)
  rates = np.array([o.mean() for o in outcomes.values()])
  saturated = float(np.mean((rates == 0) | (rates == 1)))
  print(f"rollouts: {time.perf_counter() - t0:.0f} s; pass rate mean {rates.mean():.3f}; questions always right "
        f"{np.mean(rates == 1):.3f}, always wrong {np.mean(rates == 0):.3f} (of {args.samples} samples)", flush=True)
  recipe = load_config(ROOT / "configs" / "rl_controller.py")
  base = DynamicSamplingConfig(enabled=True, max_rounds=recipe.sampling.max_rounds)
  select = DynamicSamplingConfig(enabled=True, max_rounds=recipe.sampling.max_rounds, skip_after=recipe.group_size,
                                 skip_for=10, oversample=2.0)
  res = {}
  for name, cfg in (("before", base), ("after", select)):
    res[name] = replay(outcomes, cfg, args.steps, recipe.batch_questions, recipe.group_size, args.seed + 1)
    print(f"{name:6s} {cfg}: " + ", ".join(f"{k} {v:.3f}" for k, v in res[name].items()), flush=True)
  print(result_line(yield_before=f"{res['before']['yield']:.3f}", yield_after=f"{res['after']['yield']:.3f}",
                    groups_per_batch_before=f"{res['before']['groups_per_batch']:.2f}",
                    groups_per_batch_after=f"{res['after']['groups_per_batch']:.2f}",
                    full_batches_before=f"{res['before']['full_batches']:.3f}",
                    full_batches_after=f"{res['after']['full_batches']:.3f}", saturated_share=f"{saturated:.3f}",
                    questions=len(outcomes), samples=args.samples, cpu=cpu_model()))


if __name__ == "__main__":
  main()
