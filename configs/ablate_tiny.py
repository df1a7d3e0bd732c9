"""The ablation table in a few minutes on 2 cores: a random-init tiny controller, 8 held-out questions, one RL step.

  python -m m3jax.eval.ablate --config configs/ablate_tiny.py --set out_dir=runs/ablate_tiny

Plumbing, not results: the tiny policy never answers correctly, so the control and RL rows read 0. The memory rows
use the rules answerer (deterministic, meaningful on gold memories); it searches by character id, so the designs
without the node route read n/a there (the LLM answerer runs them: --set memory_answerer=llm).
"""

from m3jax.eval.ablate import AblateConfig
from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.program import RLConfig, TinyModel


def get_config() -> AblateConfig:
  rl = RLConfig(
      model="tiny", tiny=TinyModel(), train_seeds=(0, 2), eval_seeds=(1_000_000, 1_000_001), steps=1,
      batch_questions=2, group_size=2, max_rounds=2, max_new_tokens=8, seq_bucket=256, max_seq_len=4096,
      sampling=DynamicSamplingConfig(enabled=False, max_rounds=1), warm_start_steps=1, warm_start_questions=2,
      learner=LearnerConfig(optim=OptimConfig(lr=1e-4), mini_batches=1, micro_batch=2, seq_chunk=256,
                            vocab_chunk=8192))
  return AblateConfig(out_dir="runs/ablate_tiny", questions=8, memory_answerer="rules", max_rounds=2,
                      max_new_tokens=8, rl=rl, rl_seeds=(1, 2, 3))
