"""Training entry point: `python train.py <program> --config configs/NAME.py [--set key=value ...]`.

A config is required: the defaults alone would start a run nobody chose (and write into ./runs). Bad input (a
missing config file, an unknown or invalid field) is one `train.py: error: ...` line, not a traceback.

  python train.py rl --config configs/rl_tiny.py       # DAPO on the controller's trajectories (m3jax.rl)
  python train.py sft --config configs/sft_tiny.py     # SFT of the Omni memorization model (m3jax.sft)

A run is a sequence of chunks of at most `--max-minutes` (default 90; `chunk.max_minutes`, `chunk.max_steps`):
a chunk that runs out of time saves its state in the config's out_dir, writes there `continue.cmd` (this
command) and exits 0 with a line naming it; running it again continues exactly (m3jax.chunks).

On a pod every process runs the same command with `--set distributed.enabled=true` plus the coordinator
settings (or the M3JAX_* variables / `distributed.auto=true`, see m3jax.distributed) and a global
`--set "mesh=(data,fsdp,tensor)"` over every process's devices.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable, Sequence

from m3jax import chunks, compile_cache
from m3jax.config import add_config_args, load_config
from m3jax.errors import run_cli
from m3jax.host_memory import retain_freed_memory


def _load(args):
  """The program's config, with the distributed runtime joined (before any JAX computation) when it asks."""
  from m3jax.distributed import initialize
  overrides = list(args.overrides)
  if args.max_minutes is not None:
    overrides.append(f"chunk.max_minutes={args.max_minutes}")
  cfg = load_config(args.config, overrides)
  initialize(cfg.distributed)
  return cfg


def _rl(cfg) -> tuple[dict, dict]:
  from m3jax.rl.program import main
  summary = main(cfg)
  return summary, summary["chunk"]


def _sft(cfg) -> tuple[dict, dict]:
  from m3jax.sft.run import main
  history, chunk = main(cfg)
  return {**(history[-1] if history else {}), "chunk": chunk}, chunk


PROGRAMS: dict[str, tuple[str, str, Callable]] = {
    "rl": ("DAPO on the multi-turn control policy's own trajectories", "configs/rl_tiny.py", _rl),
    "sft": ("supervised fine-tuning of the Qwen2.5-Omni thinker on clip -> memory examples", "configs/sft_tiny.py",
            _sft),
}


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="program", required=True)
  programs = {}
  for name, (help_text, _, _) in PROGRAMS.items():
    programs[name] = sub.add_parser(name, help=help_text)
    add_config_args(programs[name])
    programs[name].add_argument("--max-minutes", type=float, default=None, metavar="N",
                                help="end this chunk between steps before N minutes (chunk.max_minutes, default "
                                     "90; 0 = no limit), saving the state that `continue.cmd` continues from")
  argv = list(sys.argv[1:] if argv is None else argv)
  args = parser.parse_args(argv)
  _, example, run = PROGRAMS[args.program]
  if not args.config:
    programs[args.program].error(f"--config is required, e.g. --config {example}")
  retain_freed_memory()
  compile_cache.enable()
  cfg = _load(args)
  cmd = chunks.command("train.py", argv)
  import jax
  lead = jax.process_index() == 0
  if lead:
    chunks.begin(cfg.out_dir, cmd)
  summary, chunk = run(cfg)
  if lead:
    line = chunks.end(cfg.out_dir, cmd, chunk, chunks.elapsed_minutes())
    print(json.dumps(summary, default=float))
    print(line, flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(run_cli(main, prog="train.py"))
