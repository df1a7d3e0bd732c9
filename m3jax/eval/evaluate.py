"""M3-Bench evaluation: annotations + memory graphs -> judged trajectories (JSONL) + summary + plot.

  python -m m3jax.eval --config configs/eval.py --set annotations=m3jax/data/m3bench_annotations/web.json \\
      --set graphs_dir=/path/to/memory_graphs/web --set output=results/web.jsonl
  m3jax eval ANNOTATIONS.json [--answerer rules|llm]    # the memory dirs `memorize` / `demo` wrote (mem_path)

(configs/eval.py defaults to the robot annotations that ship with the package, `bundled_annotations("robot")`.)

A question's graph is its video's `mem_path`: a memory directory as `m3jax memorize` writes it, a saved graph, or
a reference pickle; with `graphs_dir` set, the file of that name in graphs_dir. Every graph is located before
anything runs, so a missing one fails at once, naming it.

Resumable: question ids already answered are skipped. New lines are appended batch by batch (flushed) to
`OUTPUT.partial`, which replaces OUTPUT when the run ends: a killed run loses at most one batch and resumes from
the partial file, and a run that fails before answering anything leaves no file behind. Questions are grouped by
graph before batching so a batch touches few graphs; every graph is loaded once per run (the reference
unpickles it per search).

Pods: with `distributed.*` settings (or the M3JAX_* environment, see `m3jax.distributed`) every process runs the
same command; process 0 reads the output's answered ids and tells the others, each process answers its
contiguous share of the remaining questions (grouped by graph, so a process loads few graphs), and process 0
gathers the other shares through the distributed runtime (no shared filesystem needed) and writes the one
results file, in the order one process writes it. Only process 0 writes files; a killed pod run keeps process
0's lines and resumes the rest. With the rules answerer the file equals the one-process file; the LLM answerer
batches differently per process, so its sampled answers may differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import shutil
import sys
import tempfile
from typing import Any, Callable, Sequence

import jax
import tqdm

from m3jax.control.controller import Controller, ControlConfig, Question
from m3jax.eval.judges import JUDGES, HTTPJudgeConfig, Judge, JudgeItem, make_judge
from m3jax.control.trajectory import Trajectory
from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.data.m3bench import BenchQuestion, load_annotations
from m3jax import distributed
from m3jax.distributed import DistributedConfig, gather_bytes, shard
from m3jax.errors import Interrupted, UserError, run_cli
from m3jax.memory.embedders import make_embedder
from m3jax.eval.report import format_summary, plot_summary, read_jsonl, summarize


@dataclasses.dataclass(frozen=True)
class EvalConfig:
  annotations: str = ""
  graphs_dir: str = ""          # "": a question's graph is its mem_path; else graphs_dir / basename(mem_path)
  output: str = "results/eval.jsonl"
  # trained: `model` + a controller LoRA `adapter` (greedy, with the protocol its adapter records);
  # llm: the control loop on `model` as prompted; rules: the deterministic retrieval answerer
  answerer: str = "llm"
  adapter: str = ""             # answerer=trained: a LoRA adapter file from train.py rl ("" = the shipped one)
  model: str = "smollm2-135m-instruct"   # the control policy: the shipped default, a .gguf or an HF directory
  embedder: str = "minilm"      # "minilm" (m3jax graphs), "hashed" or a *.embedder.json (official-format fixtures)
  judge: str = "llm"            # llm | http | exact | contains | f1 | choice
  judge_model: str = "smollm2-135m-instruct"
  judge_max_new_tokens: int = 8
  http_judge: HTTPJudgeConfig = HTTPJudgeConfig()
  batch_size: int = 64          # questions answered (and saved for resuming) together
  slots: int = 16               # LLM answerers: KV-cache rows a batch's questions share (continuous batching); 0 =
  max_rounds: int = 5           # the whole batch as one static batch
  max_new_tokens: int = 1024
  temperature: float = 0.6
  top_p: float = 0.95
  top_k: int = 20
  greedy: bool = False
  seed: int = 0
  reuse_kv: bool = True
  multiple_choice: bool = False  # letter-only instruction for all (VideoMME-style); automatic for items with options
  limit: int = 0                 # evaluate only the first N questions (0 = all)
  videos: tuple[str, ...] = ()   # restrict to these video ids
  plot: bool = True
  distributed: DistributedConfig = DistributedConfig()  # a pod: questions sharded over processes

  def __post_init__(self):
    if self.judge not in JUDGES:
      raise ValueError(f"EvalConfig.judge must be one of {JUDGES}, got {self.judge!r}")
    if self.answerer not in ("trained", "llm", "rules"):
      raise ValueError(f"EvalConfig.answerer must be trained, llm or rules, got {self.answerer!r}")
    for name in ("batch_size", "max_rounds", "max_new_tokens", "judge_max_new_tokens"):
      if getattr(self, name) < 1:
        raise ValueError(f"EvalConfig.{name} must be >= 1, got {getattr(self, name)}")
    if self.limit < 0 or self.slots < 0:
      raise ValueError(f"EvalConfig.limit and slots must be >= 0, got {self.limit} and {self.slots}")


def select_questions(questions: Sequence[BenchQuestion], cfg: EvalConfig, done: set[str]) -> list[BenchQuestion]:
  """Filters by video and limit, drops answered ids, and orders by graph so batches share graphs."""
  chosen = [q for q in questions if not cfg.videos or q.video_id in cfg.videos]
  if cfg.limit:
    chosen = chosen[:cfg.limit]
  todo = [q for q in chosen if q.question_id not in done]
  order = {m: i for i, m in enumerate(dict.fromkeys(q.mem_path for q in todo))}
  return sorted(todo, key=lambda q: order[q.mem_path])


def graph_path(graphs_dir: str | pathlib.Path, mem_path: str,
               annotations_dir: str | pathlib.Path = ".") -> pathlib.Path:
  """Where the graph of `mem_path` is: graphs_dir / its basename, or (no graphs_dir) mem_path itself, relative to
  the working directory or else to the annotation file's directory (`render_episode` writes it either way)."""
  if graphs_dir:
    candidates = [pathlib.Path(graphs_dir) / pathlib.PurePosixPath(mem_path).name]
  else:
    candidates = list(dict.fromkeys([pathlib.Path(mem_path), pathlib.Path(annotations_dir) / mem_path]))
  for path in candidates:
    if path.exists():
      return path
  raise UserError(f"memory graph of mem_path {mem_path!r} not found (looked for "
                  f"{' and '.join(str(c) for c in candidates)})")


