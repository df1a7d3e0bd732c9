"""python train.py rl --config configs/rl_controller_warm.py --set out_dir=runs/rl_controller_warm

Stage 1 of the shipped controller's recipe (stage 2: configs/rl_controller_direct.py; the result of this stage ships as
m3jax/data/controller/stage1_hindsight.npz, float16, and stage 2 starts from it): SmolLM2-135M-Instruct
with rank-8 LoRA adapters on every projection, written to OUT_DIR/adapter.npz (`--answerer trained --adapter
FILE`), on a 2-core CPU: 30 behaviour-cloning warm-start steps (16 training questions each, lr 1e-3) on the
hindsight expert's trajectories (`m3jax.rl.warm_start`), the held-out greedy accuracy at step 0, then `steps` DAPO
steps (`--set steps=50 --set eval_every=5`; the recipe of configs/recipes.py with no KL term, which DAPO
drops), greedy held-out accuracy every `eval_every` steps. The protocol is the reference's 5-round
[Search]/[Answer] loop over search_clip/search_node with the instruction in the first user message only
(`inter_turn_instruction=False`), which keeps trajectories short enough to train here; the answerer reads that
setting from the adapter. Training graphs come from episode seeds 0..127 (train split).

Measurements of these settings (warm-start length and lr, length buckets, bfloat16, vm.max_map_count): the
"Training log" section of m3jax/data/controller/MODEL_CARD.md.
share_prefix=4 computes each group's common prefix once (m3jax.rl.learner): same update, 1.66x faster (model card).
"""

import pathlib

from m3jax.config import load_module
from m3jax.rl.program import RLConfig

recipes = load_module(pathlib.Path(__file__).resolve().parent / "recipes.py")


def get_config() -> RLConfig:
  return RLConfig(
      model="smollm2-135m-instruct", embedder="minilm", train_seeds=(0, 128), eval_seeds=(1_000_000, 1_000_008),
      lora_rank=8, lora_alpha=16.0, seed=1,
      warm_start_steps=30, warm_start_questions=16, warm_start_lr=1e-3,
      steps=0, batch_questions=4, group_size=4, max_rounds=5, inter_turn_instruction=False, max_new_tokens=48,
      recompute_old_logp=False, seq_bucket=128, max_seq_len=2048,
      **recipes.dapo(sampling_rounds=2, kl_coef=0.0, lr=3e-5, weight_decay=0.0, mini_batches=1, micro_batch=2,
                     length_bucket=64, share_prefix=4, remat=False),
      eval_every=1, eval_questions=24, out_dir="runs/rl_controller_warm", save_every=1)
