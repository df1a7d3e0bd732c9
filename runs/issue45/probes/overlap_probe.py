"""Does a rollout overlapping the learner pay on 2 cores? One learner update (LoRA, SmolLM2-135M shapes, random
weights, R rows x T tokens) and 32-row decode calls (decode_call_probe's, N steps over a 1024-slot cache filled
300..700), timed alone, then together: the update in a second thread while the main thread runs decode calls until
it ends. Prints the work done together against its cost one after the other. Session 23.

  PYTHONPATH=. python runs/issue45/probes/overlap_probe.py R T N
"""
import dataclasses
import os
import pathlib
import sys
import threading
import time

import numpy as np
from flax import nnx

from bench.learner_flops import SMOLLM2
from m3jax.models import lora
from m3jax.models.decoder import Decoder
from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from decode_call_probe import setup  # noqa: E402


def make_learner(rows: int, t: int):
  model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=128), rngs=nnx.Rngs(0))
  lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0))
  learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-5), micro_batch=2, layer_loop="scan",
                                         length_bucket=64))
  rng = np.random.default_rng(0)
  mask = np.zeros((rows, t), np.float32)
  mask[:, t // 2:t // 2 + 96] = 1
  batch = {"tokens": rng.integers(5, 49152, (rows, t)).astype(np.int32), "lengths": np.full((rows,), t, np.int32),
           "mask": mask, "advantages": (rng.normal(size=(rows, 1)) * mask).astype(np.float32)}
  batch["old_logp"] = learner.logprobs(batch)[0] * mask
  return learner, batch


def main(rows: int, t: int, n: int):
  learner, batch = make_learner(rows, t)
  _, decode, _ = setup(32, 300, 700, n)
  decode()
  learner.update(batch, seed=0)  # both compiled
  alone_d = sorted(decode()[0] for _ in range(3))[1]
  alone_l = []
  for s in range(3):
    t0 = time.perf_counter()
    learner.update(batch, seed=s + 1)
    alone_l.append(time.perf_counter() - t0)
  alone_l = sorted(alone_l)[1]
  print(f"alone: learner update {alone_l:.2f} s, decode call ({n} steps) {alone_d:.2f} s", flush=True)
  for rep in range(2):
    done = threading.Event()
    took = {}

    def learn():
      t0 = time.perf_counter()
      learner.update(batch, seed=10 + rep)
      took["learner"] = time.perf_counter() - t0
      done.set()

    t0 = time.perf_counter()
    th = threading.Thread(target=learn)
    th.start()
    calls = 0
    while not done.is_set():
      decode()
      calls += 1
    th.join()
    wall = time.perf_counter() - t0
    serial = alone_l + calls * alone_d
    print(f"together: wall {wall:.2f} s (learner {took['learner']:.2f} s beside {calls} decode calls); the same work "
          f"one after the other {serial:.2f} s; together / serial {wall / serial:.3f}", flush=True)
  print(f"cpu: {os.cpu_count()} cores; load {os.getloadavg()}")


if __name__ == "__main__":
  main(*(int(x) for x in sys.argv[1:4]))