def locate_graphs(cfg: EvalConfig, questions: Sequence[BenchQuestion]) -> dict[str, pathlib.Path]:
  """The graph path of every mem_path the selected questions use; fails before any work if one is missing."""
  chosen = select_questions(questions, cfg, set())
  if any(not q.mem_path for q in chosen):
    raise UserError(f"{cfg.annotations}: a video has no mem_path (the memory to answer from)")
  base = pathlib.Path(cfg.annotations).parent
  return {m: graph_path(cfg.graphs_dir, m, base) for m in dict.fromkeys(q.mem_path for q in chosen)}


def load_graph(path: pathlib.Path):
  """A memory directory (`m3jax memorize`, the demo), a reference pickle, or a saved graph directory."""
  from m3jax.memorize.pipeline import load_memory, read_manifest
  from m3jax.memory import reference_pickle, store
  if path.suffix == ".pkl":
    return reference_pickle.load_reference_pickle(path)
  if path.is_dir() and (path / "manifest.json").exists() and read_manifest(path) is not None:
    return load_memory(path)
  return store.load_graph(path)


def drop_torn_tail(path: pathlib.Path) -> None:
  """Cuts a partial last line (a run killed mid-write) so appended lines start on a fresh line."""
  if not path.exists() or path.stat().st_size == 0:
    return
  data = path.read_bytes()
  if not data.endswith(b"\n"):
    path.write_bytes(data[:data.rfind(b"\n") + 1])


def judged_record(traj: Trajectory, bench: BenchQuestion, verdict) -> dict[str, Any]:
  record = traj.to_json()
  record.update(video_id=bench.video_id, mem_path=bench.mem_path, evidence_clips=list(bench.evidence_clips),
                evidence_distance=bench.evidence_distance, correct=verdict.correct, judge_valid=verdict.valid,
                judge_raw=verdict.raw)
  return record


