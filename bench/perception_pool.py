"""Builds (or grows) the perception pool `train.py rl` mixes with gold graphs, and measures its cost per episode.

  python -m bench.perception_pool --seeds 0 8                       # train episodes 0..7, the demo's shape
  python -m bench.perception_pool --seeds 0 8 --dir runs/perception_pool

Each episode is rendered and memorized end to end (faces, voices, Whisper, the template writer) into its cached
entry (`m3jax.memorize.perception_pool`); entries already built are reused, so re-running only adds the seeds not
yet there. Final line: RESULT episodes=… built=… reused=… seconds_per_built_episode=… questions=… cpu=… load=…
"""

from __future__ import annotations

import argparse
import os
import time

from m3jax.memorize.perception_pool import perceived_episodes
from m3jax.data.questions import check_split
from bench.harness import cpu_model, machine, result_line


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--seeds", type=int, nargs=2, default=(0, 4), metavar=("LO", "HI"), help="train seeds [LO, HI)")
  ap.add_argument("--dir", default="runs/perception_pool", help="the pool's cache (RLConfig.pool_dir)")
  args = ap.parse_args()
  seeds = range(*args.seeds)
  check_split(seeds, "train")
  print(machine(), flush=True)
  t0 = time.perf_counter()
  _, records, _, stats = perceived_episodes(args.dir, seeds)
  built = [s for s in stats if not s["cached"]]
  per = sum(s["build_seconds"] for s in built) / len(built) if built else float("nan")
  print(result_line(episodes=len(stats), built=len(built), reused=len(stats) - len(built),
                    seconds_per_built_episode=f"{per:.1f}", questions=len(records),
                    wall_s=f"{time.perf_counter() - t0:.1f}", cpu=f"{cpu_model()} x{os.cpu_count()}",
                    load=f"{os.getloadavg()[0]:.2f}"))


if __name__ == "__main__":
  main()
