"""python train.py rl --config configs/rl_controller_direct.py --set out_dir=runs/rl_controller_direct

Stage 2 of the shipped controller's recipe (stage 3, DAPO: configs/rl_controller.py; the result of this stage
ships as m3jax/data/controller/stage2_direct.npz, float16, and stage 3 starts from it; see MODEL_CARD.md there).
Stage 1 (configs/rl_controller_warm.py) cloned the hindsight teacher for 30 steps; its adapter ships as
m3jax/data/controller/stage1_hindsight.npz (float16), so this stage reproduces from the repository alone. It loads
that adapter (`init_adapter`) and clones the `direct` teacher (`m3jax.rl.warm_start.direct_turn`) for 15 more
steps: answer right after the first search that returned memories — the truth, or "The memory does not say." for
an unanswerable question — so the student decides on the result in view, which the hindsight teacher's
truth-in-results stopping rule did not let it do. Everything else is stage 1's (model, LoRA rank 8 / alpha 16,
16 questions per step at lr 1e-3, the 5-round protocol, train seeds 0..127). The output is OUT_DIR/adapter.npz in
float32; the shipped file is it stored as float16 (`m3jax.models.lora.export_adapter_file(..., dtype="float16")`).
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
STAGE1 = HERE.parent / "m3jax" / "data" / "controller" / "stage1_hindsight.npz"


def get_config() -> RLConfig:
  return dataclasses.replace(load_config(HERE / "rl_controller_warm.py"), init_adapter=str(STAGE1),
                             warm_start_expert="direct", warm_start_steps=15, seed=2, eval_every=0,
                             out_dir="runs/rl_controller_direct")
