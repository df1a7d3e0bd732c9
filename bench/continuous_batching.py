"""Continuous vs static batching of the controller: the shipped trained controller on held-out questions.

  python -m bench.continuous_batching [--n 32] [--slots 8] [--reps 2]

Both sides are m3jax with the same model, sampler and questions (`bench/controller_eval.py`'s held-out gold-memory
graphs). Static: the questions in batches of `--slots`; each batch runs round by round until its slowest question
answers (what controller_eval did before). Continuous: `--slots` KV-cache rows; a question that answers hands its
row to the next waiting one in the very next call (`Controller.run(slots=...)`). Each side runs once to compile
(its time printed apart), then `--reps` times, alternating; medians are reported. Greedy decoding, so the two must
give the same trajectory for every question: the script checks it and reports how many differ (float rounding
across batch shapes may flip a near-tie). `slot_utilisation` is sampled tokens / (batch rows x decode steps) of
the sampler: the share of the decode's row-steps that produced a token.

Final line: RESULT continuous_speedup=<static s / continuous s> static_s=… continuous_s=… util_static=…
util_continuous=… calls_static=… calls_continuous=… same_trajectories=k/n cpu=…
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from m3jax.control.controller import Question
from m3jax.control import make_answerer
from m3jax.memory.embedders import make_embedder
from bench.controller_eval import heldout_task
from bench.harness import cpu_model, machine, result_line


class CountingPolicy:
  """Counts the policy's generation calls (begin / step / advance), passing everything through."""

  def __init__(self, inner):
    self.inner, self.calls = inner, 0

  def __getattr__(self, name):
    attr = getattr(self.inner, name)
    if name in ("begin", "step", "advance"):
      def counted(*args, **kwargs):
        self.calls += 1
        return attr(*args, **kwargs)
      return counted
    return attr


def run(answerer, questions, slots: int, continuous: bool):
  """(seconds, trajectories, generation calls, decode slot utilisation) of one pass over `questions`."""
  sampler = answerer.policy.sampler
  policy = answerer.controller.policy = CountingPolicy(answerer.policy)
  tokens, row_steps = sampler.decode_tokens, sampler.decode_row_steps
  t = time.perf_counter()
  if continuous:
    answerer.slots = slots
    answerer.answer(questions)
    trajs = answerer.trajectories
  else:
    answerer.slots, trajs = None, []
    for i in range(0, len(questions), slots):
      answerer.answer(questions[i:i + slots])
      trajs += answerer.trajectories
  seconds = time.perf_counter() - t
  answerer.controller.policy = answerer.policy
  util = (sampler.decode_tokens - tokens) / max(sampler.decode_row_steps - row_steps, 1)
  return seconds, trajs, policy.calls, util


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=32, help="held-out questions")
  ap.add_argument("--slots", type=int, default=8, help="KV-cache rows (a power of two: the sampler's batch bucket)")
  ap.add_argument("--reps", type=int, default=2)
  ap.add_argument("--adapter", default=None, help="a controller adapter (default: the shipped one)")
  args = ap.parse_args()
  if args.n < 1 or args.slots < 1 or args.reps < 1:
    sys.exit("continuous_batching: --n, --slots and --reps must be >= 1")
  print(machine(), flush=True)
  embed = make_embedder("minilm")
  graphs, records = heldout_task(args.n, embed, int(np.asarray(embed(["x"])).shape[-1]))
  questions = [Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip,
                        question_types=r.types) for r in records]
  answerer = make_answerer("trained", graphs, embed, adapter=args.adapter)
  answerer.namer = None  # the raw protocol: only the controller is timed
  times = {False: [], True: []}
  stats = {}
  for rep in range(args.reps + 1):
    for continuous in (False, True):
      seconds, trajs, calls, util = run(answerer, questions, args.slots, continuous)
      label = "continuous" if continuous else "static"
      print(f"{'compile+run' if rep == 0 else f'rep {rep}'} {label:10s} {seconds:7.1f} s  {calls} calls  "
            f"slot utilisation {util:.3f}  load {os.getloadavg()[0]:.2f}", flush=True)
      if rep:
        times[continuous].append(seconds)
      stats[continuous] = (trajs, calls, util)
  same = sum(a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(stats[False][0], stats[True][0]))
  rounds = [len(t.rounds) for t in stats[True][0]]
  print(f"rounds per question: mean {np.mean(rounds):.2f}, max {max(rounds)}; same trajectories {same}/{args.n}")
  static_s, cont_s = statistics.median(times[False]), statistics.median(times[True])
  print(result_line(continuous_speedup=f"{static_s / cont_s:.2f}", static_s=f"{static_s:.1f}",
                    continuous_s=f"{cont_s:.1f}", util_static=f"{stats[False][2]:.3f}",
                    util_continuous=f"{stats[True][2]:.3f}", calls_static=stats[False][1],
                    calls_continuous=stats[True][1], same_trajectories=f"{same}/{args.n}", n=args.n, slots=args.slots,
                    cpu=cpu_model().replace(' ', '_')))


if __name__ == "__main__":
  main()
