import sys, time, dataclasses, numpy as np, jax
from flax import nnx
from m3jax.models.decoder import Decoder
from m3jax.engine.sampling import Sampler
from m3jax.engine.decode import SamplingConfig
from bench.learner_flops import SMOLLM2
B, P, N = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]); variants = sys.argv[4].split(",")
rng = np.random.default_rng(0)
prompts = [list(rng.integers(5, 49152, int(rng.integers(P // 2, P))).astype(int)) for _ in range(B)]
for v in variants:
  dt, mode = v.split(":")
  cfg = dataclasses.replace(SMOLLM2, param_dtype=dt, compute_dtype=dt, attention_chunk=0)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  sc = SamplingConfig(max_new_tokens=N, greedy=(mode == "greedy"), temperature=0.6, top_p=0.95, top_k=20, seed=0)
  s = Sampler(model, sc)
  for rep in range(3):
    w0 = dataclasses.replace(s.work); t = time.perf_counter(); out = s.generate(prompts); dt_ = time.perf_counter() - t
    w = s.work
    print(v, rep, f"total {dt_:.2f} s  prefill {w.prefill_s - w0.prefill_s:.2f} s  decode {w.decode_s - w0.decode_s:.2f} s  steps {w.decode_steps - w0.decode_steps}  ms/step {(w.decode_s - w0.decode_s) / max(w.decode_steps - w0.decode_steps, 1) * 1000:.1f}", flush=True)
