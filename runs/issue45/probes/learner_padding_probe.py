"""The learner's update on 4 rows of 1024 tokens plus 4 padding rows (length 1, nothing trained, as
`rollout.build_batch` pads a batch that kept fewer groups), with the padding micro-batches left out (today) and run
(the padding rows given one trained position with advantage 0, which is what running them costs), interleaved.

  PYTHONPATH=. python runs/issue45/probes/learner_padding_probe.py
"""
import time, dataclasses, numpy as np, jax
from flax import nnx
from m3jax.models import lora
from m3jax.models.decoder import Decoder
from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig
from bench.learner_flops import SMOLLM2
from bench.harness import machine
print(machine(), flush=True)
T, real, pad = 1024, 4, 4
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=128), rngs=nnx.Rngs(0))
lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0))
learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-5), micro_batch=2, layer_loop="scan", length_bucket=256))
rng = np.random.default_rng(0)
n = real + pad
mask = np.zeros((n, T), np.float32)
for s in range(4):
  mask[:real, int(T * (0.3 + 0.17 * s)):int(T * (0.3 + 0.17 * s)) + 48] = 1
batch = {"tokens": rng.integers(5, 49152, (n, T)).astype(np.int32), "lengths": np.r_[np.full(real, T), np.ones(pad)].astype(np.int32),
         "mask": mask, "advantages": (rng.normal(size=(n, 1)) * mask).astype(np.float32)}
batch["old_logp"] = learner.logprobs(batch)[0] * mask
run_pad = dict(batch, mask=batch["mask"].copy())
run_pad["mask"][real:, 0] = 1  # one trained position, advantage 0: the padding micro-batches run
times = {"left out": [], "run": []}
for r in range(4):
  for name, b in (("left out", batch), ("run", run_pad)):
    t = time.perf_counter(); learner.update(dict(b), seed=r); dt = time.perf_counter() - t
    if r: times[name].append(dt)
for name, ts in times.items():
  print(f"padding micro-batches {name}: {sorted(ts)[1]:.2f} s (all {[round(x, 2) for x in ts]})", flush=True)