def run_eval(cfg: EvalConfig, questions: Sequence[BenchQuestion], controller_for: Callable[[list[str]], tuple],
             judge: Judge, log=print, progress: bool = True) -> dict[str, Any]:
  """Runs the un-answered questions and appends judged records to `cfg.output`; returns the summary of the file.

  `controller_for(mem_paths)` returns `(controller, graph_index_of_mem_path)` for the graphs of one batch.
  Progress (rate and ETA) is a tqdm bar on stderr. Lines go to `OUTPUT.partial` (see the module docstring).
  In a pod (several JAX processes) every process calls this; see the module docstring.
  """
  lead = jax.process_index() == 0
  out = pathlib.Path(cfg.output)
  work = out.with_name(out.name + ".partial")
  done: set[str] = set()
  if lead:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists() and not work.exists():
      shutil.copyfile(out, work)
    drop_torn_tail(work)
    done = {r["question_id"] for r in read_jsonl(work)}
  done = set(json.loads(gather_bytes(json.dumps(sorted(done)).encode())[0]))  # process 0's view, everywhere
  todo = select_questions(questions, cfg, done)
  mine = shard(todo)
  log(f"{len(done)} questions already in {out}; {len(todo)} to run"
      + (f", {len(mine)} of them on process {jax.process_index()}" if jax.process_count() > 1 else ""))
  bar = tqdm.tqdm(total=len(mine), unit="q", disable=not progress, dynamic_ncols=True)
  local = work if lead else pathlib.Path(tempfile.mkdtemp(prefix="m3jax_eval_")) / "share.jsonl"
  try:
    _answer_into(local, mine, cfg, controller_for, judge, bar)
    shares = gather_bytes(b"" if lead else local.read_bytes())
  finally:
    if not lead:
      shutil.rmtree(local.parent, ignore_errors=True)
    elif work.exists() and work.stat().st_size == 0:
      work.unlink()
  if lead and any(shares[1:]):
    with work.open("ab") as sink:  # the other processes' shares follow process 0's, in process order
      sink.writelines(shares[1:])
  if lead and work.exists():
    os.replace(work, out)
  records = json.loads(gather_bytes(json.dumps(read_jsonl(out) if lead else []).encode())[0])  # everywhere
  summary = summarize(records)
  if lead:
    out.with_suffix(".summary.json").write_text(json.dumps(summary, indent=1), encoding="utf-8")
    if cfg.plot and summary["questions"]:
      plot_summary(summary, out.with_suffix(".png"))
  return summary


def _answer_into(work: pathlib.Path, todo: list[BenchQuestion], cfg: EvalConfig, controller_for, judge: Judge,
                 bar) -> None:
  with bar, work.open("a", encoding="utf-8") as sink:
    for b in range(0, len(todo), cfg.batch_size):
      batch = todo[b:b + cfg.batch_size]
      controller, index = controller_for(list(dict.fromkeys(q.mem_path for q in batch)))
      qs = [Question(question_id=q.question_id, question=q.prompt_text(), answer=q.answer,
                     graph_index=index[q.mem_path], graph_key=q.video_id, before_clip=q.before_clip,
                     question_types=q.types, multiple_choice=cfg.multiple_choice or q.multiple_choice)
            for q in batch]
      # an LLM policy shares `slots` rows; rules, re-prefill and test policies run the batch static
      slotted = cfg.slots and cfg.reuse_kv and hasattr(getattr(controller, "policy", None), "advance")
      trajs = (controller.run(qs, slots=min(cfg.slots, len(qs))) if slotted
               else controller.run(qs))
      verdicts = judge.judge([JudgeItem(t.question, q.answer, t.response) for t, q in zip(trajs, batch)])
      for traj, q, verdict in zip(trajs, batch, verdicts):
        sink.write(json.dumps(judged_record(traj, q, verdict), ensure_ascii=False) + "\n")
      sink.flush()
      bar.update(len(batch))


