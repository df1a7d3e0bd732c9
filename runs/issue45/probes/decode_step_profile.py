"""Where one decode call's time goes, op by op (XLA:CPU thunks under jax.profiler, both cores' threads), with each large
YNN fusion named by its HLO line: B rows of a 1024-slot cache filled lo..hi, 16 sampled steps. Session 22.

  PYTHONPATH=. python runs/issue45/probes/decode_step_profile.py B LO HI
"""
import sys, time, dataclasses, collections, glob, os, numpy as np, jax, jax.numpy as jnp
from m3jax.host_memory import retain_freed_memory
retain_freed_memory()
from flax import nnx
from jax.profiler import ProfileData
from m3jax.models.decoder import Decoder
from m3jax.engine.sampling import Sampler, SamplingConfig
from bench.learner_flops import SMOLLM2
model = Decoder(dataclasses.replace(SMOLLM2, attention_chunk=0), rngs=nnx.Rngs(0))
cfg = SamplingConfig(max_new_tokens=16, temperature=0.6, top_p=0.95, top_k=20)
s = Sampler(model, cfg)
rng = np.random.default_rng(0)
B, lo, hi = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
cache = model.init_cache(B, 1024)
k = jnp.asarray(rng.standard_normal(cache.k.shape) * 0.5, cache.k.dtype); v = jnp.asarray(rng.standard_normal(cache.v.shape) * 0.5, cache.v.dtype)
length = jnp.asarray(rng.integers(lo, hi, B), jnp.int32)
logits = jnp.asarray(rng.standard_normal((B, SMOLLM2.vocab_size)), jnp.float32)
keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.PRNGKey(0), jnp.arange(B))
def once():
  c = cache.replace(k=k + 0, v=v + 0, length=length); jax.block_until_ready(c)
  t = time.perf_counter(); out = s._run_decode(c, logits, np.zeros(B, bool), keys, cfg); jax.block_until_ready(out[0])
  return (time.perf_counter() - t) / 16
once(); print("ms/step", [round(once() * 1e3, 1) for _ in range(2)])
trace = "/tmp/dtrace"; os.system(f"rm -rf {trace}")
c = cache.replace(k=k + 0, v=v + 0, length=length); jax.block_until_ready(c)
with jax.profiler.trace(trace):
  out = s._run_decode(c, logits, np.zeros(B, bool), keys, cfg); jax.block_until_ready(out[0])
data = ProfileData.from_file(glob.glob(f"{trace}/**/*.xplane.pb", recursive=True)[0])
by_op = collections.Counter(); cnt = collections.Counter()
for ev in (ev for plane in data.planes for line in plane.lines if "Eigen" in line.name or "XLA" in line.name
           for ev in line.events if ev.name != "ThunkExecutor::Execute"):
  by_op[ev.name] += ev.duration_ns; cnt[ev.name] += 1
total = sum(by_op.values())
print(f"thread time {total/1e9:.3f} s for 16 steps")
pre = collections.Counter(); pc = collections.Counter()
for name, ns in by_op.items():
  pre[name.split(".")[0]] += ns; pc[name.split(".")[0]] += cnt[name]
for name, ns in pre.most_common(20):
  print(f"  {ns/1e6/16:8.2f} ms/step {100*ns/total:5.1f}%  {pc[name]/16:6.1f}/step {name}")
for name, ns in by_op.most_common(40):
  print(f"  {ns/1e6/16:8.2f} ms/step {100*ns/total:5.1f}%  {cnt[name]//16:4d}/step {name}")
from m3jax.engine.decode import _decode, _decode_options
N = cfg.max_new_tokens
carry = dict(step=jnp.int32(0), logits=logits, done=jnp.zeros(B, bool), n_gen=jnp.zeros((B,), jnp.int32),
             tokens=jnp.zeros((B, N), jnp.int32), logp=jnp.zeros((B, N), jnp.float32), key=keys)
from m3jax.engine.decode import window_slots
W = window_slots(int(length.max()) + N, 1024)
txt = _decode.lower(s.graphdef, s.params, cache, carry, jnp.int32(N), _decode_options(cfg), None, s.layers, W).compile().as_text()
defs = {}
for l in txt.splitlines():
  l = l.strip()
  if l.startswith("%") and " = " in l:
    name = l.split(" = ")[0][1:]
    defs[name] = l
print("window", W)
for name, ns in by_op.most_common(60):
  if name.startswith("ynn_fusion.") and name.endswith(("1", "2", "3", "4", "5", "6", "7", "8", "9", "0")):
    d = defs.get(name, "?")
    print(f"{ns/1e6/16:6.2f} ms {name}: {d[:260]}")
