import sys, time, dataclasses, numpy as np, jax
from flax import nnx
from m3jax.models import lora
from m3jax.models.decoder import Decoder
from m3jax.rl import learner as L
from bench.learner_flops import SMOLLM2
variant = sys.argv[1]  # e.g. unroll:128:64
loop, achunk, P = variant.split(":"); achunk, P = int(achunk), int(P)
kv = dict(a.split("=") for a in sys.argv[2:])
cfg = dataclasses.replace(SMOLLM2, attention_chunk=achunk, **{k[2:]: int(v) for k, v in kv.items() if k.startswith("m.")})
model = Decoder(cfg, rngs=nnx.Rngs(0)); lora.attach(model, lora.LoRAConfig(rank=8, alpha=16.0))
lc = L.LearnerConfig(optim=L.OptimConfig(lr=1e-5), micro_batch=2, layer_loop=loop, length_bucket=64, share_prefix=4, **{k[2:]: int(v) for k, v in kv.items() if k.startswith("l.")})
ln = L.Learner(model, lc)
rows, T = 4, 1024
rng = np.random.default_rng(0)
mask = np.zeros((rows, T), np.float32); mask[:, 600:648] = 1; mask[:, 900:948] = 1
tok = rng.integers(5, 49152, (rows, T)).astype(np.int32); tok[:, :P] = tok[0, :P]
batch = {"tokens": tok, "lengths": np.full((rows,), T, np.int32), "mask": mask,
         "advantages": (rng.normal(size=(rows, 1)) * mask).astype(np.float32), "old_logp": np.zeros((rows, T), np.float32)}
(idx, width, prefix), = ln._calls(batch, np.arange(rows))
mb = ln._slice(batch, idx, width)
t = time.perf_counter()
lowered = L._grad_sums.lower(ln.graphdef, lc, prefix, ln.rest, ln.params, mb, np.float32(1.0))
t1 = time.perf_counter()
txt = lowered.as_text()
comp = lowered.compile()
t2 = time.perf_counter()
print(f"{variant} layers={cfg.num_layers} prefix={prefix} width={width}: lower {t1-t:.1f} s compile {t2-t1:.1f} s stablehlo lines {txt.count(chr(10))}", flush=True)
