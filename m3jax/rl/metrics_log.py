"""Training metrics to JSONL (the record of truth, appended and resumable), TensorBoard and a final PNG."""

from __future__ import annotations

import json
import math
import pathlib

from m3jax.chunks import write_atomic
from m3jax.eval.stats import wilson_interval


class MetricsLog:
  """One JSON line and one TensorBoard scalar set per step; `plot()` draws the main curves from the JSONL."""

  def __init__(self, out_dir: str | pathlib.Path, resume_step: int = 0):
    from tensorboardX import SummaryWriter

    self.dir = pathlib.Path(out_dir)
    self.dir.mkdir(parents=True, exist_ok=True)
    self.jsonl = self.dir / "metrics.jsonl"
    if self.jsonl.exists():  # a resumed run rewrites the steps after its checkpoint
      kept = [l for l in self.jsonl.read_text().splitlines() if l.strip() and _step_of(l) <= resume_step]
      write_atomic(self.jsonl, "".join(l + "\n" for l in kept))  # a kill here must not lose the curve
    self._tb = SummaryWriter(str(self.dir / "tb"), purge_step=resume_step + 1 if resume_step else None)

  def logged(self, step: int) -> bool:
    """Whether the JSONL already holds a line for `step`."""
    return self.jsonl.exists() and any(_step_of(l) == step for l in self.jsonl.read_text().splitlines() if l.strip())

  def write(self, step: int, metrics: dict[str, float]) -> None:
    clean = {k: float(v) for k, v in metrics.items()}
    with self.jsonl.open("a") as f:
      f.write(json.dumps({"step": step, **clean}) + "\n")
    for k, v in clean.items():
      if math.isfinite(v):
        self._tb.add_scalar(k, v, step)
    self._tb.flush()

  def close(self) -> None:
    self._tb.close()

  def plot(self, keys: tuple[str, ...] = ("eval/accuracy", "reward/total", "reward/outcome", "train/loss",
                                          "train/entropy", "train/clip_high", "rollout/response_tokens")
           ) -> pathlib.Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(l) for l in self.jsonl.read_text().splitlines() if l.strip()] if self.jsonl.exists() else []
    keys = tuple(k for k in keys if any(k in r for r in rows))
    fig, axes = plt.subplots(1, max(len(keys), 1), figsize=(3.2 * max(len(keys), 1), 2.8), squeeze=False)
    for ax, key in zip(axes[0], keys):
      pts = [(r["step"], r[key]) for r in rows if key in r]
      ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".")
      if key == "eval/accuracy":  # its 95% Wilson band, where the line says over how many questions
        band = [(r["step"], *wilson_interval(round(r[key] * r["eval/n"]), int(r["eval/n"])))
                for r in rows if key in r and r.get("eval/n")]
        if band:
          ax.fill_between([b[0] for b in band], [b[1] for b in band], [b[2] for b in band], alpha=0.25)
      ax.set_title(key, fontsize=9)
      ax.set_xlabel("step")
    fig.tight_layout()
    path = self.dir / "curves.png"
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def _step_of(line: str) -> int:
  try:
    return int(json.loads(line)["step"])
  except (ValueError, KeyError):
    return 1 << 62
