"""Training entry point: `python train.py <program> --config configs/NAME.py [--set key=value ...]`.

  python train.py rl --config configs/rl_tiny.py       # DAPO on the controller's trajectories (m3jax.rl)
  python train.py sft --config configs/sft_tiny.py     # SFT of the Omni memorization model (m3jax.sft)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.host_memory import retain_freed_memory


def _rl(args) -> dict:
  from m3jax.rl.program import RLConfig, main
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(RLConfig(), args.overrides)
  return main(cfg)


def _sft(args) -> dict:
  from m3jax.sft.run import SFTConfig, main
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(SFTConfig(), args.overrides)
  history = main(cfg)
  return history[-1] if history else {}


PROGRAMS: dict[str, tuple[str, Callable]] = {
    "rl": ("DAPO on the multi-turn control policy's own trajectories", _rl),
    "sft": ("supervised fine-tuning of the Qwen2.5-Omni thinker on clip -> memory examples", _sft),
}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="program", required=True)
  for name, (help_text, _) in PROGRAMS.items():
    add_config_args(sub.add_parser(name, help=help_text))
  args = parser.parse_args(argv)
  retain_freed_memory()
  summary = PROGRAMS[args.program][1](args)
  print(json.dumps(summary, default=float))
  return 0


if __name__ == "__main__":
  sys.exit(main())
