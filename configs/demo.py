"""m3jax demo --config configs/demo.py

The demo (what `./m3 demo` runs): a 4-clip (2-minute) generated episode with two people, memorized with the
template writer, its questions answered through the search tools by the shipped trained controller and, side by
side, the deterministic rule-based answerer, per question type.

  m3jax demo --config configs/demo.py --set "answerers=('trained','untrained','rules')"  # + the prompted base
  m3jax demo --config configs/demo.py --set adapter=runs/rl_controller/adapter.npz       # another controller
"""

from m3jax.agent.demo import DemoConfig
from m3jax.agent.memorize import MemorizeConfig
from m3jax.data.episodes import EpisodeConfig


def get_config() -> DemoConfig:
  return DemoConfig(
      episode=EpisodeConfig(seed=0, num_clips=4, num_characters=2),
      memorize=MemorizeConfig(),
      answerers=("trained", "rules"),
      out_dir="m3jax_demo",
  )
