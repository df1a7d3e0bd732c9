"""Does DAPO teach the shipped controller? Held-out accuracy of SmolLM2-135M-Instruct before and after RL.

  python -m bench.rl_learn [--minutes 120] [--steps 200] [--eval-every 5] [--out runs/rl_learn] [--set k=v ...]

The task is the generated memory-QA task of `train.py rl` (episode graphs with known answers, the reference's
5-round [Search]/[Answer] protocol over `search_clip`/`search_node`); training and held-out graphs come from
disjoint episode seeds. Accuracy is greedy, one trajectory per held-out question, judged by the containment
rule. Training runs DAPO steps (`RLProgram.train_step`) until `--steps` or the `--minutes` budget, evaluating
every `--eval-every` steps; the accuracy curve is saved as PNG next to the metrics JSONL. Overrides go to the
RLConfig built below (CPU-sized: shorter turns and fewer questions than configs/rl_smollm2.py).

The prompted 135M model never answers correctly (0/32), which leaves DAPO's dynamic sampling without a single
mixed group, so the run first clones the hindsight expert of `m3jax.rl.warm_start` for `warm_start_steps`
steps (training graphs only). Accuracy is reported three times: prompted (`acc_prompted`), after the warm start
(`acc_before`, the policy DAPO starts from) and after DAPO (`acc_after`); `gain` is the RL gain
acc_after - acc_before. Final line:
RESULT acc_prompted=... acc_before=... acc_after=... gain=... steps=... minutes=...
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import time

from m3jax.config import apply_overrides
from m3jax.host_memory import retain_freed_memory
from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.losses import LossConfig
from m3jax.rl.program import RLConfig, RLProgram
from bench.harness import machine, result_line


def cpu_config(out: str) -> RLConfig:
  """The reference's DAPO settings (clip 0.2/0.28, token-mean, T=0.6/top-p 0.95/top-k 20, dynamic sampling) at a
  size a 2-core CPU steps through in minutes: 8 questions x G=4, 4 rounds of at most 64 new tokens, lr 5e-6
  (a few steps, not the reference's hundreds), after an 8-step warm start of 16 expert trajectories at 3e-5."""
  return RLConfig(
      model="smollm2-135m-instruct", embedder="minilm", train_seeds=(0, 64), eval_seeds=(1_000_000, 1_000_008),
      warm_start_steps=8, warm_start_questions=16, warm_start_lr=3e-5,
      batch_questions=8, group_size=4, max_rounds=4, max_new_tokens=64, temperature=0.6, top_p=0.95, top_k=20,
      judge="contains", advantage="grpo", seq_bucket=512, max_seq_len=4096,
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=2, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, agg_mode="token-mean"),
                            optim=OptimConfig(lr=5e-6, schedule="constant", weight_decay=0.01, grad_clip=1.0),
                            temperature=0.6, epochs=1, mini_batches=2, micro_batch=4, remat=True,
                            layer_loop="scan"),
      eval_questions=32, out_dir=out)


def plot(curve: list[tuple[int, float]], path: pathlib.Path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(5, 3.2))
  ax.plot([s for s, _ in curve], [a for _, a in curve], marker="o")
  ax.set_xlabel("DAPO step")
  ax.set_ylabel("held-out accuracy")
  ax.set_title("SmolLM2-135M controller on generated memory QA")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main() -> None:
  p = argparse.ArgumentParser()
  p.add_argument("--minutes", type=float, default=120.0)
  p.add_argument("--steps", type=int, default=200)
  p.add_argument("--eval-every", type=int, default=5)
  p.add_argument("--out", default="runs/rl_learn")
  p.add_argument("--set", dest="overrides", action="append", default=[])
  p.add_argument("--no-prompted-eval", action="store_true",
                 help="skip the prompted baseline (0/32 on every run so far; ~8 min of rambling on 2 cores)")
  args = p.parse_args()
  retain_freed_memory()  # as train.py does
  print(machine(), flush=True)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  cfg = apply_overrides(cpu_config(str(out)), args.overrides)
  start = time.perf_counter()
  program = RLProgram(cfg)
  print(f"built the task and models in {time.perf_counter() - start:.0f}s: {len(program.train_records)} training "
        f"and {len(program.eval_records)} held-out questions", flush=True)
  t = time.perf_counter()
  prompted = float("nan") if args.no_prompted_eval else program.evaluate()
  print(f"prompted: held-out accuracy {prompted:.3f} ({time.perf_counter() - t:.0f}s)", flush=True)
  t = time.perf_counter()
  for k, m in enumerate(program.warm_start()):
    print(f"warm start {k + 1}: nll {m['loss']:.3f} tokens {m['tokens']:.0f} ({m['time_s']:.0f}s)", flush=True)
  curve = [(0, program.evaluate())]
  print(f"step 0 (after the warm start): held-out accuracy {curve[0][1]:.3f} ({time.perf_counter() - t:.0f}s)",
        flush=True)
  it = iter(program.dataset)
  budget = start + 60 * args.minutes
  step = 0
  with (out / "metrics.jsonl").open("w") as log:
    while step < args.steps and time.perf_counter() < budget:
      step += 1
      m = program.train_step(it, step)
      if step % args.eval_every == 0:
        m["eval/accuracy"] = program.evaluate()
        curve.append((step, m["eval/accuracy"]))
      log.write(json.dumps({"step": step, **{k: float(v) for k, v in m.items()}}) + "\n")
      log.flush()
      print(f"step {step}: reward {m.get('reward/outcome', float('nan')):.3f} loss {m.get('train/loss', 0):.4f} "
            f"clip_high {m.get('train/clip_high', 0):.3f} yield {m.get('ds/yield', 0):.2f} "
            + (f"eval {m['eval/accuracy']:.3f} " if "eval/accuracy" in m else "")
            + f"({(time.perf_counter() - start) / 60:.1f} min)", flush=True)
  if curve[-1][0] != step:
    curve.append((step, program.evaluate()))
  minutes = (time.perf_counter() - start) / 60
  plot(curve, out / "accuracy.png")
  (out / "curve.json").write_text(json.dumps({"prompted": prompted, "curve": curve,
                                              "config": dataclasses.asdict(cfg)}, default=str))
  before, after = curve[0][1], curve[-1][1]
  print(result_line(acc_prompted=f"{prompted:.3f}", acc_before=f"{before:.3f}", acc_after=f"{after:.3f}",
                    gain=f"{after - before:+.3f}", steps=step, minutes=f"{minutes:.1f}"))


if __name__ == "__main__":
  main()
