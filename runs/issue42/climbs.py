"""Walks a set-up path as a newcomer would: every call from one m3jax module into another, and how many of those
go up the layers of tests/test_layering.py (a lower layer calling a higher one).

  python runs/issue42/climbs.py ask MEMORY_DIR     # `m3jax ask`'s set-up: up to the first answer() call
  python runs/issue42/climbs.py rl                 # RL training's main: RLProgram(cfg) on the tiny test config
"""
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from test_layering import LAYERS  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2] / "m3jax"
moves, climbs, stop = [], [], [False]


def module_of(filename):
  try:
    rel = pathlib.Path(filename).resolve().relative_to(ROOT)
  except ValueError:
    return None
  return "m3jax." + ".".join(rel.with_suffix("").parts)


def layer(module):
  return LAYERS.get(module.split(".")[1])


def profile(frame, event, arg):
  if event != "call" or stop[0]:
    return
  callee = module_of(frame.f_code.co_filename)
  if callee is None:
    return
  if frame.f_code.co_name == "answer" and callee == "m3jax.control.answer":
    stop[0] = True
    return
  back = frame.f_back
  while back is not None and module_of(back.f_code.co_filename) is None:
    back = back.f_back  # through library frames (importlib, functools) to the m3jax caller
  caller = module_of(back.f_code.co_filename) if back is not None else None
  if caller is None or caller == callee or frame.f_code.co_name == "<module>":
    return  # a module body runs on import: not a move on the data's path
  moves.append((caller, callee))
  if layer(callee) is not None and layer(caller) is not None and layer(callee) > layer(caller):
    climbs.append(f"{caller} -> {callee}.{frame.f_code.co_name}")


if sys.argv[1] == "ask":
  from m3jax import cli
  sys.setprofile(profile)
  try:
    cli.main(["ask", "Where are the keys?", "--memory", sys.argv[2], "--answerer", "trained"])
  except SystemExit:
    pass
  finally:
    sys.setprofile(None)
else:
  import dataclasses
  from m3jax.config import load_config
  from m3jax.rl.program import RLProgram
  cfg = load_config(str(pathlib.Path(__file__).resolve().parents[2] / "configs" / "rl_tiny.py"))
  cfg = dataclasses.replace(cfg, model="tiny", train_seeds=(0, 2), eval_seeds=(1_000_000, 1_000_001), pool_ratio=0.0,
                            embedder="hashed", out_dir="/tmp/climbs_rl")
  sys.setprofile(profile)
  RLProgram(cfg)
  sys.setprofile(None)
distinct = sorted(set(climbs))
print(f"{len(set(moves))} distinct moves between modules, {len(distinct)} distinct climbs up a layer:")
for c in distinct:
  print("  ", c)
