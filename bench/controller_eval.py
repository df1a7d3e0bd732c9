"""Controller evaluation on held-out memory-QA questions (issue 19, part 4): rules vs untrained vs trained.

  python bench/controller_eval.py                        # 96 held-out questions, rules + untrained SmolLM2
  python bench/controller_eval.py --n 16 --answerers rules,untrained
  python bench/controller_eval.py --model runs/rl/hf     # adds the trained controller (an HF dir / GGUF)

Questions come from held-out episodes only (seeds >= HELDOUT_SEED_START: unseen graphs, the held-out phrasings
and the held-out family, see m3jax.data.questions), over gold-memory graphs built the way `train.py rl` builds
its task (`memory_qa.make_task`). Every answerer is judged by the same `contains` judge, the RL reward's. A decline
is an answer the same judge accepts against NOT_IN_MEMORY; it is correct on an unanswerable question and a false
decline on an answerable one. Per answerer: accuracy overall and per type, declines, rounds / searches / format
errors and seconds per question. The rules answerer has no rounds: it counts the searches it runs.
Final line: RESULT trained=… rules=… untrained=… n=… (NA where an answerer did not run).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import sys
import time
from collections import Counter

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from m3jax.agent.control import Question  # noqa: E402
from m3jax.agent.judges import RuleJudge, score_answers  # noqa: E402
from m3jax.data.episodes import QUESTION_TYPES  # noqa: E402
from m3jax.data.memory_qa import heldout_questions, make_task  # noqa: E402
from m3jax.data.questions import HELDOUT_SEED_START, NOT_IN_MEMORY  # noqa: E402
from m3jax.eval import make_embedder  # noqa: E402

JUDGE = RuleJudge("contains")


def heldout_task(n: int, embed, dim: int, first_seed: int = HELDOUT_SEED_START):
  """`n` family-balanced held-out questions (`memory_qa.heldout_questions`) and the graphs of every episode drawn."""
  seeds, records = heldout_questions(n, first_seed)
  graphs, _ = make_task(seeds, embed, dim, split="heldout")
  return graphs, records


class CountingSearcher:
  """Wraps a searcher to count the requests an answerer sends (the rules answerer's searches)."""

  def __init__(self, inner):
    self.inner, self.requests = inner, 0

  def search(self, requests):
    self.requests += len(requests)
    return self.inner.search(requests)


def run_answerer(kind: str, graphs, records, embed, model: str):
  from m3jax.agent.answer import LLMAnswerer, RuleAnswerer

  questions = [Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip,
                        question_types=r.types) for r in records]
  t0 = time.perf_counter()
  if kind == "rules":
    answerer = RuleAnswerer(graphs, embed)
    answerer.searcher, answerer.names_searcher = (CountingSearcher(answerer.searcher),
                                                  CountingSearcher(answerer.names_searcher))
    answers = answerer.answer(questions)
    stats = {"rounds": 1.0, "searches": (answerer.searcher.requests + answerer.names_searcher.requests) / len(records),
             "format_errors": 0.0}
  else:
    answerer = LLMAnswerer(graphs, embed, model, constrain_actions=kind == "untrained")
    answers = answerer.answer(questions)
    trajs = answerer.trajectories
    stats = {"rounds": sum(len(t.rounds) for t in trajs) / len(trajs),
             "searches": sum(t.num_searches for t in trajs) / len(trajs),
             "format_errors": sum(r.action == "format_error" for t in trajs for r in t.rounds) / len(trajs)}
  stats["seconds"] = (time.perf_counter() - t0) / len(records)
  return answers, stats


def machine() -> str:
  try:
    out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    cpu = next((line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")), "?")
  except (OSError, subprocess.CalledProcessError):
    cpu = "?"
  load = " ".join(f"{x:.2f}" for x in os.getloadavg())
  return f"cpu: {cpu}, {os.cpu_count()} cores; load average {load}"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=96, help="held-out questions (the issue asks for >= 96)")
  ap.add_argument("--answerers", default="rules,untrained", help="comma list of rules, untrained, trained")
  ap.add_argument("--model", default=None, help="the trained controller (load_llm name, HF dir or GGUF); "
                                                "implies the trained answerer")
  ap.add_argument("--adapter", default=None, help="a LoRA adapter on top of --model")
  ap.add_argument("--base", default="smollm2-135m-instruct", help="the untrained base model")
  ap.add_argument("--embedder", default="hashed", help="as train.py rl: hashed, minilm or *.embedder.json")
  args = ap.parse_args()
  kinds = [k for k in args.answerers.split(",") if k]
  if args.model and "trained" not in kinds:
    kinds.append("trained")
  bad = [k for k in kinds if k not in ("rules", "untrained", "trained")]
  if bad or ("trained" in kinds and not args.model) or args.n < 1:
    sys.exit(f"controller_eval: answerers must be rules/untrained/trained (trained needs --model), n >= 1; got "
             f"{args.answerers!r}, model={args.model!r}, n={args.n}")
  if args.adapter:
    sys.exit("controller_eval: LoRA adapters are not loadable in m3jax yet; merge the adapter and pass --model")

  print(machine(), flush=True)
  embed = make_embedder(args.embedder)
  dim = int(np.asarray(embed(["x"])).shape[-1])
  graphs, records = heldout_task(args.n, embed, dim)
  fams = Counter(r.family for r in records)
  print(f"{len(records)} held-out questions (balanced over families) from {len(graphs)} episodes ({sum(r.unanswerable for r in records)} "
        f"unanswerable); families: {dict(sorted(fams.items()))}", flush=True)
  results = {}
  for kind in kinds:
    model = args.base if kind == "untrained" else args.model
    answers, stats = run_answerer(kind, graphs, records, embed, model)
    s = results[kind] = {**score_answers(JUDGE, records, answers), **stats}
    print(f"[{kind}] accuracy {s['accuracy']:.3f}; correct declines {s['correct_declines'][0]}/"
          f"{s['correct_declines'][1]}, false declines {s['false_declines'][0]}/{s['false_declines'][1]}; per question: "
          f"{s['rounds']:.2f} rounds, {s['searches']:.2f} searches, {s['format_errors']:.2f} format errors, "
          f"{s['seconds']:.2f} s", flush=True)
    for t in QUESTION_TYPES:
      if t in s["per_type"]:
        h, n = s["per_type"][t]
        print(f"  {t:32s} {h / n:.3f}  ({h}/{n})")
    for r, a in list(zip(records, answers))[:3]:
      print(f"  e.g. {r.question} | truth: {r.answer} | answer: {a[:100]!r}")
  acc = {k: f"{results[k]['accuracy']:.3f}" if k in results else "NA" for k in ("trained", "rules", "untrained")}
  print(f"RESULT trained={acc['trained']} rules={acc['rules']} untrained={acc['untrained']} n={len(records)}")


if __name__ == "__main__":
  main()
