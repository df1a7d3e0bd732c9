"""Memorization benchmark on a generated episode: real-time factor, identity purity / completeness, QA accuracy.

  python bench/memorize.py                         # 20 clips = a 10-minute episode, 3 people
  python bench/memorize.py --clips 4 --fps 0.25    # what fits a busy 2-core machine

The episode (video + script + questions) is generated first and not timed; models load once before timing.
The real-time factor is media seconds / memorization wall seconds (decode, perception, writing, insertion,
checkpoints). Identity scores compare every face and speech observation's predicted person (character after
equivalences) with the script's. QA uses the deterministic rule-based answerer through the search tools
(`--llm` adds the SmolLM2-135M controller), judged by containment of the ground truth. There is no competitor
run: the reference pipeline needs insightface, ERes2NetV2, Gemini and a 7B omni model, none of which are here.
"""

from __future__ import annotations

import argparse
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from m3jax.agent.demo import (episode_questions, identity_scores, load_observations, make_answerer,  # noqa: E402
                              qa_accuracy)
from m3jax.agent.memorize import MemorizeConfig, Memorizer, load_memory  # noqa: E402
from m3jax.agent.perceive import PerceptionConfig, PerceptionModels  # noqa: E402
from m3jax.data.episode_render import render_episode  # noqa: E402
from m3jax.data.episodes import QUESTION_TYPES, EpisodeConfig, make_episode  # noqa: E402


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--clips", type=int, default=20)
  ap.add_argument("--characters", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--fps", type=float, default=0.5, help="face detection frames per second")
  ap.add_argument("--split-speakers", action="store_true", help="look for speaker changes inside VAD spans")
  ap.add_argument("--llm", action="store_true", help="also answer with the SmolLM2-135M controller")
  ap.add_argument("--out", default=None, help="keep the episode and memory here (default: a temp dir)")
  args = ap.parse_args()

  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="m3jax_bench_"))
  ep = make_episode(EpisodeConfig(seed=args.seed, num_clips=args.clips, num_characters=args.characters))
  t = time.perf_counter()
  paths = render_episode(ep, out)
  print(f"episode: {args.clips} clips, {args.characters} people, {len(ep.qa_list)} questions; rendered in "
        f"{time.perf_counter() - t:.1f} s -> {paths['video']}")
  t = time.perf_counter()
  models = PerceptionModels.load()
  print(f"models loaded in {time.perf_counter() - t:.1f} s")
  config = MemorizeConfig(perception=PerceptionConfig(face_fps=args.fps, split_speakers=args.split_speakers))
  mem = out / "memory"
  shutil.rmtree(mem, ignore_errors=True)
  report = Memorizer(mem, config, models=models).memorize(paths["video"], progress=True)
  print(f"memorized {report.media_seconds:.0f} s of media in {report.wall_seconds:.1f} s: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings.items()))
  graph = load_memory(mem)
  ident = identity_scores(ep, load_observations(mem), graph)
  print(f"characters found: {len(graph.characters().mappings)} (true {args.characters}): "
        f"{graph.characters().mappings}")
  questions = episode_questions(ep)
  results = {}
  for kind in ("rules", "untrained") if args.llm else ("rules",):
    t = time.perf_counter()
    answers = make_answerer(kind, [graph], models.text).answer(questions)
    acc = qa_accuracy(questions, answers)
    results[kind] = acc
    print(f"QA ({kind}, {time.perf_counter() - t:.1f} s): "
          + ", ".join(f"{k} {acc[k]:.2f}" for k in QUESTION_TYPES + ("all",) if k in acc))
  short = dict(zip(QUESTION_TYPES, ("pu", "cmr", "mdr", "mhr", "gke")))
  per_type = " ".join(f"qa_{short[k]}={results['rules'][k]:.3f}" for k in QUESTION_TYPES if k in results["rules"])
  llm = f" qa_acc_llm={results['untrained']['all']:.3f}" if "untrained" in results else ""
  print(f"RESULT realtime_factor={report.realtime_factor:.3f} identity_purity={ident['purity']:.3f} "
        f"identity_completeness={ident['completeness']:.3f} face_recall={ident['face_recall']:.3f} "
        f"qa_acc={results['rules']['all']:.3f} {per_type}{llm} clips={args.clips} fps={args.fps}")


if __name__ == "__main__":
  main()
