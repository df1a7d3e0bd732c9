"""The demo: a 4-clip (2-minute) generated episode with two people, memorized with the template writer and
answered through the search tools by the deterministic rule-based answerer.

  m3jax demo --config configs/demo.py                     # ~2-4 min on 2 CPU cores
  m3jax demo --config configs/demo.py --set answerer=llm  # the SmolLM2-135M controller (reference protocol,
                                                          # 5 rounds): much slower on CPU, and weak
"""

from m3jax.agent.demo import DemoConfig
from m3jax.agent.memorize import MemorizeConfig
from m3jax.agent.perceive import PerceptionConfig
from m3jax.data.episodes import EpisodeConfig


def get_config() -> DemoConfig:
  return DemoConfig(
      episode=EpisodeConfig(seed=0, num_clips=4, num_characters=2),
      memorize=MemorizeConfig(perception=PerceptionConfig(face_fps=0.5)),
      answerer="rules",
      out_dir="m3jax_demo",
  )
