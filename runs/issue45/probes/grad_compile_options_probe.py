import sys, time, dataclasses, numpy as np, jax
from flax import nnx
from m3jax.models import lora
from m3jax.models.decoder import Decoder
from m3jax.rl import learner as L
from bench.learner_flops import SMOLLM2
cfg = dataclasses.replace(SMOLLM2, attention_chunk=128)
model = Decoder(cfg, rngs=nnx.Rngs(0)); lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0))
lc = L.LearnerConfig(optim=L.OptimConfig(lr=1e-5), micro_batch=2, layer_loop="scan", length_bucket=64, share_prefix=4)
ln = L.Learner(model, lc)
rows, T, P = 4, 512, 256
rng = np.random.default_rng(0)
mask = np.zeros((rows, T), np.float32); mask[:, 300:348] = 1; mask[:, 450:498] = 1
tok = rng.integers(5, 49152, (rows, T)).astype(np.int32); tok[:, :P] = tok[0, :P]
batch = {"tokens": tok, "lengths": np.full((rows,), T, np.int32), "mask": mask,
         "advantages": (rng.normal(size=(rows, 1)) * mask).astype(np.float32), "old_logp": np.zeros((rows, T), np.float32)}
(idx, width, prefix), = ln._calls(batch, np.arange(rows))
mb = ln._slice(batch, idx, width)
for opts in sys.argv[1:]:
  co = {k: {"true": True, "false": False}.get(v, v) for k, v in (kv.split("=") for kv in opts.split(","))} if opts != "default" else {}
  t = time.perf_counter()
  try:
    c = L._grad_sums.lower(ln.graphdef, lc, prefix, ln.rest, ln.params, mb, np.float32(1.0)).compile(compiler_options=co)
  except Exception as e:
    print(opts, "ERR", str(e).splitlines()[0][:100], flush=True); continue
  tc = time.perf_counter() - t
  runs = []
  for _ in range(2):
    t = time.perf_counter(); jax.block_until_ready(c(ln.rest, ln.params, mb, np.float32(1.0))); runs.append(time.perf_counter() - t)
  print(f"{opts}: compile {tc:.1f} s, run {min(runs):.2f} s (all {[round(r, 2) for r in runs]})", flush=True)
