"""The paper's ablations from one command, each beside the paper's delta.

  python -m m3jax.eval.ablate --config configs/ablate.py
  python -m m3jax.eval.ablate --config configs/ablate_tiny.py --set out_dir=runs/ablate_tiny

Every row is answered on the same held-out questions (family-balanced, `memory_qa.heldout_questions`: unseen
episodes, phrasings and family) and judged by the same judge. Three groups:
  * memory rows: the memory answerer (`memory_answerer`: the LLM controller or the rules answerer) over gold-memory
    designs, so they isolate the memory: the M3 graph in paper mode (the base), without semantic memory, without
    equivalences (face and voice stay apart), in the reference's graph mode, and each other memory design
    (`designs`, by registry name) — a design without the node route is run anyway and the table says how many
    searches it could not answer;
  * control rows, on the base graph: prompting (the untrained base `rl.model`) vs a trained controller, the
    controller without the inter-turn instruction, and without its thinking step (for a model that has one);
  * RL rows: GRPO, DAPO and TAURA (`ALGORITHMS`) with the budget of `rl` (steps, questions, G) from one shared
    warm start, over `rl_seeds`: mean ± std over seeds.
out_dir receives ablate.md (the table), ablate.png (bars with error bars: std over seeds for RL rows, the
standard error over questions otherwise) and ablate.json (every number, per question, and the config).

Resumable: every evaluation is written to out_dir/evals/KEY.json when it finishes, every RL run checkpoints under
out_dir/rl/KEY/ (RLProgram resumes it), built memories are saved under out_dir/memory/. A rerun with the same
config skips what is finished; a different config in the same out_dir is refused, naming the fields.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import sys
import time
from typing import Any, Sequence

import numpy as np

from m3jax.eval.ablate_report import ALGORITHMS, EvalSpec, build_rows, design_key, write_outputs
from m3jax.eval.judges import HTTPJudgeConfig, make_judge, score_answers
from m3jax import compile_cache
from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.data.episodes import EpisodeConfig
from m3jax.data.memory_qa import episode_clips, episode_records, heldout_questions
from m3jax.data.questions import HELDOUT_SEED_START, check_split
from m3jax.errors import Interrupted, UserError, run_cli
from m3jax.host_memory import release_executables
from m3jax.memory.designs import DesignError, DesignSearcher, design_class, load_design, make_design
from m3jax.memory.graph import GraphConfig
from m3jax.rl.program import RLConfig

ROWS = ("base", "no_semantic", "no_equivalence", "reference_mode", "designs", "prompting", "rl", "no_instruction",
        "no_reasoning", "warm_start", "grpo", "dapo", "taura")


@dataclasses.dataclass(frozen=True)
class AblateConfig:
  out_dir: str = "runs/ablate"
  questions: int = 96
  first_seed: int = HELDOUT_SEED_START
  episode: EpisodeConfig = EpisodeConfig()
  embedder: str = "hashed"  # hashed | minilm | *.embedder.json, as train.py rl (the RL rows train with rl.embedder)
  judge: str = "contains"
  judge_model: str = "smollm2-135m-instruct"
  http_judge: HTTPJudgeConfig = HTTPJudgeConfig()
  memory_answerer: str = "llm"  # llm: the base controller answers the memory rows; rules: the rules answerer
  designs: tuple[str, ...] = ("flat_list", "clip_summary")  # rows beside the M3 graph (registry names)
  greedy: bool = True  # greedy decoding in every evaluation (the RL rows still sample while training)
  max_rounds: int = 5
  max_new_tokens: int = 192
  constrain_base: bool = True  # the untrained base decodes inside the action format (a 135M model rarely writes it)
  # the trained controller of the "prompting vs RL" row: a load_llm name/path, and/or a controller adapter file
  # (`train.py rl` with lora_rank > 0: OUT_DIR/adapter.npz) on top of it (or of rl.model)
  trained_model: str = ""
  trained_adapter: str = ""
  rl: RLConfig = RLConfig()  # the base controller (rl.model) and the budget every RL row trains with
  algorithms: tuple[str, ...] = ("grpo", "dapo", "taura")
  rl_seeds: tuple[int, ...] = (1, 2, 3)
  # the search-time memory rows (no semantic memory, no equivalences) also on these held-out episodes, rendered and
  # memorized from their video by the real perception and the template writer (as `m3jax memorize`), each asked its
  # own questions; () = none
  perception_seeds: tuple[int, ...] = ()
  perception_episode: EpisodeConfig = EpisodeConfig(num_clips=4)
  perception_face_fps: float = 0.5
  rows: tuple[str, ...] = ROWS
  plot: bool = True

  def __post_init__(self):
    if self.questions < 1 or self.max_rounds < 1 or self.max_new_tokens < 1:
      raise ValueError("AblateConfig: questions, max_rounds and max_new_tokens must be >= 1")
    if self.memory_answerer not in ("llm", "rules"):
      raise ValueError(f"AblateConfig.memory_answerer must be llm or rules, got {self.memory_answerer!r}")
    unknown = [a for a in self.algorithms if a not in ALGORITHMS] + [r for r in self.rows if r not in ROWS]
    if unknown:
      raise ValueError(f"AblateConfig: unknown algorithms/rows {unknown} (algorithms: {', '.join(ALGORITHMS)}; "
                       f"rows: {', '.join(ROWS)})")
    if any(a in self.rows for a in self.algorithms) and len(set(self.rl_seeds)) < 3:
      raise ValueError(f"AblateConfig.rl_seeds: the RL rows need >= 3 distinct seeds, got {self.rl_seeds}")
    if self.embedder != self.rl.embedder:
      raise ValueError(f"AblateConfig.embedder={self.embedder!r} but rl.embedder={self.rl.embedder!r}: the RL rows "
                       "would be trained on another retrieval than they are evaluated on")
    check_split(self.perception_seeds, "heldout")
    for name in self.designs:
      try:
        design_class(name)
      except DesignError as e:
        raise ValueError(f"AblateConfig.designs: {e}") from None

  @property
  def trained(self) -> bool:
    return bool(self.trained_model or self.trained_adapter)


def rl_config(cfg: AblateConfig, algorithm: str, seed: int, out_dir: pathlib.Path) -> RLConfig:
  """The shared RL config turned into `algorithm` (see ALGORITHMS) for `seed`; no warm start of its own."""
  base = cfg.rl
  loss, sampling = base.learner.loss, base.sampling
  if algorithm == "grpo":
    loss = dataclasses.replace(loss, clip_high=loss.clip_low, agg_mode="seq-mean-token-mean")
    sampling = dataclasses.replace(sampling, enabled=False)
  else:
    loss = dataclasses.replace(loss, agg_mode="token-mean")
    sampling = dataclasses.replace(sampling, enabled=True)
  return dataclasses.replace(base, advantage="taura" if algorithm == "taura" else "grpo", seed=seed,
                             learner=dataclasses.replace(base.learner, loss=loss), sampling=sampling,
                             warm_start_steps=0, eval_every=0, out_dir=str(out_dir))


class Ablation:
  """Runs the rows of one config in out_dir, reusing every finished evaluation (see module docstring)."""

  def __init__(self, cfg: AblateConfig, progress: bool = True):
    from m3jax.memory.embedders import make_embedder
    self.cfg, self.progress = cfg, progress
    self.out = pathlib.Path(cfg.out_dir)
    self._check_resume()
    self.embed = make_embedder(cfg.embedder)
    self.dim = int(np.asarray(self.embed(["x"])).shape[-1])
    self.seeds, self.records = heldout_questions(cfg.questions, cfg.first_seed, cfg.episode)
    self.judge = make_judge(cfg.judge, cfg.judge_model, cfg.http_judge)
    self.computed: list[str] = []  # evaluation keys this process ran (the rest came from out_dir)
    self._models: dict[str, Any] = {}
    self._warm = None
    self._perception = None

  # ------------------------------------------------------------------------------------------- resume
  def _check_resume(self) -> None:
    path = self.out / "config.json"
    mine = _jsonable(dataclasses.asdict(self.cfg))
    free = ("rows", "plot", "out_dir")  # choosing rows or plotting does not change any number
    if path.exists():
      theirs = json.loads(path.read_text())
      diff = sorted(k for k in set(mine) | set(theirs) if k not in free and mine.get(k) != theirs.get(k))
      if diff:
        raise UserError(f"{self.out} holds an ablation with a different config ({', '.join(diff)} differ); use "
                        "another out_dir or the same config to resume")
    self.out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(mine, indent=1))

  def _cached(self, key: str, compute) -> dict:
    path = self.out / "evals" / f"{key}.json"
    if path.exists():
      return json.loads(path.read_text())
    if self.progress:
      print(f"[ablate] {key} ...", flush=True)
    result = compute()
    path.parent.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    self.computed.append(key)
    return result

  # ------------------------------------------------------------------------------------------ memories
  def designs(self, name: str, options: tuple[tuple[str, Any], ...]) -> list:
    """The design built from every held-out episode's gold memories (saved under out_dir/memory, reloaded)."""
    opts = dict(options)
    if name == "m3_graph":
      opts.setdefault("text_dim", self.dim)
    root = self.out / "memory" / design_key(name, options)
    out = []
    for seed in self.seeds:
      path = root / str(seed)
      if (path / "design.json").exists():
        out.append(load_design(path, self.embed))
        continue
      design = make_design(name, self.embed, **opts)
      dims = getattr(design, "graph_config", GraphConfig())  # entity sizes (designs without entities ignore them)
      for clip in episode_clips(seed, self.cfg.episode, dims.face_dim, dims.voice_dim)[0]:
        design.update(clip)
      design.save(path)
      out.append(design)
    return out

  def perception_task(self):
    """(graphs, records, text embedder) of the perception-built episodes: each rendered and memorized once under
    out_dir/perception/SEED (the memorizer resumes a killed run), asked its own questions."""
    from m3jax.memorize.pipeline import MemorizeConfig, Memorizer, load_memory
    from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
    from m3jax.data.episode_render import render_episode
    from m3jax.data.episodes import make_episode
    if self._perception is None:
      c = self.cfg
      models = PerceptionModels.load()
      config = MemorizeConfig(perception=PerceptionConfig(face_fps=c.perception_face_fps))
      graphs, records = [], []
      for i, seed in enumerate(c.perception_seeds):
        ep = make_episode(dataclasses.replace(c.perception_episode, seed=seed))
        root = self.out / "perception" / str(seed)
        if not (root / f"{ep.id}.mp4").exists():
          render_episode(ep, root)
        Memorizer(root / "memory", config, models=models).memorize(root / f"{ep.id}.mp4", progress=self.progress)
        graphs.append(load_memory(root / "memory"))
        records += episode_records(i, ep.qa_list)
      self._perception = graphs, records, models.text
    return self._perception

  def memory(self, spec: EvalSpec):
    """(designs, records, text embedder) an evaluation answers over."""
    if spec.source == "gold":
      return self.designs(spec.design, spec.options), self.records, self.embed
    built = {k for k, _ in spec.options if k in {f.name for f in dataclasses.fields(GraphConfig)}}
    if built:  # a memorization-time setting cannot be applied to a graph memorized without it
      raise ValueError(f"perception-built memories were memorized with the default GraphConfig; options "
                       f"{sorted(built)} would need them memorized again")
    graphs, records, embed = self.perception_task()
    designs = []
    for g in graphs:
      designs.append(make_design("m3_graph", embed, **dataclasses.asdict(g.config), **dict(spec.options)))
      designs[-1].graph = g
    return designs, records, embed

  # ------------------------------------------------------------------------------------------ controllers
  def protocol(self, which: str) -> tuple[bool, int]:
    """(inter-turn instruction, max_new_tokens) controller `which` runs with by default: the protocol it was
    trained with. The trained controller's adapter file records its own (the shipped one was trained without the
    inter-turn instruction, in 48-token turns); the warm start and the RL runs use `rl`'s; the untrained base the
    paper's (the instruction on)."""
    from m3jax.models.lora import read_adapter_meta
    c = self.cfg
    if which == "trained" and c.trained_adapter:
      info = read_adapter_meta(c.trained_adapter, "controller")
      return bool(info.get("inter_turn_instruction", True)), int(info.get("max_new_tokens", c.max_new_tokens))
    if which == "base" or (which == "trained" and not c.trained_adapter):
      return True, c.max_new_tokens
    return c.rl.inter_turn_instruction, c.max_new_tokens

  def memory_spec(self, **options) -> EvalSpec:
    """The memory rows' evaluation: the memory answerer over a design; with the LLM answerer, the trained
    controller when one is configured (the untrained 135M base answers almost nothing, which would hide every
    memory effect), in its own protocol."""
    if self.cfg.memory_answerer == "rules":
      return EvalSpec(answerer="rules", **options)
    who = "trained" if self.cfg.trained else "base"
    return EvalSpec(answerer="llm", controller=who, instruction=self.protocol(who)[0], **options)

  def model(self, which: str):
    """(model, tokenizer) of the base controller, the trained one, the shared warm start or an RL run's result,
    ready to decode (LoRA adapters merged). RL runs' policies are used once and not kept."""
    from m3jax.models.lora import load_adapter_file
    from m3jax.rl.program import load_model
    if which.startswith("rl-"):
      return self.train(which)
    if which not in self._models:
      c = self.cfg
      if which == "base":
        model, tok = load_model(c.rl)
      elif which == "trained":
        model, tok = load_model(dataclasses.replace(c.rl, model=c.trained_model or c.rl.model, lora_rank=0))
        if c.trained_adapter:
          model, _ = load_adapter_file(c.trained_adapter, model, kind="controller")
      else:
        model, tok = self.warm_program().model, self.warm_program().tokenizer
      self._models[which] = (_decoding(model), tok)
    return self._models[which]

  def warm_program(self):
    """The RLProgram holding the shared warm start: `rl.init_adapter` (if any), then its `rl.warm_start_steps` of
    behaviour cloning on rl.seed."""
    from m3jax.rl.program import RLProgram
    if self._warm is None:
      self._warm = RLProgram(dataclasses.replace(self.cfg.rl, out_dir=str(self.out / "rl" / "warm")))
      self._warm.warm_start()
    return self._warm

  def train(self, which: str):
    """Trains RL run `rl-ALGO-seedS` from the shared warm start (resuming its checkpoint); returns its policy."""
    program = self.rl_program(which)
    program.run()
    return _decoding(program.model), program.tokenizer

  def rl_program(self, which: str):
    """The RLProgram of run `rl-ALGO-seedS`, holding the shared warm start's parameters unless its checkpoint
    exists (then `run` restores that)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from m3jax import checkpoint
    from m3jax.rl.learner import Learner
    from m3jax.rl.program import RLProgram
    _, algorithm, seed = which.split("-")
    run_dir = self.out / "rl" / which
    program = RLProgram(rl_config(self.cfg, algorithm, int(seed.removeprefix("seed")), run_dir))
    ckpt = checkpoint.Checkpointer(run_dir / "ckpt")
    fresh = ckpt.latest_step() is None
    ckpt.close()
    if fresh:  # the same start for every run: the warm start's parameters (fresh copies: the learner donates)
      start = jax.tree.map(lambda x: jnp.array(np.asarray(x)), nnx.state(self.warm_program().model, nnx.Param))
      nnx.update(program.model, start)
      program.learner = Learner(program.model, program.cfg.learner, ref_model=program.ref_model)
    return program

  # ------------------------------------------------------------------------------------------ evaluation
  def evaluate(self, spec: EvalSpec) -> dict:
    return self._cached(spec.key, lambda: self._evaluate(spec))

  def _evaluate(self, spec: EvalSpec) -> dict:
    from m3jax.control.answer import LLMAnswerer, RuleAnswerer
    release_executables()  # nine RL runs and their evaluations in one process: stay under its map limit
    from m3jax.control.controller import ControlConfig, Question
    c = self.cfg
    designs, records, embed = self.memory(spec)
    questions = [Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip,
                          question_types=r.types) for r in records]
    t0 = time.perf_counter()
    if spec.answerer == "rules":
      if spec.design != "m3_graph":
        return {"na": f"n/a: the rules answerer searches by character id (search_node), which {spec.design} "
                      "cannot answer"}
      answerer = RuleAnswerer([d.graph for d in designs], embed, search=designs[0].search_config)
      answers = answerer.answer(questions)
      stats: dict[str, Any] = {}
    else:
      searcher = DesignSearcher(designs)
      graphs = [d.graph for d in designs] if spec.design == "m3_graph" else None  # names for "<character_i>"
      answerer = LLMAnswerer(graphs, embed, self.model(spec.controller),
                             max_new_tokens=self.protocol(spec.controller)[1],
                             constrain_actions=c.constrain_base and spec.controller == "base", searcher=searcher,
                             control=ControlConfig(c.max_rounds, spec.instruction), greedy=c.greedy)
      answers = answerer.answer(questions)
      trajs = answerer.trajectories
      stats = {"rounds": sum(len(t.rounds) for t in trajs) / len(trajs),
               "format_errors": sum(r.action == "format_error" for t in trajs for r in t.rounds) / len(trajs),
               "searches": dict(searcher.requests), "unsupported_searches": dict(searcher.unsupported)}
    return {**score_answers(self.judge, records, answers), **stats, "answers": answers,
            "seconds_per_question": (time.perf_counter() - t0) / len(questions)}

  # ------------------------------------------------------------------------------------------ rows
  def run(self) -> dict:
    rows = build_rows(self)
    return write_outputs(self, rows)


def _decoding(model):
  """The model to decode with: LoRA adapters folded into a copy of the weights (as RLProgram's rollouts do)."""
  from m3jax.models.lora import merged
  return merged(model) if getattr(model, "lora", None) is not None else model


def _jsonable(x):
  return json.loads(json.dumps(x, default=str))


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="m3jax.eval.ablate", description=__doc__.split("\n")[0])
  add_config_args(parser)
  args = parser.parse_args(argv)
  compile_cache.enable()
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(AblateConfig(), args.overrides)
  try:
    result = Ablation(cfg).run()
  except KeyboardInterrupt:
    raise Interrupted(f"finished evaluations are kept in {cfg.out_dir}/evals; re-run the same command to "
                      "resume") from None
  print(result["table"])
  return 0


if __name__ == "__main__":
  sys.exit(run_cli(main, prog="m3jax.eval.ablate"))
