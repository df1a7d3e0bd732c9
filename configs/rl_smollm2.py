"""DAPO on SmolLM2-135M-Instruct (the shipped controller) over generated memory-QA graphs, with the reference
run's settings (§5.11): G=2, 32 questions per batch, T=0.6 / top-p 0.95 / top-k 20, clip 0.2/0.28, dual clip 3,
token-mean, low-var KL 0.001 to the initial policy, AdamW lr 1e-6 constant, wd 0.01, grad clip 1.0; plus two
mini-batches per rollout batch so the ratio moves (the reference's single step leaves clipping inert).

  python train.py rl --config configs/rl_smollm2.py --set out_dir=runs/rl_smollm2
"""

from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.losses import LossConfig
from m3jax.rl.program import RLConfig


def get_config() -> RLConfig:
  return RLConfig(
      model="smollm2-135m-instruct", train_seeds=(0, 200), eval_seeds=(1_000_000, 1_000_020), steps=200,
      batch_questions=32, group_size=2, max_rounds=5, max_new_tokens=256, temperature=0.6, top_p=0.95, top_k=20,
      judge="contains", advantage="grpo", seq_bucket=512, max_seq_len=8192,
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=4, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="token-mean",
                                            kl_coef=0.001),
                            optim=OptimConfig(lr=1e-6, schedule="constant", weight_decay=0.01, grad_clip=1.0),
                            temperature=0.6, epochs=1, mini_batches=2, micro_batch=4, remat=True,
                            layer_loop="scan"),  # 30 layers: one compiled layer, not 30
      eval_every=20, eval_questions=64, out_dir="runs/rl_smollm2", save_every=10)
