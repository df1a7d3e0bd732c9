import sys, time, dataclasses, numpy as np, jax
from flax import nnx
from m3jax.models import lora
from m3jax.models.decoder import Decoder
from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig
from bench.learner_flops import SMOLLM2
from m3jax.rl.flops import learner_step_flops
T = int(sys.argv[1]); rows = int(sys.argv[2]); variants = sys.argv[3].split(",")
def make(dtype, achunk, loop, mb):
  cfg = dataclasses.replace(SMOLLM2, attention_chunk=achunk)
  model = Decoder(cfg, rngs=nnx.Rngs(0)); lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0))
  learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-5), micro_batch=mb, layer_loop=loop, length_bucket=256,
                    compute_dtype=dtype))
  rng = np.random.default_rng(0)
  mask = np.zeros((rows, T), np.float32)
  for s in range(4): mask[:, int(T*(0.3+0.17*s)):int(T*(0.3+0.17*s))+48] = 1
  batch = {"tokens": rng.integers(5, 49152, (rows, T)).astype(np.int32), "lengths": np.full((rows,), T, np.int32),
           "mask": mask, "advantages": (rng.normal(size=(rows, 1)) * mask).astype(np.float32)}
  batch["old_logp"] = learner.logprobs(batch)[0] * mask
  fl = learner_step_flops(cfg, batch["lengths"], int(mask.sum()), 8, lora.LoRAConfig().targets)["total"]
  return learner, batch, fl
runs = {}
for v in variants:
  dt, ac, loop, mb = v.split(":")
  runs[v] = make(None if dt == "f32" else "bfloat16", int(ac), loop, int(mb))
  t = time.perf_counter(); runs[v][0].update(runs[v][1], seed=0); print(v, "first (compile)", round(time.perf_counter()-t,1), flush=True)
res = {v: [] for v in variants}
for r in range(3):
  for v in variants:
    l, b, fl = runs[v]
    t = time.perf_counter(); l.update(b, seed=r+1); res[v].append(time.perf_counter()-t)
for v in variants:
  l, b, fl = runs[v]; m = sorted(res[v])[1]
  print(f"{v}: {m:.2f} s  {fl/1e9:.0f} GFLOP  {fl/1e9/m:.1f} GFLOP/s  (all {[round(x,2) for x in res[v]]})", flush=True)
