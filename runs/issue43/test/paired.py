"""Paired bootstrap (95%) between answerers' per-question verdicts in controller_eval --records files, strict judge
first and contains beside it, over the questions every file answered.
  PYTHONPATH=. python runs/issue43/test/paired.py TASK A_LABEL=FILE[:ANSWERER] B_LABEL=FILE[:ANSWERER] ..."""
import json
import sys

from m3jax.eval.stats import paired_bootstrap


def load(spec, task):
  label, rest = spec.split("=", 1)
  path, _, who = rest.partition(":")
  rows = {}
  for line in open(path):
    r = json.loads(line)
    if r["answerer"] == (who or "trained") and r["task"] == task:
      rows[r["question_id"]] = (bool(r["strict"]), bool(r["contains"]))
  return label, rows


task, specs = sys.argv[1], [load(s, sys.argv[1]) for s in sys.argv[2:]]
(la, a), rest = specs[0], specs[1:]
print(f"{len(a)} {task} questions; paired bootstrap 95% (m3jax.eval.stats.paired_bootstrap)")
for lb, b in rest:
  q = sorted(a)
  assert sorted(b) == q, (lb, len(b), len(q))
  for j, judge in enumerate(("strict", "contains")):
    d, lo, hi = paired_bootstrap([a[k][j] for k in q], [b[k][j] for k in q])
    print(f"{la} - {lb} ({judge}): {d:+.3f} [{lo:+.3f}, {hi:+.3f}]")
