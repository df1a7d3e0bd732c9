"""Summary statistics and plots of an evaluation JSONL (one judged trajectory per line).

Computed from the file, not from in-memory state, so a resumed run summarises every question answered so far.
Beyond M3-Bench's accuracy (overall and per question type), it reports the behaviour the RL reward shapes
(rounds, searches, empty searches, format errors, unanswered questions, invalid judge replies) and, where the
evidence clip is known, accuracy against the number of clips between evidence and question: a forgetting curve.
"""

from __future__ import annotations

import json
import math
import pathlib
from collections import defaultdict
from typing import Any, Iterable, Sequence


def read_jsonl(path: str | pathlib.Path) -> list[dict[str, Any]]:
  """Reads a results file; a torn last line (a run killed mid-write) is dropped, any other bad line is an error."""
  path = pathlib.Path(path)
  if not path.exists():
    return []
  lines = path.read_text(encoding="utf-8").splitlines()
  records = []
  for n, line in enumerate(lines):
    if not line.strip():
      continue
    try:
      records.append(json.loads(line))
    except json.JSONDecodeError as err:
      if n == len(lines) - 1:
        break
      raise ValueError(f"{path}:{n + 1}: not a JSON line ({err})") from err
  return records


def _rate(num: float, den: float) -> float:
  return float(num) / den if den else 0.0


def _accuracy_by(records: Iterable[dict[str, Any]], keys_of) -> dict[str, dict[str, float]]:
  hits: dict[str, list[int]] = defaultdict(lambda: [0, 0])
  for r in records:
    for key in keys_of(r):
      hits[key][0] += int(bool(r["correct"]))
      hits[key][1] += 1
  return {k: {"accuracy": _rate(c, n), "count": n} for k, (c, n) in sorted(hits.items())}


def distance_bucket(distance: int) -> str:
  """Log-spaced buckets of clip distance (0, 1, 2-3, 4-7, ...), so long videos do not give one point per clip."""
  if distance <= 1:
    return str(max(distance, 0))
  low = 1 << int(math.log2(distance))
  return f"{low}-{2 * low - 1}"


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
  """Aggregates judged trajectory records (`Trajectory.to_json()` plus `correct`, `judge_valid`, `video_id`)."""
  n = len(records)
  rounds = [r["rounds"] for r in records]
  num_rounds = sum(len(x) for x in rounds)
  searches = [t for x in rounds for t in x if t["action"] == "search"]
  search_results = [t for x in rounds for t in x if t["action"] != "answer" and t.get("result_text")]
  summary: dict[str, Any] = {
    "questions": n,
    "accuracy": _rate(sum(bool(r["correct"]) for r in records), n),
    "answered_rate": _rate(sum(r.get("response") is not None for r in records), n),
    "mean_rounds": _rate(num_rounds, n),
    "mean_searches": _rate(len(searches), n),
    "empty_search_rate": _rate(sum(not t.get("retrieved_clips") for t in search_results), len(search_results)),
    "format_error_rate": _rate(sum(t["action"] == "format_error" for x in rounds for t in x), num_rounds),
    "judge_invalid_rate": _rate(sum(not r.get("judge_valid", True) for r in records), n),
    "mean_generated_tokens": _rate(sum(t.get("num_generated", 0) for x in rounds for t in x), n),
    "by_type": _accuracy_by(records, lambda r: r.get("question_types") or ["(none)"]),
    "by_video": _accuracy_by(records, lambda r: [r.get("video_id", r.get("graph_key", ""))]),
    "by_rounds": _accuracy_by(records, lambda r: [str(len(r["rounds"]))]),
  }
  with_distance = [r for r in records if r.get("evidence_distance") is not None]
  if with_distance:
    curve = _accuracy_by(with_distance, lambda r: [distance_bucket(int(r["evidence_distance"]))])
    summary["forgetting_curve"] = dict(sorted(curve.items(), key=lambda kv: int(kv[0].split("-")[0])))
  return summary


def format_summary(summary: dict[str, Any]) -> str:
  lines = [f"questions {summary['questions']}  accuracy {summary['accuracy']:.4f}  "
           f"answered {summary['answered_rate']:.3f}  rounds {summary['mean_rounds']:.2f}  "
           f"searches {summary['mean_searches']:.2f}  empty-search {summary['empty_search_rate']:.3f}  "
           f"format-error {summary['format_error_rate']:.3f}  judge-invalid {summary['judge_invalid_rate']:.3f}"]
  for title in ("by_type", "forgetting_curve"):
    for key, row in summary.get(title, {}).items():
      lines.append(f"  {title[3:] if title.startswith('by_') else 'distance'} {key:<32} "
                   f"{row['accuracy']:.4f}  (n={row['count']})")
  return "\n".join(lines)


def plot_summary(summary: dict[str, Any], path: str | pathlib.Path) -> pathlib.Path:
  """A PNG with accuracy per type, per rounds used, and the forgetting curve (when present)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = [("by_type", "accuracy per question type"), ("by_rounds", "accuracy per rounds used")]
  if summary.get("forgetting_curve"):
    panels.append(("forgetting_curve", "accuracy vs clips between evidence and question"))
  fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
  for ax, (key, title) in zip(axes[0], panels):
    items = list(summary.get(key, {}).items())
    labels = [k for k, _ in items]
    values = [v["accuracy"] for _, v in items]
    counts = [v["count"] for _, v in items]
    if key == "forgetting_curve":
      ax.plot(range(len(values)), values, marker="o")
      ax.set_xticks(range(len(values)), labels)
      ax.set_xlabel("clip distance")
      ax.set_ylim(0, 1.05)
      for i, (value, n) in enumerate(zip(values, counts)):
        ax.annotate(f"n={n}", (i, value), fontsize=7)
    else:
      ax.barh(range(len(values)), values)
      ax.set_yticks(range(len(values)), [label[:28] for label in labels])
      ax.set_xlim(0, 1.05)
      for i, (value, n) in enumerate(zip(values, counts)):
        ax.annotate(f"{value:.2f} (n={n})", (value, i), fontsize=7, va="center")
    ax.set_title(title, fontsize=10)
  fig.suptitle(f"accuracy {summary['accuracy']:.3f} on {summary['questions']} questions", fontsize=11)
  fig.tight_layout()
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return path
