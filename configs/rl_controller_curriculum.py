"""python train.py rl --config configs/rl_controller_curriculum.py --max-minutes 75  # then runs/rl_curriculum/continue.cmd

Issue 43: configs/rl_controller_explore.py continued from its step-100 adapter (runs/rl_explore/adapter.npz) with
the question families it still loses to the rules answerer on the sized dev questions drawn three times per pass
(`family_repeat`). All else is the explore run's: sampling and the learner at temperature 1.0, on-policy (old
log-probs recomputed), the 64-question dev curve every 10 steps; the AdamW state starts fresh.

WHY (dev choices): at its steps 49 and 100 the explore run lost the same four families to the rules answerer on
the 64 sized dev questions: rule_who 1/4 against 4/4, mention_order 0/3 against 2/3, drink 1/3 against 3/3 and
who_plan 1/3 against 3/3 (runs/issue43/rl_explore_step100_join.log), while it matched or beat rules on most
others; its curve stayed at 40-46 of 64 over its 100 steps.
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
LOST_TO_RULES = ("rule_who", "mention_order", "drink", "who_plan")


def get_config() -> RLConfig:
  explore = load_config(HERE / "rl_controller_explore.py")
  return dataclasses.replace(explore, init_adapter="runs/rl_explore/adapter.npz",
                             family_repeat=tuple((f, 3) for f in LOST_TO_RULES), steps=100,
                             out_dir="runs/rl_curriculum")
