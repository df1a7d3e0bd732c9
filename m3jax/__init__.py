"""m3jax: M3-Agent (a multimodal agent with long-term memory) in JAX/Flax, built for throughput.

Where things live (imports flow down this list's layers; tests/test_layering.py checks it):
  models/     Flax NNX models (decoder LLMs, encoders, log-mel), tokenizers, weight readers
  memory/     the entity-centric memory graph on device and its search tools
  engine/     the sampler (prefill, continuous-batching decode, constrained turns)
  perception/ media decoding, faces (detection, clustering), speech segments, voices, ASR
  data/       episode generator, M3-Bench annotations, datasets
  control/    answering: the control loop, policy, prompts, parsing, trajectories, answerers
  memorize/   memorizing: the pipeline, lock-step memorization, memory writers, the perception pool
  rl/         DAPO/GRPO learner: rollouts, rewards, advantages, losses
  sft/        the memorization model's SFT trainer
  serve/      the memory service
  eval/       M3-Bench evaluation, reports, statistics, judges, ablations, the demo
  cli.py      the `m3jax` command
"""

import os

# m3jax takes only tokenizers and configs from transformers, and torch is not a runtime dependency: transformers'
# "PyTorch was not found" advice on import is noise to an m3jax user.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