def build_judge(cfg: EvalConfig) -> Judge:
  return make_judge(cfg.judge, cfg.judge_model, cfg.http_judge, cfg.judge_max_new_tokens)


class RuleController:
  """The deterministic retrieval answerer (`RuleAnswerer`) behind the controller interface: one [Answer] round
  per question, no tokens; an empty answer leaves the question unanswered."""

  def __init__(self, answerer):
    self.answerer = answerer

  def run(self, questions: Sequence[Question]) -> list[Trajectory]:
    from m3jax.control.trajectory import RoundRecord
    trajs = []
    for q, answer in zip(questions, self.answerer.answer(questions)):
      t = Trajectory(question_id=q.question_id, question=q.question, ground_truth=q.answer, graph_key=q.graph_key,
                     before_clip=q.before_clip, question_types=list(q.question_types),
                     multiple_choice=q.multiple_choice)
      t.rounds.append(RoundRecord(action="answer", content=answer, text=f"Action: [Answer]\nContent: {answer}"))
      t.response = answer or None
      trajs.append(t)
    return trajs


def build_controller_factory(cfg: EvalConfig, graph_paths: dict[str, pathlib.Path]):
  """Loads the policy once (`answerer=trained|llm`); loads each graph (`graph_paths[mem_path]`) once and caches it."""
  from m3jax.control.answer import RuleAnswerer
  from m3jax.control.build import build_policy, control_sampling, load_controller
  from m3jax.memory.search import MemorySearcher, SearchConfig

  control = ControlConfig(max_rounds=cfg.max_rounds)
  if cfg.answerer in ("trained", "llm"):
    loaded = load_controller(cfg.model, cfg.adapter or None, trained=cfg.answerer == "trained",
                             max_new_tokens=cfg.max_new_tokens, control=control, greedy=cfg.greedy)
    model, tok, control = loaded.model, loaded.tokenizer, loaded.control
    sampling = control_sampling(tok, loaded.max_new_tokens, greedy=loaded.greedy, seed=cfg.seed,
                                stops=("<|im_end|>", "<|endoftext|>"), temperature=cfg.temperature,
                                top_p=cfg.top_p, top_k=cfg.top_k)
  embed = make_embedder(cfg.embedder)
  graphs: dict[str, Any] = {}

  def controller_for(mem_paths: list[str]):
    for m in mem_paths:
      if m not in graphs:
        graphs[m] = load_graph(graph_paths[m])
    index = {m: i for i, m in enumerate(mem_paths)}
    batch_graphs = [graphs[m] for m in mem_paths]
    if cfg.answerer == "rules":
      return RuleController(RuleAnswerer(batch_graphs, embed)), index
    policy = build_policy(model, tok, sampling, reuse_kv=cfg.reuse_kv)
    searcher = MemorySearcher(batch_graphs, embed, SearchConfig())
    return Controller(policy, searcher, control), index
  return controller_for


def evaluate(cfg: EvalConfig, progress: bool = True) -> dict[str, Any]:
  """The whole evaluation of `cfg`: annotations, graphs located up front, answers, judge, summary. For entry
  points: Ctrl-C becomes `Interrupted`, saying that a re-run resumes. Joins the pod first when `cfg.distributed`
  (or the M3JAX_* environment) describes one."""
  distributed.initialize(cfg.distributed)
  if not cfg.annotations:
    raise UserError("set annotations=... (config file or --set): the M3-Bench-format questions to answer")
  questions = load_annotations(cfg.annotations)
  paths = locate_graphs(cfg, questions)
  try:
    return run_eval(cfg, questions, build_controller_factory(cfg, paths), build_judge(cfg), progress=progress)
  except KeyboardInterrupt:
    raise Interrupted(f"the answers so far are kept in {cfg.output}.partial; re-run the same command to "
                      "resume") from None


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="m3jax.eval", description=__doc__.split("\n")[0])
  add_config_args(parser)
  args = parser.parse_args(argv)
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(EvalConfig(), args.overrides)
  print(format_summary(evaluate(cfg)))
  return 0


if __name__ == "__main__":
  sys.exit(run_cli(main, prog="m3jax.eval"))
