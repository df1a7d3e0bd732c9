"""Controller evaluation on held-out memory-QA questions (issue 19, part 4): trained vs rules vs untrained.

  python bench/controller_eval.py                        # 96 held-out questions + the demo's perception-built
                                                         # memory; the shipped controller, rules and untrained
  python bench/controller_eval.py --n 16 --answerers rules,untrained --tasks heldout
  python bench/controller_eval.py --adapter runs/rl_controller/adapter.npz   # another trained adapter

Questions come from held-out episodes only (seeds >= HELDOUT_SEED_START: unseen graphs, the held-out phrasings
and the held-out family, see m3jax.data.questions), over gold-memory graphs built the way `train.py rl` builds
its task (`memory_qa.make_task`), embedded with MiniLM as the product's memories are. The second table is the
demo episode memorized end to end (rendered video -> faces, voices, Whisper -> template writer -> graph), asked
its own questions. Every answerer is judged by the same two judges: `contains` (the RL reward's rule) and `llm`
(the reference's entailment prompt on the frozen SmolLM2-135M). A decline is an answer the `contains` judge
accepts against NOT_IN_MEMORY; it is correct on an unanswerable question and a false decline on an answerable
one. Per answerer: accuracy overall and per type, declines, rounds / searches / format errors and seconds per
question. The rules answerer has no rounds: it counts the searches it runs.
Final line: RESULT trained=… rules=… untrained=… n=… trained_llm_judge=… rules_llm_judge=…
llm_judge_false_accept=… demo_trained=… demo_rules=… (NA where an answerer did not run). The llm judge's
false-acceptance rate (mismatched answer/truth pairs it accepts, see `score`) says how far its column can be
trusted: the embedded 135M judge accepted every answer of both answerers.
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
from m3jax.agent.judges import JudgeItem, RuleJudge, make_judge, score_answers  # noqa: E402
from m3jax.data.episodes import QUESTION_TYPES, make_episode  # noqa: E402
from m3jax.data.memory_qa import heldout_questions, make_task  # noqa: E402
from m3jax.data.questions import HELDOUT_SEED_START  # noqa: E402
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


def run_answerer(kind: str, graphs, records, embed, base: str, adapter: str | None, slots: int = 24):
  from m3jax.agent.demo import make_answerer

  questions = [Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip,
                        question_types=r.types) for r in records]
  t0 = time.perf_counter()
  answerer = make_answerer(kind, graphs, embed, base, adapter)
  if kind != "rules":  # continuous batching: a batch's KV cache grows with rows x context (96 prompted 5-round
    answerer.slots = slots  # rows in one static batch took 14 GB), so the questions share `slots` rows
  if kind == "rules":
    answerer.searcher, answerer.names_searcher = (CountingSearcher(answerer.searcher),
                                                  CountingSearcher(answerer.names_searcher))
    answers = answerer.answer(questions)
    stats = {"rounds": 1.0, "searches": (answerer.searcher.requests + answerer.names_searcher.requests) / len(records),
             "format_errors": 0.0}
  else:
    answers = answerer.answer(questions)
    trajs = answerer.trajectories
    stats = {"rounds": sum(len(t.rounds) for t in trajs) / len(trajs),
             "searches": sum(t.num_searches for t in trajs) / len(trajs),
             "format_errors": sum(r.action == "format_error" for t in trajs for r in t.rounds) / len(trajs)}
  stats["seconds"] = (time.perf_counter() - t0) / len(records)
  return answers, stats


def score(records, answers, llm_judge) -> dict:
  """Both judges. The llm judge is also asked about mismatched pairs (each answer against the next question's
  truth, where the `contains` judge rejects it): the share it accepts there is its false-acceptance rate, so a
  judge that says "yes" to everything shows as such instead of as a high accuracy."""
  out = score_answers(JUDGE, records, answers)
  if llm_judge is not None:
    verdicts = llm_judge.judge([JudgeItem(r.question, r.answer, a) for r, a in zip(records, answers)])
    out["llm_judge"] = sum(v.correct for v in verdicts) / len(records)
    shifted = [JudgeItem(r.question, r.answer, answers[(i + 1) % len(records)]) for i, r in enumerate(records)]
    wrong = [item for item, v in zip(shifted, JUDGE.judge(shifted)) if not v.correct]
    if wrong:
      out["llm_judge_false_accept"] = sum(v.correct for v in llm_judge.judge(wrong)) / len(wrong)
  return out


def report(kind: str, s: dict, records, answers) -> None:
  llm = f", llm judge {s['llm_judge']:.3f}" if "llm_judge" in s else ""
  if "llm_judge_false_accept" in s:
    llm += f" (it accepts {s['llm_judge_false_accept']:.3f} of mismatched answers)"
  print(f"[{kind}] accuracy {s['accuracy']:.3f}{llm}; correct declines {s['correct_declines'][0]}/"
        f"{s['correct_declines'][1]}, false declines {s['false_declines'][0]}/{s['false_declines'][1]}; per question: "
        f"{s['rounds']:.2f} rounds, {s['searches']:.2f} searches, {s['format_errors']:.2f} format errors, "
        f"{s['seconds']:.2f} s", flush=True)
  for t in QUESTION_TYPES:
    if t in s["per_type"]:
      h, n = s["per_type"][t]
      print(f"  {t:32s} {h / n:.3f}  ({h}/{n})")
  for r, a in list(zip(records, answers))[:3]:
    print(f"  e.g. {r.question} | truth: {r.answer} | answer: {a[:100]!r}")


def demo_task(out_dir: pathlib.Path):
  """The demo episode memorized end to end (resuming in `out_dir`): (graphs, records, embedder)."""
  from m3jax.agent.demo import DemoConfig, episode_questions
  from m3jax.agent.memorize import Memorizer, load_memory
  from m3jax.agent.perceive import PerceptionModels
  from m3jax.data.episode_render import render_episode
  from m3jax.data.memory_qa import QARecord

  cfg = DemoConfig()
  ep = make_episode(cfg.episode)
  video = out_dir / f"{ep.id}.mp4"
  if not video.exists():
    render_episode(ep, out_dir)
  models = PerceptionModels.load(cfg.memorize.perception.face_upsample)
  Memorizer(out_dir / f"{ep.id}_memory", cfg.memorize, models=models).memorize(video, progress=False)
  graph = load_memory(out_dir / f"{ep.id}_memory")
  unanswerable = {q["question_id"]: q["unanswerable"] for q in ep.qa_list}
  records = [QARecord(question_id=q.question_id, question=q.question, answer=q.answer, memory_id=0,
                      before_clip=q.before_clip, types=q.question_types, family="demo",
                      unanswerable=unanswerable[q.question_id]) for q in episode_questions(ep)]
  return [graph], records, models.text


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
  ap.add_argument("--answerers", default="trained,rules,untrained", help="comma list of trained, rules, untrained")
  ap.add_argument("--adapter", default=None, help="the trained controller's LoRA adapter file (default: the shipped "
                                                  "one; adds `trained`)")
  ap.add_argument("--base", default="smollm2-135m-instruct", help="the base model (trained and untrained)")
  ap.add_argument("--embedder", default="minilm", help="as train.py rl: minilm, hashed or *.embedder.json")
  ap.add_argument("--no-llm-judge", action="store_true", help="skip the llm judge column")
  ap.add_argument("--tasks", default="heldout,demo", help="comma list of heldout (gold-memory graphs), demo")
  ap.add_argument("--slots", type=int, default=24, help="controller KV-cache rows (continuous batching)")
  ap.add_argument("--demo-dir", default="runs/controller_eval_demo", help="where the demo episode is memorized")
  args = ap.parse_args()
  kinds = [k for k in args.answerers.split(",") if k]
  if args.adapter and "trained" not in kinds:
    kinds.insert(0, "trained")
  tasks = [t for t in args.tasks.split(",") if t]
  bad = [k for k in kinds if k not in ("rules", "untrained", "trained")] + [t for t in tasks
                                                                            if t not in ("heldout", "demo")]
  if bad or not tasks or args.n < 1 or args.slots < 1 or (args.adapter and not pathlib.Path(args.adapter).is_file()):
    sys.exit(f"controller_eval: answerers must be rules/untrained/trained, an --adapter must be a file, "
             f"tasks heldout/demo, n and slots >= 1; got {args.answerers!r}, {args.tasks!r}, adapter={args.adapter!r}, "
             f"n={args.n}, slots={args.slots}")

  print(machine(), flush=True)
  embed = make_embedder(args.embedder)
  dim = int(np.asarray(embed(["x"])).shape[-1])
  llm_judge = None if args.no_llm_judge else make_judge("llm", args.base)
  tasks = {t: heldout_task(args.n, embed, dim) + (embed,) if t == "heldout" else demo_task(pathlib.Path(args.demo_dir))
           for t in tasks}
  results = {}
  for task, (graphs, records, task_embed) in tasks.items():
    fams = Counter(r.family for r in records)
    print(f"== {task}: {len(records)} questions from {len(graphs)} memories ({sum(r.unanswerable for r in records)} "
          f"unanswerable); families: {dict(sorted(fams.items()))}", flush=True)
    for kind in kinds:
      answers, stats = run_answerer(kind, graphs, records, task_embed, args.base, args.adapter, args.slots)
      # the llm judge for the two answerers the RESULT line compares (the untrained base rarely answers at all)
      s = results[task, kind] = {**score(records, answers, llm_judge if kind != "untrained" else None), **stats}
      report(kind, s, records, answers)
  n = len(tasks["heldout"][1]) if "heldout" in tasks else 0

  def fmt(task, kind, key="accuracy"):
    return f"{results[task, kind][key]:.3f}" if (task, kind) in results and key in results[task, kind] else "NA"
  print(f"RESULT trained={fmt('heldout', 'trained')} rules={fmt('heldout', 'rules')} "
        f"untrained={fmt('heldout', 'untrained')} n={n} trained_llm_judge={fmt('heldout', 'trained', 'llm_judge')} "
        f"rules_llm_judge={fmt('heldout', 'rules', 'llm_judge')} "
        f"llm_judge_false_accept={fmt('heldout', 'rules', 'llm_judge_false_accept')} demo_trained={fmt('demo', 'trained')} "
        f"demo_rules={fmt('demo', 'rules')} demo_untrained={fmt('demo', 'untrained')}")


if __name__ == "__main__":
  main()
