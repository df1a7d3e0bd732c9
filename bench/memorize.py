"""Memorization benchmark on a generated episode: real-time factor, identity purity / completeness, QA accuracy.

  python -m bench.memorize                         # 20 clips = a 10-minute episode, 3 people
  python -m bench.memorize --clips 4 --fps 0.25    # what fits a busy 2-core machine
  python -m bench.memorize --videos 4 --clips 2 --clip-seconds 12   # clips/s: one by one vs in lock-step

The episode (video + script + questions) is generated first and not timed; models load once before timing.
The real-time factor is media seconds / memorization wall seconds (decode, perception, writing, insertion,
checkpoints). Identity scores compare every face and speech observation's predicted person (character after
equivalences) with the script's. QA uses the deterministic rule-based answerer through the search tools
(`--llm` adds the SmolLM2-135M controller), judged by containment of the ground truth. There is no competitor
run: the reference pipeline needs insightface, ERes2NetV2, Gemini and a 7B omni model, none of which are here.

With `--videos N`, N episodes (seeds seed..seed+N-1) are memorized twice through `m3jax.memorize.lockstep`, one
video at a time and all N in lock-step with their model calls batched (`m3jax memorize --videos`), after an
untimed warm-up of one clip each way (compilation); it prints the CPU model and load and
RESULT clips_per_s_alone=... clips_per_s_lockstep=... speedup=... (speed claims need a quiet machine).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import tempfile
import time

from m3jax.control.answer import episode_questions
from m3jax.control import make_answerer
from m3jax.eval.demo import qa_accuracy
from m3jax.eval.scoring import identity_scores, load_observations
from m3jax.memorize.pipeline import MemorizeConfig, Memorizer, load_memory
from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
from m3jax.data.episode_render import render_episode
from m3jax.data.episodes import QUESTION_TYPES, EpisodeConfig, make_episode
from bench.harness import machine, result_line


def lockstep_clips_per_s(videos: list[pathlib.Path], root: pathlib.Path, config: MemorizeConfig, models,
                         in_flight: int, max_clips: int | None = None):
  """clips/s memorizing `videos` into root/<stem>, `in_flight` at a time, and the `LockstepStats`."""
  from m3jax.memorize.lockstep import LockstepStats, run_lockstep
  jobs = [lambda b, v=v: Memorizer(root / v.stem, config, models=b.models).memorize(v, max_clips=max_clips,
                                                                                   progress=False) for v in videos]
  stats = LockstepStats()
  t = time.perf_counter()
  reports = run_lockstep(jobs, models, in_flight, stats=stats)
  wall = time.perf_counter() - t
  for r in reports:
    if isinstance(r, BaseException):
      raise r
  return sum(len(r.clips_done) for r in reports) / wall, stats


def bench_videos(args, out: pathlib.Path) -> None:
  print(machine(), flush=True)
  videos = [render_episode(make_episode(EpisodeConfig(seed=args.seed + k, num_clips=args.clips,
                                                      num_characters=args.characters, clip_seconds=args.clip_seconds,
                                                      utterances_per_clip=(1, 2))), out / f"v{k}")["video"]
            for k in range(args.videos)]
  config = MemorizeConfig(clip_seconds=args.clip_seconds,
                          perception=PerceptionConfig(face_fps=args.fps, split_speakers=args.split_speakers))
  models = PerceptionModels.load()
  shutil.rmtree(out / "memory", ignore_errors=True)
  for n in (1, args.videos):
    lockstep_clips_per_s(videos, out / "memory" / f"warm{n}", config, models, n, max_clips=1)
  alone, one = lockstep_clips_per_s(videos, out / "memory" / "alone", config, models, 1)
  together, many = lockstep_clips_per_s(videos, out / "memory" / "lockstep", config, models, args.videos)
  print(f"model seconds one by one: {one.times()}\nmodel seconds in lock-step: {many.times()} (videos per call: "
        f"{many.summary()}); load {os.getloadavg()[0]:.1f}")
  print(result_line(clips_per_s_alone=f"{alone:.3f}", clips_per_s_lockstep=f"{together:.3f}",
                    speedup=f"{together / alone:.2f}", videos=args.videos, clips=args.clips,
                    clip_seconds=args.clip_seconds, fps=args.fps))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--clips", type=int, default=20)
  ap.add_argument("--characters", type=int, default=3)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--fps", type=float, default=0.5, help="face detection frames per second")
  ap.add_argument("--split-speakers", action="store_true", help="look for speaker changes inside VAD spans")
  ap.add_argument("--llm", action="store_true", help="also answer with the SmolLM2-135M controller")
  ap.add_argument("--out", default=None, help="keep the episode and memory here (default: a temp dir)")
  ap.add_argument("--videos", type=int, default=0, help="N > 1: clips/s of N episodes alone vs in lock-step")
  ap.add_argument("--clip-seconds", type=float, default=30.0)
  args = ap.parse_args()

  out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="m3jax_bench_"))
  if args.videos:
    return bench_videos(args, out)
  ep = make_episode(EpisodeConfig(seed=args.seed, num_clips=args.clips, num_characters=args.characters,
                                  clip_seconds=args.clip_seconds))
  t = time.perf_counter()
  paths = render_episode(ep, out)
  print(f"episode: {args.clips} clips, {args.characters} people, {len(ep.qa_list)} questions; rendered in "
        f"{time.perf_counter() - t:.1f} s -> {paths['video']}")
  t = time.perf_counter()
  models = PerceptionModels.load()
  print(f"models loaded in {time.perf_counter() - t:.1f} s")
  config = MemorizeConfig(clip_seconds=args.clip_seconds,
                          perception=PerceptionConfig(face_fps=args.fps, split_speakers=args.split_speakers))
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
  per_type = {f"qa_{short[k]}": f"{results['rules'][k]:.3f}" for k in QUESTION_TYPES if k in results["rules"]}
  llm = {"qa_acc_llm": f"{results['untrained']['all']:.3f}"} if "untrained" in results else {}
  print(result_line(realtime_factor=f"{report.realtime_factor:.3f}", identity_purity=f"{ident['purity']:.3f}",
                    identity_completeness=f"{ident['completeness']:.3f}", face_recall=f"{ident['face_recall']:.3f}",
                    qa_acc=f"{results['rules']['all']:.3f}", **per_type, **llm, clips=args.clips, fps=args.fps))


if __name__ == "__main__":
  main()
