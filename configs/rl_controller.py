"""python train.py rl --config configs/rl_controller.py --set out_dir=runs/rl_controller

The shipped controller's recipe (m3jax/data/controller/controller.npz, see its MODEL_CARD.md), stage 3 of 3: DAPO.
It starts from stage 2's adapter, shipped as m3jax/data/controller/stage2_direct.npz (float16;
configs/rl_controller_direct.py reproduces it from stage 1, configs/rl_controller_warm.py), so the whole chain
reproduces from the repository. 50 DAPO steps (`m3jax.rl`, stage 1's settings: the recipe of configs/recipes.py
with no KL term, up to 2 rollout rounds): 4 training questions x G=4 sampled trajectories per step, AdamW at a
constant lr 2e-4 on the rank-8 LoRA adapters only (the base stays frozen); greedy held-out accuracy on 48
questions every 10 steps. The output is OUT_DIR/adapter.npz in float32; the shipped file is it stored as float16
(`m3jax.models.lora.export_adapter_file(..., dtype="float16")`).

lr 2e-4 because 3e-5 left the held-out accuracy flat for 30 steps (the "Training log" section of
m3jax/data/controller/MODEL_CARD.md).
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
STAGE2 = HERE.parent / "m3jax" / "data" / "controller" / "stage2_direct.npz"


def get_config() -> RLConfig:
  stage2 = load_config(HERE / "rl_controller_direct.py")
  optim = dataclasses.replace(stage2.learner.optim, lr=2e-4)
  return dataclasses.replace(stage2, init_adapter=str(STAGE2), warm_start_steps=0, steps=50, eval_every=10,
                             eval_questions=48, eval_seeds=(1_000_000, 1_000_016),
                             learner=dataclasses.replace(stage2.learner, optim=optim), out_dir="runs/rl_controller")
