"""Serve's request-level joining against static batches: latency of the trained controller under a stream of questions.

  python -m bench.serve_joining [--questions 32] [--gap 1.0] [--reps 3] [--slots 16]

One process, the shipped controller (SmolLM2-135M + `controller.npz`, greedy, the protocol its adapter records)
answering held-out questions over gold-memory graphs, each graph a serve space (`SpaceStore.import_graph`, MiniLM
embedder). The same arrival schedule (exponential gaps of mean `--gap` s, fixed seed) is played against:
  * static: `Batcher` (max_batch 64, max_wait 5 ms) over `ControllerAnswerer.__call__`: the questions queued when
    a batch starts run together (through `--slots` KV-cache rows); later arrivals wait for the whole batch;
  * joining: `JoiningBatcher` over `ControllerAnswerer.stream`: a question enters the next policy call in a free
    slot and returns as soon as its own trajectory ends.
Both drive the same policy object, so they share every compiled program; each is run once untimed first (compiles),
then the two alternate for `--reps` rounds (the machine may be shared) and medians are reported. Latency is submit
to answer; the answers of the two modes are checked to be identical (greedy decoding).
Final line: RESULT mean_latency_static_s=... mean_latency_joining_s=... latency_gain=... p95_static_s=...
p95_joining_s=... makespan_static_s=... makespan_joining_s=... same_answers=... cpu=... load=...
"""

from __future__ import annotations

import argparse
import os
import tempfile
import threading
import time

import numpy as np

from m3jax.data.memory_qa import heldout_questions, make_task
from m3jax.memory.embedders import make_embedder
from m3jax.serve.answering import AskItem, ControllerAnswerer, SharedEmbedCache
from m3jax.serve.batching import Batcher, JoiningBatcher
from m3jax.serve.config import ServeConfig
from m3jax.serve.spaces import SpaceStore
from bench.harness import cpu_model, machine, result_line


def play(batcher, items: list[AskItem], arrivals: np.ndarray) -> tuple[list[float], list[dict], float]:
  """Submits item i at arrivals[i] seconds (from a feeder thread); returns latencies, answers and the makespan."""
  futures, submitted, done = [None] * len(items), [0.0] * len(items), [0.0] * len(items)
  start = time.perf_counter()

  def feed():
    for i, (item, at) in enumerate(zip(items, arrivals)):
      time.sleep(max(0.0, start + at - time.perf_counter()))
      submitted[i] = time.perf_counter()
      futures[i] = batcher.submit([item])[0]
      futures[i].add_done_callback(lambda _f, i=i: done.__setitem__(i, time.perf_counter()))

  feeder = threading.Thread(target=feed)
  feeder.start()
  feeder.join()
  answers = [f.result(timeout=3600) for f in futures]
  time.sleep(0.05)  # done-callbacks run in the thread that resolves the future: let the last ones land
  return [d - s for d, s in zip(done, submitted)], answers, max(done) - start


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--questions", type=int, default=32)
  ap.add_argument("--gap", type=float, default=1.0, help="mean seconds between arrivals (exponential)")
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--slots", type=int, default=16)
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()
  print(machine(), flush=True)

  embed = make_embedder("minilm")
  dim = int(np.asarray(embed(["x"])).shape[-1])
  seeds, records = heldout_questions(args.questions)
  graphs, _ = make_task(seeds, embed, dim, split="heldout")
  cfg = ServeConfig(embedder="minilm")
  with tempfile.TemporaryDirectory() as tmp:
    store = SpaceStore(tmp, cfg.graph, cfg.search, SharedEmbedCache(embed))
    spaces = [store.import_graph("bench", f"g{i}", g) for i, g in enumerate(graphs)]
    items = [AskItem(spaces[r.memory_id], r.question, r.before_clip) for r in records]
    arrivals = np.cumsum(np.random.default_rng(args.seed).exponential(args.gap, len(items)))
    arrivals -= arrivals[0]
    answerer = ControllerAnswerer.from_llm(cfg.llm, cfg.max_new_tokens, cfg.max_rounds, store, adapter="",
                                           slots=args.slots)
    modes = {"static": lambda: Batcher(answerer, 64, 0.005),
             "joining": lambda: JoiningBatcher(answerer, answerer.stream, 64)}
    results = {m: [] for m in modes}
    answers = {}
    for rep in range(args.reps + 1):  # rep 0 compiles (untimed)
      for mode, make in modes.items():
        batcher = make()
        try:
          lat, ans, makespan = play(batcher, items, arrivals)
        finally:
          batcher.close()
        answers[mode] = [a["answer"] for a in ans]
        if rep:
          results[mode].append((float(np.mean(lat)), float(np.percentile(lat, 95)), makespan))
          print(f"rep {rep} {mode:8s} mean {np.mean(lat):6.2f} s  p95 {np.percentile(lat, 95):6.2f} s  "
                f"makespan {makespan:6.1f} s  load {os.getloadavg()[0]:.1f}", flush=True)
    store.close()
  med = {m: np.median(np.array(r), axis=0) for m, r in results.items()}
  same = answers["static"] == answers["joining"]
  print(result_line(mean_latency_static_s=f"{med['static'][0]:.2f}", mean_latency_joining_s=f"{med['joining'][0]:.2f}",
                    latency_gain=f"{med['static'][0] / med['joining'][0]:.2f}", p95_static_s=f"{med['static'][1]:.2f}",
                    p95_joining_s=f"{med['joining'][1]:.2f}", makespan_static_s=f"{med['static'][2]:.1f}",
                    makespan_joining_s=f"{med['joining'][2]:.1f}", same_answers=same, questions=len(items),
                    gap_s=args.gap, slots=args.slots, cpu=cpu_model(), load=f"{os.getloadavg()[0]:.1f}"))


if __name__ == "__main__":
  main()
