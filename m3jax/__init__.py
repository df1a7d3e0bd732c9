"""m3jax: M3-Agent (a multimodal agent with long-term memory) in JAX/Flax, built for throughput.

Where things live:
  models/     Flax NNX models (decoder LLMs, encoders), the sampler, weight readers
  memory/     the entity-centric memory graph on device and its search tools
  perception/ faces, speech segments, voices, ASR: media -> identities and transcripts
  agent/      memorization pipeline, memory writers, the control loop, judges
  rl/         DAPO/GRPO learner: rollouts, rewards, advantages, losses
  data/       episode generator, M3-Bench annotations, datasets
"""

__version__ = "0.1.0"
