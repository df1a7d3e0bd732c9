"""python train.py rl --config configs/rl_controller_sized.py --max-minutes 85   # then: bash runs/rl_sized/continue.cmd

Issue 43's controller run on episodes of every size: configs/rl_controller_strict.py (the shipped adapter
continued with stage 3's recipe, the strict judge, half of the questions from the perception pool) with the gold
episodes of training and of the dev curve drawn at 3-10 clips and 2-3 people per seed (`memory_qa.EpisodeSizes`;
three people is as many as the renderer has real face photos), and the curve's 64 questions spread over the dev
episodes.

WHY: a dev measurement. On 64 dev questions over episodes of these sizes (`python -m bench.controller_eval --split
dev --n 64 --answerers trained,rules --tasks gold --sizes 3-10x2-3 --no-llm-judge`, Intel Xeon, 2 cores), the
shipped controller scored 0.469 [0.352, 0.589] against the rules answerer's 0.703 [0.582, 0.801], trained - rules
-0.234 [-0.375, -0.094]: level with rules on 3-4 clips (0.875 and 0.667 against 0.875 and 0.750), behind from 5
clips on, with 1.03 searches a question against the rules' 2.98. Both earlier runs trained on 3-clip gold episodes
(and the 4-clip pool) only; the strict run's dev curve on those stayed flat over its first 36 steps.
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.data.memory_qa import EpisodeSizes
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent


def get_config() -> RLConfig:
  strict = load_config(HERE / "rl_controller_strict.py")
  return dataclasses.replace(strict, episode_sizes=EpisodeSizes(clips=(3, 10), people=(2, 3)),
                             out_dir="runs/rl_sized")
