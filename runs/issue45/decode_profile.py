import dataclasses, time, sys, collections, glob, os
import numpy as np, jax
from m3jax.models.llm import load_llm
from m3jax.engine.sampling import Sampler, SamplingConfig
import m3jax.models.decoder as dec
if 'ew' in sys.argv:
  sys.argv=['x']; exec(open('runs/issue45/ewdef.py').read()); dec.cached_attention = ew_attention
model, tok = load_llm()
B, n, slots, new = 16, 256, 512, 32
prompts = np.random.RandomState(0).randint(100, 40000, (B, n)).tolist()
cfg = SamplingConfig(max_new_tokens=new, temperature=0.6, top_p=0.95, top_k=20, length_buckets=(n, slots))
sampler = Sampler(model, cfg)
sampler.generate(prompts)
d = "/tmp/m3jax_decode_trace"
os.system(f"rm -rf {d}")
with jax.profiler.trace(d):
  sampler.generate(prompts)
f = glob.glob(f"{d}/**/*.xplane.pb", recursive=True)[0]
from jax.profiler import ProfileData
pd = ProfileData.from_file(f)
agg = collections.Counter(); cnt = collections.Counter()
for plane in pd.planes:
  for line in plane.lines:
    for ev in line.events:
      agg[(plane.name[:20], line.name[:30], ev.name[:70])] += ev.duration_ns; cnt[(plane.name[:20], line.name[:30], ev.name[:70])] += 1
for k, v in []:
  print(f"{v/1e6:9.1f} ms {cnt[k]:6d}  {k}")
print("=== decode window")
win = None
for plane in pd.planes:
  for line in plane.lines:
    for ev in line.events:
      if ev.name.endswith("_decode_rows"):
        win = (ev.start_ns, ev.start_ns + ev.duration_ns)
agg = collections.Counter(); cnt = collections.Counter()
for plane in pd.planes:
  for line in plane.lines:
    if "Eigen" not in line.name: continue
    for ev in line.events:
      if win[0] <= ev.start_ns <= win[1] and ev.name != "ThunkExecutor::Execute":
        agg[ev.name[:60]] += ev.duration_ns; cnt[ev.name[:60]] += 1
print("window ms", (win[1]-win[0])/1e6)
cat = collections.Counter()
for k, v in agg.items(): cat[k.split(".")[0]] += v
for k, v in cat.most_common(12): print(f"{v/1e6:9.1f} ms {k}")
