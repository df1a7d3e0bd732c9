"""Paired bootstrap between answerers' per-question strict verdicts in controller_eval --records files.
  PYTHONPATH=. python runs/issue43/paired_dev.py A_LABEL=FILE[:ANSWERER] B_LABEL=FILE[:ANSWERER] ..."""
import json
import sys
from m3jax.eval.stats import paired_bootstrap

def load(spec):
  label, rest = spec.split("=", 1)
  path, _, who = rest.partition(":")
  who = who or "trained"
  rows = {}
  for l in open(path):
    r = json.loads(l)
    if r["answerer"] == who and r["task"] == "gold":
      rows[r["question_id"]] = bool(r["strict"])
  return label, rows

specs = [load(s) for s in sys.argv[1:]]
(la, a), rest = specs[0], specs[1:]
print(f"{len(a)} sized dev questions (gold graphs), strict judge, paired bootstrap 95% (m3jax.eval.stats.paired_bootstrap)")
for lb, b in rest:
  q = sorted(a)
  assert sorted(b) == q, (lb, len(b), len(q))
  print(f"{la} - {lb}: {paired_bootstrap([a[k] for k in q], [b[k] for k in q])}")
