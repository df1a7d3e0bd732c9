"""m3jax demo --config configs/demo.py

The demo (what `./m3 demo` runs): a 4-clip (2-minute) generated episode with two people from the test split (seed
2,000,000: never trained on, never used to choose anything), memorized with the template writer, its questions
answered through the search tools by the shipped trained controller and, side by side, the deterministic rule-based
answerer, per question type: the strict judge first, contains beside it, and trained − rules with its paired 95%
interval.

  m3jax demo --config configs/demo.py --set "answerers=('trained','untrained','rules')"  # + the prompted base
  m3jax demo --config configs/demo.py --set adapter=runs/rl_controller/adapter.npz       # another controller
"""

from m3jax.eval.demo import DemoConfig
from m3jax.memorize.pipeline import MemorizeConfig
from m3jax.data.episodes import EpisodeConfig
from m3jax.data.questions import TEST_SEED_START


def get_config() -> DemoConfig:
  return DemoConfig(
      episode=EpisodeConfig(seed=TEST_SEED_START, num_clips=4, num_characters=2),
      memorize=MemorizeConfig(),
      answerers=("trained", "rules"),
      out_dir="m3jax_demo",
  )
