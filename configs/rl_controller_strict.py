"""python train.py rl --config configs/rl_controller_strict.py --max-minutes 90   # then: bash runs/rl_strict/continue.cmd

Issue 43's controller run: DAPO paid by the strict judge, on the memories the product builds. It continues the
stage-3 controller (m3jax/data/controller/stage3_dapo.npz: shipped as controller.npz until 2026-12-08, stage 3 of
configs/rl_controller.py) with its recipe
(SmolLM2-135M, rank-8 LoRA, 4 questions x G=4 per step, 48-token turns, up to 5 rounds, dynamic sampling over 2
rollout rounds, AdamW lr 2e-4, no KL) and changes what the policy sees and how it is paid:

- the strict judge (`m3jax.eval.judges`) for the reward and the held-out curve: an answer that lists candidates,
  or names one beside a decline, earns nothing, where the shipped run's `contains` judge paid for it;
- half the questions from the perception pool: train-split episodes 0..15 in the demo's shape, rendered and
  memorized end to end (faces, voices, Whisper tiny.en, the template writer; `python -m bench.perception_pool
  --seeds 0 16` builds it ahead), the rest from the gold graphs of train seeds 0..127;
- 150 steps in chunks of at most 90 minutes; a held-out curve on 64 dev questions (gold graphs of dev seeds
  1,000,000..1,000,015) every 10 steps.

WHY from the shipped adapter and not stage 2: on the dev gold questions it scored 0.719 against stage 2's 0.573
(MODEL_CARD.md, the contains judge), so RL starts from the better policy. The shipped file is float16; the run
trains in float32.
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
STAGE3 = HERE.parent / "m3jax" / "data" / "controller" / "stage3_dapo.npz"


def get_config() -> RLConfig:
  shipped = load_config(HERE / "rl_controller.py")
  return dataclasses.replace(shipped, init_adapter=str(STAGE3), judge="strict", steps=150, seed=3,
                             pool_seeds=(0, 16), pool_ratio=0.5, eval_every=10, eval_questions=64,
                             out_dir="runs/rl_strict")
