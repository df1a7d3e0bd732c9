"""DAPO wall clock: steps and kept trajectories per hour, and where a step's time goes.

  python -m bench.rl_throughput [--steps 2] [--out runs/rl_throughput] [--set k=v ...]

The stage-3 controller's training setup (configs/rl_controller.py: SmolLM2-135M-Instruct, rank-8 LoRA, MiniLM
retrieval, the 5-round protocol, 48-token turns, sampling T=0.6 / top-p 0.95 / top-k 20, token-mean DAPO loss with
clip-higher) at bench/rl_learn.py's batch: 8 questions x G=4 per step, dynamic sampling of mixed-outcome groups
over at most 2 generation rounds. It starts from the stage-3 adapter (m3jax/data/controller/stage3_dapo.npz, the
shipped one until 2026-12-08, so earlier runs' numbers stay comparable) with no warm start, so the groups are mixed as
in a real run from it (a prompted 135M model answers nothing and no group would be kept). Each of `--steps`
`RLProgram.train_step`s is timed; checkpoints are not written.

Each step's wall time is cut into parts that sum to it exactly (`m3jax.rl.step_work` counts them where they are
spent): rollout = prefill + decode + search + judge + rollout_rest (the controller's own host work: tokenising,
parsing, batching, cache forks); learner (old log-probs when recomputed, advantages, the update); other = wall −
rollout − learner (batch building, dynamic-sampling bookkeeping). Each FLOP-bound part is set against its floor,
measured in the same run before the steps: `matmul_gflop_s`, the best jitted float32 matmul rate
(bench/learner_flops.py's shapes and 2048³), and `read_gb_s`, the rate of a jitted sum over as many float32 bytes
as a decode step's weights. `prefill_of_floor` = model FLOPs of the fresh prefill tokens (`m3jax.rl.flops`,
causal attention over cached + own positions, one logit row per prefilled row) / matmul rate / prefill seconds;
`decode_of_floor` = max((decode steps × weight bytes + the KV bytes the live rows need) / read rate, sampled
tokens' weight FLOPs / matmul rate) / decode seconds (`m3jax.engine.work.kv_bytes`: past a few hundred cached
tokens a row, the KV reads outweigh the weights'); `decode_kv_read_gb` is what the attention read (every row up to
the longest row, in blocks), `decode_kv_needed_gb` what the live rows needed; `learner_of_floor` = the update's
model FLOPs / matmul rate / learner seconds. Search and judging run on the host (no FLOP floor).
`prefill_fresh_tokens` were computed; `prefill_reused_tokens` were not, because a group's rows forked one prefill
or a row continued its own cache.

With `--set rollout_ahead=true --set recompute_old_logp=false` a step's rollout runs beside the previous step's
update (`RLConfig.rollout_ahead`): its rollout parts were then spent off this step's path, and the path is learner
+ `ahead_wait_s` (the next rollout's time past the update's end) + other; `rollout_s` in RESULT is the rollout
time on the path (wall − learner − other) and `ahead_steps` counts such steps (the first step's rollout is serial).

Printed per step (parts summing to the wall), then the final line, where every `*_s`, token and GFLOP key is the
mean over the steps (means of parts sum to the mean wall `wall_s`) and `dapo_steps_per_hour` is 3600 / the
median wall:
RESULT dapo_steps_per_hour=... trajectories_kept_per_hour=... wall_s=... rollout_s=... learner_s=... other_s=...
ahead_wait_s=... ahead_steps=...
prefill_s=... decode_s=... search_s=... judge_s=... rollout_rest_s=... decode_kv_read_gb=... decode_kv_needed_gb=...
prefill_fresh_tokens=... prefill_reused_tokens=... prefill_gflop=... decode_gflop=... learner_gflop=... prefill_of_floor=...
decode_of_floor=... learner_of_floor=... matmul_gflop_s=... read_gb_s=...
compile_s=... learner_compile_s=... dapo_steps_per_hour_no_compile=...
prefill_tokens_saved=... slot_utilisation=... steps=... updates=... cpu=...
`compile_s` (of it `learner_compile_s`) is the time a step spent lowering and compiling programs
(`m3jax.rl.step_work`), inside the parts above; `dapo_steps_per_hour_no_compile` = 3600 / the median of wall −
compile_s estimates a long run's steady step, where every shape has been compiled (a 2-step run meets most of
the learner's call shapes for the first time).
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
import time

import jax
import jax.numpy as jnp

from m3jax.config import apply_overrides, load_config
from m3jax.host_memory import retain_freed_memory
from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.flops import decode_weight_bytes, rollout_flops
from m3jax.rl.program import RLConfig, RLProgram
from bench.harness import best_time, cpu_model, machine, result_line
from bench.learner_flops import matmul_runs

ROOT = pathlib.Path(__file__).resolve().parents[1]
STAGE3 = ROOT / "m3jax" / "data" / "controller" / "stage3_dapo.npz"


def bench_config(out: str) -> RLConfig:
  recipe = load_config(ROOT / "configs" / "rl_controller.py")
  return dataclasses.replace(recipe, init_adapter=str(STAGE3), warm_start_steps=0, eval_every=0,
                             batch_questions=8, group_size=4, steps=1_000_000, out_dir=out,
                             sampling=DynamicSamplingConfig(enabled=True, max_rounds=2, carry_over=False))


def floors(weight_bytes: int, reps: int = 5) -> tuple[float, float]:
  """(best jitted float32 matmul GFLOP/s, GB/s of a jitted sum over `weight_bytes` float32 bytes), best of
  `reps` each: what the FLOP-bound parts and the decode's weight reads could reach on this machine now."""
  def best(fn):
    fn()  # compile
    return best_time(fn, reps)[0]
  rate = max(flops / best(run) for run, flops in matmul_runs(4, 512).values()) / 1e9
  x = jnp.ones((weight_bytes // 4,), jnp.float32)
  total = jax.jit(jnp.sum)
  read = weight_bytes / best(lambda: jax.block_until_ready(total(x))) / 1e9
  return rate, read


def step_parts(m: dict, wall: float) -> dict[str, float]:
  """A step's seconds, cut into parts that sum to `wall` (module docstring)."""
  p = {k: m.get(f"time/{k}", 0.0) for k in ("prefill_s", "decode_s", "search_s", "judge_s")}
  p["rollout_rest_s"] = m["time/rollout_s"] - sum(p.values())
  p["learner_s"] = m.get("time/learn_s", 0.0)
  # rollout_ahead: this step's rollout ran beside the last update; the wait for the next one's is on this path
  p["ahead_wait_s"] = m.get("time/ahead_wait_s", 0.0)
  on_path = 0.0 if m.get("rollout/ahead") else m["time/rollout_s"]
  p["other_s"] = wall - on_path - p["learner_s"] - p["ahead_wait_s"]
  p["compile_s"], p["learner_compile_s"] = m.get("time/compile_s", 0.0), m.get("time/learner_compile_s", 0.0)
  return p


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--steps", type=int, default=2)
  ap.add_argument("--out", default="runs/rl_throughput")
  ap.add_argument("--set", dest="overrides", action="append", default=[])
  args = ap.parse_args()
  retain_freed_memory()
  print(machine(), flush=True)
  program = RLProgram(apply_overrides(bench_config(args.out), args.overrides))
  c, mcfg = program.cfg, program.model.cfg
  weight_bytes = decode_weight_bytes(mcfg)
  rate, read = floors(weight_bytes)
  print(f"floors: matmul {rate:.1f} GFLOP/s, weight read {read:.1f} GB/s ({weight_bytes / 1e6:.0f} MB a decode "
        f"step)", flush=True)
  it = iter(program.dataset)
  walls, kept, rows = [], [], []
  for step in range(1, args.steps + 1):
    sampled, row_steps = program.decode_tokens, program.decode_row_steps
    t0 = time.perf_counter()
    m = program.train_step(it, step)
    walls.append(time.perf_counter() - t0)
    kept.append(m.get("ds/batch_groups", 0.0) * c.group_size)
    p = step_parts(m, walls[-1])
    fresh = m["rollout/prefill_tokens"]
    p["prefill_fresh_tokens"] = fresh
    p["prefill_reused_tokens"] = m["rollout/prefill_tokens_saved"] + m["work/prefill_reused"]
    p["prefill_gflop"] = rollout_flops(mcfg, fresh, m["work/prefill_attended"], m["work/prefill_rows"]) / 1e9
    p["decode_gflop"] = rollout_flops(mcfg, program.decode_tokens - sampled, 0, program.decode_tokens - sampled) / 1e9
    p["decode_row_steps"] = program.decode_row_steps - row_steps
    p["decode_kv_read_gb"], p["decode_kv_needed_gb"] = m["work/decode_kv_read"] / 1e9, m["work/decode_kv_needed"] / 1e9
    p["decode_floor_s"] = max((m["work/decode_steps"] * weight_bytes / 1e9 + p["decode_kv_needed_gb"]) / read,
                              p["decode_gflop"] / rate)
    p["learner_gflop"] = m.get("perf/learn_model_gflop_s", 0.0) * p["learner_s"]
    p["ahead"] = m.get("rollout/ahead", 0.0)
    rows.append(p)
    print(f"step {step}: {walls[-1]:.1f} s = prefill {p['prefill_s']:.1f} + decode {p['decode_s']:.1f} + search "
          f"{p['search_s']:.1f} + judge {p['judge_s']:.1f} + rollout rest {p['rollout_rest_s']:.1f} + learner "
          f"{p['learner_s']:.1f} (update {m.get('time/update_s', 0.0):.1f}) + other {p['other_s']:.1f}"
          f"{'' if not m.get('rollout/ahead') else ' (rollout ran ahead)'} + ahead wait {p['ahead_wait_s']:.1f}; compiling "
          f"{p['compile_s']:.1f} of it (learner {p['learner_compile_s']:.1f}); prefill "
          f"{fresh:.0f} fresh / {p['prefill_reused_tokens']:.0f} reused tokens {p['prefill_gflop']:.1f} GFLOP; "
          f"decode {m['work/decode_steps']:.0f} steps {p['decode_gflop']:.1f} GFLOP, KV read "
          f"{p['decode_kv_read_gb']:.1f} GB of which needed {p['decode_kv_needed_gb']:.1f}; learner "
          f"{p['learner_gflop']:.1f} GFLOP; {kept[-1]:.0f} trajectories kept; load {os.getloadavg()[0]:.2f}",
          flush=True)
  mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
  frac = lambda gflop, s: gflop / rate / s if s > 0 else float("nan")
  saved = program.prefill_tokens_saved / max(program.prefill_tokens + program.prefill_tokens_saved, 1)
  util = program.decode_tokens / max(program.decode_row_steps, 1)
  secs = {k: f"{mean[k]:.1f}" for k in ("prefill_s", "decode_s", "search_s", "judge_s", "rollout_rest_s")}
  print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  decode_of_floor = mean["decode_floor_s"] / mean["decode_s"] if mean["decode_s"] else float("nan")
  print(result_line(
      dapo_steps_per_hour=f"{3600 / statistics.median(walls):.2f}",
      trajectories_kept_per_hour=f"{3600 * sum(kept) / sum(walls):.1f}", wall_s=f"{statistics.fmean(walls):.1f}",
      rollout_s=f"{statistics.fmean(walls) - mean['learner_s'] - mean['other_s']:.1f}",
      learner_s=f"{mean['learner_s']:.1f}", other_s=f"{mean['other_s']:.1f}",
      ahead_wait_s=f"{mean['ahead_wait_s']:.1f}", ahead_steps=sum(r["ahead"] for r in rows), **secs,
      prefill_fresh_tokens=f"{mean['prefill_fresh_tokens']:.0f}",
      prefill_reused_tokens=f"{mean['prefill_reused_tokens']:.0f}", prefill_gflop=f"{mean['prefill_gflop']:.1f}",
      decode_kv_read_gb=f"{mean['decode_kv_read_gb']:.1f}", decode_kv_needed_gb=f"{mean['decode_kv_needed_gb']:.1f}",
      decode_gflop=f"{mean['decode_gflop']:.1f}", learner_gflop=f"{mean['learner_gflop']:.1f}",
      prefill_of_floor=f"{frac(mean['prefill_gflop'], mean['prefill_s']):.3f}",
      decode_of_floor=f"{decode_of_floor:.3f}",
      learner_of_floor=f"{frac(mean['learner_gflop'], mean['learner_s']):.3f}", matmul_gflop_s=f"{rate:.1f}",
      read_gb_s=f"{read:.1f}", compile_s=f"{mean['compile_s']:.1f}",
      learner_compile_s=f"{mean['learner_compile_s']:.1f}",
      dapo_steps_per_hour_no_compile=f"{3600 / statistics.median(w - r['compile_s'] for w, r in zip(walls, rows)):.2f}",
      prefill_tokens_saved=f"{saved:.3f}", slot_utilisation=f"{util:.3f}",
      steps=args.steps, updates=sum(k > 0 for k in kept), cpu=cpu_model().replace(" ", "_")))


if __name__ == "__main__":
  main()
