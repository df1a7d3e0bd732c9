"""Where one decode call's time goes, op by op (XLA:CPU thunks under jax.profiler, both cores' threads), with each large
YNN fusion named by its HLO line: B rows of a 1024-slot cache filled lo..hi, 16 sampled steps. Session 22.

  PYTHONPATH=. python runs/issue45/probes/decode_step_profile.py B LO HI
"""
import collections
import glob
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
from jax.profiler import ProfileData

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from decode_call_probe import setup  # noqa: E402

B, lo, hi = (int(x) for x in sys.argv[1:4])
s, decode, x = setup(B, lo, hi, 16)
decode()
print("ms/step", [round(decode()[0] / 16 * 1e3, 1) for _ in range(2)])
trace = "/tmp/dtrace"; os.system(f"rm -rf {trace}")
with jax.profiler.trace(trace):
  decode()
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
N = x.cfg.max_new_tokens
carry = dict(step=jnp.int32(0), logits=x.logits, done=jnp.zeros(B, bool), n_gen=jnp.zeros((B,), jnp.int32),
             tokens=jnp.zeros((B, N), jnp.int32), logp=jnp.zeros((B, N), jnp.float32), key=x.keys)
from m3jax.engine.decode import window_slots
W = window_slots(int(x.length.max()) + N, 1024)
txt = _decode.lower(s.graphdef, s.params, x.cache, carry, jnp.int32(N), _decode_options(x.cfg), None, s.layers, W).compile().as_text()
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
