"""python train.py rl --config configs/rl_smollm2.py --set out_dir=runs/rl_smollm2

DAPO on SmolLM2-135M-Instruct (the shipped controller) over generated memory-QA graphs, with the reference run's
settings (§5.11): G=2, 32 questions per batch, the DAPO recipe of configs/recipes.py with its low-var KL 0.001 to
the initial policy, AdamW lr 1e-6, wd 0.01; plus two mini-batches per rollout batch so the ratio moves (the
reference's single step leaves clipping inert).
"""

import pathlib

from m3jax.config import load_module
from m3jax.rl.program import RLConfig

recipes = load_module(pathlib.Path(__file__).resolve().parent / "recipes.py")


def get_config() -> RLConfig:
  return RLConfig(
      model="smollm2-135m-instruct", train_seeds=(0, 200), eval_seeds=(1_000_000, 1_000_020), steps=200,
      batch_questions=32, group_size=2, max_rounds=5, max_new_tokens=256, seq_bucket=512, max_seq_len=8192,
      **recipes.dapo(sampling_rounds=4, kl_coef=0.001, lr=1e-6, weight_decay=0.01, mini_batches=2,
                     micro_batch=4, remat=True),
      eval_every=20, eval_questions=64, out_dir="runs/rl_smollm2", save_every=10)
