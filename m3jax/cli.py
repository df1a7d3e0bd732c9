"""The `m3jax` command: memorize a video, ask about it, or run the whole demo on the embedded default models.

  m3jax memorize VIDEO --memory DIR [--append] [--writer template|llm|omni [--omni-model DIR]] [--max-clips N]
                [--writer-adapter FILE (a trained llm writer)]
                [--config F --set k=v]
  m3jax memorize --videos LIST|GLOB --memory ROOT [...]   # ROOT/<video stem>; a pod shares the videos out
  m3jax ask --memory DIR "question" [--answerer trained|rules|untrained --adapter F] [--show-trajectory]
            [--before-clip N]
  m3jax eval ANNOTATIONS.json [--answerer rules|llm|trained] [--limit N] [--output F] [--config F --set k=v]
  m3jax demo [--config configs/demo.py] [--set "answerers=('trained','untrained','rules')" ...]
  m3jax chat ["prompt" ...] [--llm DIR|FILE.gguf] [--temperature T]

One function per subcommand (`add_<name>` builds its parser, `run_<name>` runs it); `SUBCOMMANDS` lists them.
Everything runs offline on models shipped in installed packages; nothing is downloaded. Bad input is one
`m3jax: error: ...` line on stderr (exit 2), never a traceback (`m3jax.errors`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
from typing import Callable, Sequence

from m3jax import compile_cache
from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.errors import Interrupted, UserError, one_line, run_cli
from m3jax.host_memory import retain_freed_memory


# ------------------------------------------------------------------------------------------------ memorize
def add_memorize(sub) -> None:
  p = sub.add_parser("memorize", help="build (or extend) the memory graph of a video, clip by clip")
  p.add_argument("video", nargs="?", help="the video (or use --videos)")
  p.add_argument("--videos", default=None,
                 help="many videos: a text file listing paths (one a line, relative to the file) or a glob "
                      "pattern; each goes to ROOT/<video stem> (--memory ROOT), shared out over a pod's processes "
                      "(--set distributed.* or M3JAX_*)")
  p.add_argument("--memory", required=True, help="memory directory (created; re-running resumes); with --videos "
                                                 "the root of one directory per video")
  p.add_argument("--append", action="store_true", help="add this video after the one already in DIR")
  p.add_argument("--writer", choices=("template", "llm", "omni"), default=None,
                 help="memory writer (default: the config's `writer`, template)")
  p.add_argument("--llm", default=None, help="LLM for --writer llm (default: the config's `writer_llm`)")
  p.add_argument("--omni-model", default=None,
                 help="local HF Qwen2.5-Omni / M3-Agent-Memorization directory for --writer omni")
  p.add_argument("--writer-adapter", default=None,
                 help="trained writer adapter file for --writer llm (train.py sft --config configs/sft_writer.py)")
  p.add_argument("--max-clips", type=int, default=None, help="memorize at most N (>= 1) more clips")
  p.add_argument("--no-progress", action="store_true")
  add_config_args(p)
  p.set_defaults(run=run_memorize)


def _memorize_config(args):
  from m3jax.memorize.pipeline import MemorizeConfig
  config = load_config(args.config) if args.config else MemorizeConfig()
  if hasattr(config, "memorize"):  # a demo config file: use its memorization part
    config = config.memorize
  flags = {"writer": args.writer, "writer_llm": args.llm, "omni_model": args.omni_model,
           "writer_adapter": args.writer_adapter}
  return dataclasses.replace(apply_overrides(config, args.overrides),
                             **{k: v for k, v in flags.items() if v is not None})


def list_videos(spec: str) -> list[pathlib.Path]:
  """The videos of `--videos`: a glob pattern (sorted matches) or a text file of paths (in its order; blank
  lines and `#` comments skipped; relative paths are relative to the file). Each video's memory directory is
  named by its stem, so two videos with one stem are refused."""
  import glob

  if any(c in spec for c in "*?["):
    videos = [pathlib.Path(p) for p in sorted(glob.glob(spec, recursive=True)) if pathlib.Path(p).is_file()]
  elif pathlib.Path(spec).is_file():
    base = pathlib.Path(spec).parent
    lines = (line.strip() for line in pathlib.Path(spec).read_text(encoding="utf-8").splitlines())
    videos = [base / line for line in lines if line and not line.startswith("#")]
  else:
    raise UserError(f"--videos {spec}: neither a glob pattern nor a file listing videos")
  if not videos:
    raise UserError(f"--videos {spec}: no videos")
  stems: dict[str, pathlib.Path] = {}
  for v in videos:
    if v.stem in stems:
      raise UserError(f"--videos: {stems[v.stem]} and {v} would share the memory directory {v.stem}")
    stems[v.stem] = v
  return videos


def _print_report(report) -> None:
  print(f"memorized clips {report.clips_done[:1] + report.clips_done[-1:] if report.clips_done else 'none new'} "
        f"({report.clips_skipped} already in memory) into {report.memory_dir}; next clip {report.next_clip}")
  print(f"{report.media_seconds:.0f} s of media in {report.wall_seconds:.1f} s "
        f"(real-time factor {report.realtime_factor:.2f}); per stage: "
        + ", ".join(f"{k} {v:.1f}s" for k, v in report.timings.items()))


def _done_so_far(memory) -> str:
  from m3jax.memorize.pipeline import read_manifest

  manifest = read_manifest(memory)
  return f"clips up to {manifest['next_clip'] - 1}" if manifest and manifest["next_clip"] else "no clip yet"


def _memorize_one(memorizer, video, memory, args) -> None:
  try:
    report = memorizer.memorize(video, append=args.append, max_clips=args.max_clips, progress=not args.no_progress)
  except KeyboardInterrupt:
    raise Interrupted(f"{_done_so_far(memory)} memorized into {memory}; re-run the same command to resume") from None
  _print_report(report)


def run_memorize(args) -> int:
  if args.max_clips is not None and args.max_clips < 1:
    raise UserError(f"--max-clips must be >= 1, got {args.max_clips}")
  if (args.video is None) == (args.videos is None):
    raise UserError("give one video, or --videos LIST|GLOB")
  from m3jax.memorize.pipeline import Memorizer

  config = _memorize_config(args)
  if args.video is not None:
    _memorize_one(Memorizer(args.memory, config), args.video, args.memory, args)  # builds the config's writer
    return 0
  return _memorize_many(list_videos(args.videos), pathlib.Path(args.memory), config, args)


def _memorize_many(videos: list[pathlib.Path], root: pathlib.Path, config, args) -> int:
  """This process's contiguous share of `videos`, each into root/<stem>, up to `config.videos_in_flight` at a
  time in lock-step with their model calls batched (`m3jax.memorize.lockstep`; the perception models and an llm
  writer's LLM load once, each video gets its own writer: its state belongs to that memory). A video that fails
  (bad media, a refused directory) gets its one-line error and the others go on; the exit status is then 2.
  Process 0 then reports what every process memorized (a collective: a failed process fails the others' exit)."""
  import jax

  from m3jax import distributed
  from m3jax.memorize.lockstep import LockstepStats, run_lockstep
  from m3jax.memorize.pipeline import Memorizer, config_writer
  from m3jax.memorize.perceive import PerceptionModels
  from m3jax.memorize.writers import LLMWriter

  distributed.initialize(config.distributed)  # before any JAX computation
  mine = distributed.shard(videos)
  print(f"process {jax.process_index()} of {jax.process_count()}: {len(mine)} of {len(videos)} videos")
  models = PerceptionModels.load(config.perception.face_upsample, config.asr) if mine else None
  shared = config_writer(config) if mine and config.writer == "llm" else None  # one LLM for every video
  # the omni writer holds a 7B thinker per writer, and its calls are not batched: one video at a time
  in_flight = 1 if config.writer == "omni" else config.videos_in_flight

  def job(video):
    def memorize(batched):
      writer = (LLMWriter(batched.complete, shared.max_retries, instruction=shared.instruction) if shared
                else None)
      memorizer = Memorizer(root / video.stem, config, writer=writer, models=batched.models)
      report = memorizer.memorize(video, append=args.append, max_clips=args.max_clips,
                                  progress=not args.no_progress and in_flight == 1)
      _print_report(report)
      return report
    return memorize

  stats = LockstepStats()
  try:
    outcomes = run_lockstep([job(v) for v in mine], models, in_flight, shared.complete if shared else None, stats)
  except KeyboardInterrupt:
    raise Interrupted("; ".join(f"{v.stem}: {_done_so_far(root / v.stem)}" for v in mine if (root / v.stem).exists())
                      + "; re-run the same command to resume") from None
  failed = []
  for video, outcome in zip(mine, outcomes):
    if isinstance(outcome, (UserError, ValueError, OSError)):
      print(f"m3jax: error: {video}: {one_line(outcome)}", file=sys.stderr)
      failed.append(video.stem)
    elif isinstance(outcome, BaseException):
      raise outcome
  if len(mine) > 1 and stats.calls:
    print(f"videos per batched call: {stats.summary()}")
  done = distributed.gather_bytes(json.dumps({"done": [v.stem for v in mine if v.stem not in failed],
                                              "failed": failed}).encode())
  if jax.process_index() == 0:
    shares = [json.loads(share) for share in done]
    stems, bad = [s for sh in shares for s in sh["done"]], [s for sh in shares for s in sh["failed"]]
    print(f"memorized {len(stems)} videos into {root} on {len(done)} process(es)"
          + (f"; {len(bad)} failed: {', '.join(bad)}" if bad else ""))
  return 2 if failed else 0


# ----------------------------------------------------------------------------------------------------- ask
def add_ask(sub) -> None:
  p = sub.add_parser("ask", help="answer a question from a memory directory")
  p.add_argument("question")
  p.add_argument("--memory", required=True)
  p.add_argument("--answerer", choices=("rules", "untrained", "trained"), default="trained",
                 help="trained (default): the shipped controller (SmolLM2-135M + its LoRA adapter, or --adapter), the "
                      "paper's multi-turn protocol; rules: deterministic retrieval answers (a baseline); untrained: "
                      "the base prompted, turns constrained to the action format")
  p.add_argument("--llm", default="smollm2-135m-instruct", help="the controller's base model")
  p.add_argument("--adapter", default=None, help="with --answerer trained: a LoRA adapter file from train.py rl "
                                                 "(default: the shipped one)")
  p.add_argument("--before-clip", type=int, default=None, help="use only memories of clips <= N")
  p.add_argument("--show-trajectory", action="store_true")
  p.set_defaults(run=run_ask)


def run_ask(args) -> int:
  if not args.question.strip():
    raise UserError("the question is empty")
  if args.before_clip is not None and args.before_clip < 0:
    raise UserError(f"--before-clip must be a clip number >= 0, got {args.before_clip}")
  from m3jax.control import Question, make_answerer, trained_adapter_path
  from m3jax.memorize.pipeline import load_memory
  from m3jax.memory.embedders import make_embedder

  if args.answerer == "trained":
    trained_adapter_path(args.adapter)  # refused before anything loads
  graph = load_memory(args.memory)
  answerer = make_answerer(args.answerer, [graph], make_embedder("minilm"), args.llm,
                           args.adapter)  # only the text embedder: no perception model loads
  answer = answerer.answer([Question("q", args.question, "", 0, before_clip=args.before_clip)])[0]
  if args.show_trajectory and getattr(answerer, "trajectories", None):
    for i, r in enumerate(answerer.trajectories[0].rounds):
      print(f"round {i + 1}: [{r.action}] {r.content}" + (f"  -> clips {r.retrieved_clips}" if r.action == "search"
                                                          else ""))
  print(answer if answer else "(no answer)")
  return 0


# ---------------------------------------------------------------------------------------------------- eval
def add_eval(sub) -> None:
  p = sub.add_parser("eval", help="answer and judge every question of an M3-Bench-format annotation file from "
                                  "the memory directory each video's mem_path names (as memorize / demo write)")
  p.add_argument("annotations", help="{video_id: {mem_path, qa_list}} JSON (the demo writes one per episode)")
  p.add_argument("--answerer", choices=("trained", "llm", "rules"), default=None,
                 help="rules (default without --config): deterministic retrieval answers; llm: the control loop on "
                      "--llm as prompted; trained: with a controller adapter (--set adapter=FILE)")
  p.add_argument("--llm", default=None, help="the controller's base model (default smollm2-135m-instruct)")
  p.add_argument("--judge", default=None, help="llm|http|exact|contains|strict|f1|choice (default without --config: "
                                               "contains)")
  p.add_argument("--limit", type=int, default=None, help="evaluate only the first N (>= 1) questions")
  p.add_argument("--output", default=None, help="results JSONL (default: ANNOTATIONS_STEM.ANSWERER.jsonl beside "
                                                "the annotations); re-running resumes it")
  p.add_argument("--no-progress", action="store_true")
  add_config_args(p)
  p.set_defaults(run=run_eval)


def run_eval(args) -> int:
  from m3jax.eval.evaluate import EvalConfig, evaluate
  from m3jax.eval.report import format_summary

  if args.limit is not None and args.limit < 1:
    raise UserError(f"--limit must be >= 1, got {args.limit}")
  config = load_config(args.config) if args.config else EvalConfig(answerer="rules", judge="contains")
  config = apply_overrides(config, args.overrides)
  flags = {"answerer": args.answerer, "model": args.llm, "judge": args.judge, "limit": args.limit}
  config = dataclasses.replace(config, annotations=args.annotations,
                               **{k: v for k, v in flags.items() if v is not None})
  ann = pathlib.Path(args.annotations)
  output = args.output or str(ann.with_name(f"{ann.stem}.{config.answerer}.jsonl"))
  summary = evaluate(dataclasses.replace(config, output=output), progress=not args.no_progress)
  print(format_summary(summary))
  print(f"results: {output}")
  return 0


# ---------------------------------------------------------------------------------------------------- demo
def add_demo(sub) -> None:
  p = sub.add_parser("demo", help="generate a sample episode, memorize it, answer its questions")
  add_config_args(p)
  p.set_defaults(run=run_demo)


def run_demo(args) -> int:
  from m3jax.eval.demo import DemoConfig, format_demo, run_demo as demo

  config = load_config(args.config) if args.config else DemoConfig()
  result = demo(apply_overrides(config, args.overrides))
  print(format_demo(result))
  # accuracy: the strict judge (as bench/controller_eval.py); accuracy_contains: the older judge beside it
  print(json.dumps({"episode": result["episode"].id, "split": result["split"], "judge": "strict",
                    "accuracy": result["accuracy"], "accuracy_contains": result["contains"],
                    "trained_minus_rules": {j: list(v) for j, v in result["differences"].items()},
                    "identity": result["identity"]}))
  return 0


# ---------------------------------------------------------------------------------------------------- chat
def add_chat(sub) -> None:
  p = sub.add_parser("chat", help="chat with a local LLM through the m3jax sampler (the KV cache is kept "
                                  "across turns)")
  p.add_argument("prompt", nargs="*", help="one-shot prompts, answered as one batch; none = interactive chat")
  p.add_argument("--llm", default="smollm2-135m-instruct", help="HF directory, .gguf file or the default")
  p.add_argument("--max-new-tokens", type=int, default=256)
  p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
  p.add_argument("--top-p", type=float, default=1.0)
  p.add_argument("--seed", type=int, default=0)
  p.set_defaults(run=run_chat)


def chat_config(tokenizer, max_new_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
  """The chat's sampling settings: greedy at temperature 0, stops at the tokenizer's EOS and <|im_end|>."""
  from m3jax.engine.sampling import SamplingConfig

  stop = tuple(i for i in {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")} if isinstance(i, int))
  return SamplingConfig(max_new_tokens=max_new_tokens, greedy=temperature == 0, temperature=temperature or 1.0,
                        top_p=top_p, stop_token_ids=stop, seed=seed)


class Chat:
  """One conversation on one KV cache. A turn re-renders the whole conversation with the chat template; when that
  starts with the cached tokens (the reply tokenizes back to what was sampled), only the new tokens are prefilled.
  Otherwise (say, a reply whose stripped whitespace was a token) the whole conversation is prefilled again: slower,
  not wrong, so it is counted in `reprefills` and reported on stderr instead of happening silently. `last` is the
  last turn's SampleOutput (its tokens and log-probs)."""

  def __init__(self, sampler, tokenizer):
    self.sampler, self.tokenizer = sampler, tokenizer
    self.messages: list[dict[str, str]] = []
    self.last = None
    self.reprefills = 0

  def say(self, text: str) -> str:
    from m3jax.models.tokenizer import chat_ids

    self.messages.append({"role": "user", "content": text})
    ids = chat_ids(self.tokenizer, self.messages)
    history = self.last.state.history[0] if self.last is not None else None
    if history is not None and ids[:len(history)] == history:
      out = self.sampler.continue_(self.last.state, [ids[len(history):]])
    else:
      if history is not None:
        self.reprefills += 1
        print(f"m3jax chat: the conversation no longer tokenizes to the cached {len(history)} tokens; "
              f"prefilling all {len(ids)} again", file=sys.stderr)
      out = self.sampler.generate([ids])
    self.last = out
    reply = out.text[0].strip()
    self.messages.append({"role": "assistant", "content": reply})
    return reply


def run_chat(args) -> int:
  from m3jax.models.llm import load_llm
  from m3jax.engine.sampling import Sampler
  from m3jax.models.tokenizer import chat_ids

  model, tok = load_llm(args.llm)
  cfg = chat_config(tok, args.max_new_tokens, args.temperature, args.top_p, args.seed)
  sampler = Sampler(model, cfg, tokenizer=tok)
  if args.prompt:
    out = sampler.generate([chat_ids(tok, [{"role": "user", "content": p}]) for p in args.prompt])
    for prompt, text in zip(args.prompt, out.text):
      print(f">>> {prompt}\n{text.strip()}" if len(args.prompt) > 1 else text.strip())
    return 0
  chat = Chat(sampler, tok)
  while True:
    try:
      line = input(">>> ").strip()
    except EOFError:
      return 0
    if line:
      print(chat.say(line))


SUBCOMMANDS: list[Callable] = [add_memorize, add_ask, add_eval, add_demo, add_chat]


def build_parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(prog="m3jax", description=__doc__.split("\n")[0])
  sub = parser.add_subparsers(dest="command", required=True)
  for add in SUBCOMMANDS:
    add(sub)
  return parser


def _main(argv: Sequence[str] | None) -> int:
  args = build_parser().parse_args(argv)
  retain_freed_memory()
  compile_cache.enable()
  return args.run(args)


def main(argv: Sequence[str] | None = None) -> int:
  """The `m3jax` console script: bad input becomes one `m3jax: error: ...` line (exit 2), Ctrl-C exit 130."""
  return run_cli(_main, argv, prog="m3jax")


if __name__ == "__main__":
  sys.exit(main())
