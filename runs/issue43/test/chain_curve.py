"""The shipped controller's dev curve over its last three DAPO runs (sized, explore, curriculum), one after the
other: each run's held-out accuracy (64 dev questions, greedy, strict judge) every 10 steps with 95% Wilson
intervals, the steps counted from the stage-3 adapter. Writes m3jax/data/controller/curve.png.
  PYTHONPATH=. python runs/issue43/test/chain_curve.py"""
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from m3jax.eval.stats import wilson_interval

RUNS = (("sized", "runs/rl_sized"), ("explore", "runs/rl_explore"), ("curriculum", "runs/rl_curriculum"))
fig, ax = plt.subplots(figsize=(8, 4))
offset = 0
for label, path in RUNS:
  pts = [json.loads(l) for l in open(f"{path}/metrics.jsonl")]
  pts = [(p["step"], p["eval/accuracy"], int(p["eval/n"])) for p in pts if "eval/accuracy" in p]
  xs = [offset + s for s, _, _ in pts]
  ys = [a for _, a, _ in pts]
  lo, hi = zip(*[wilson_interval(round(a * n), n) for _, a, n in pts])
  ax.plot(xs, ys, marker="o", ms=3, label=f"{label} (steps {offset}-{offset + pts[-1][0]})")
  ax.fill_between(xs, lo, hi, alpha=0.15)
  offset += pts[-1][0]
ax.axvline(150 + 100 + 74, color="k", ls=":", lw=1, label="shipped: curriculum step 74")
ax.set_xlabel("DAPO steps after stage 3 (stage3_dapo.npz)")
ax.set_ylabel("dev accuracy, strict (64 questions)")
ax.set_ylim(0.3, 1.0)
ax.legend(fontsize=8, loc="lower right")
ax.grid(alpha=0.3)
fig.tight_layout()
fig.savefig("m3jax/data/controller/curve.png", dpi=110)
print("wrote m3jax/data/controller/curve.png")
