"""python train.py rl --config configs/rl_controller_explore.py --max-minutes 75  # then runs/rl_explore/continue.cmd

Issue 43: configs/rl_controller_sized.py continued from its step-150 adapter (runs/rl_sized/adapter.npz) with the
rollouts sampled, and the learner's log-probs taken, at temperature 1.0 instead of 0.6. Everything else is the
sized run's: the strict judge, half the questions from the perception pool, episodes of 3-10 clips and 2-3 people,
the same 64-question dev curve every 10 steps. The AdamW state starts fresh.

WHY: the sized run's policy collapsed. Over its last 50 steps (runs/rl_sized/metrics.jsonl) its token entropy
averaged 0.11, its trajectories searched 1.01 times each, and dynamic sampling kept 73 of 396 generated groups (the
G = 4 answers of a question were nearly always all right or all wrong), so most steps trained on one group of 4
short trajectories, and its dev curve stayed at 34-44 of 64. A hotter sampler gives the groups mixed outcomes and
tries other search paths; this run measures whether that restarts learning (a dev choice).
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
TEMPERATURE = 1.0


def get_config() -> RLConfig:
  sized = load_config(HERE / "rl_controller_sized.py")
  learner = dataclasses.replace(sized.learner, temperature=TEMPERATURE)
  return dataclasses.replace(sized, init_adapter="runs/rl_sized/adapter.npz", temperature=TEMPERATURE,
                             learner=learner, steps=100, out_dir="runs/rl_explore")
