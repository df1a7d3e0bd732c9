"""A tiny random-init policy, end to end in a couple of minutes on CPU (plumbing, resume and speed checks).

  python train.py rl --config configs/rl_tiny.py --set out_dir=runs/rl_tiny
"""

from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.losses import LossConfig
from m3jax.rl.program import RLConfig, TinyModel


def get_config() -> RLConfig:
  return RLConfig(
      model="tiny", tiny=TinyModel(), train_seeds=(0, 4), eval_seeds=(1_000_000, 1_000_001), steps=2,
      batch_questions=2, group_size=2, max_rounds=2, max_new_tokens=16, seq_bucket=256, max_seq_len=4096,
      # a random policy never answers correctly: keep every group so the update still runs
      sampling=DynamicSamplingConfig(enabled=False, max_rounds=1),
      learner=LearnerConfig(loss=LossConfig(), optim=OptimConfig(lr=1e-4), mini_batches=2, micro_batch=1,
                            seq_chunk=256, vocab_chunk=8192),
      out_dir="runs/rl_tiny", save_every=1)
