"""m3jax: M3-Agent (a multimodal agent with long-term memory) in JAX/Flax, built for throughput.

Where things live:
  models/     Flax NNX models (decoder LLMs, encoders), tokenizers, weight readers
  engine/     the sampler (prefill, continuous-batching decode, constrained turns)
  memory/     the entity-centric memory graph on device and its search tools
  perception/ faces, speech segments, voices, ASR: media -> identities and transcripts
  agent/      memorization pipeline, memory writers, the control loop, judges
  rl/         DAPO/GRPO learner: rollouts, rewards, advantages, losses
  data/       episode generator, M3-Bench annotations, datasets
"""

import os

# m3jax takes only tokenizers and configs from transformers, and torch is not a runtime dependency: transformers'
# "PyTorch was not found" advice on import is noise to an m3jax user.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

__version__ = "0.1.0"
