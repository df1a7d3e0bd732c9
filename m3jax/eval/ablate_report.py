"""The rows of `m3jax.eval.ablate` from its evaluations, and their outputs: markdown table, PNG, JSON; what one
evaluation is (`EvalSpec`) and the paper's deltas the rows are printed beside (`PAPER`).

A row's number is an accuracy on the shared held-out questions with an error bar: the standard error over
questions (sqrt(p(1-p)/n)) for one evaluation, the sample std over seeds for the RL rows (mean ± std). Its delta
is in points against the row it ablates (the memory base, the controller it modifies, or the RL start), printed
beside the paper's; an RL row's note adds paired intervals over the same questions against the start and (DAPO,
TAURA) against GRPO, which is what decides a tie. A row that cannot run says why instead of a number.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib
from typing import Any, Protocol

import numpy as np

from m3jax.eval.stats import paired_bootstrap

# What each RL algorithm changes in the shared `rl` config (the budget stays: steps, batch_questions, group_size)
ALGORITHMS = {
    "grpo": "group-normalised advantages, symmetric clip (clip_high = clip_low), seq-mean-token-mean, every group "
            "trained (no dynamic sampling)",
    "dapo": "group-normalised advantages, clip-higher (rl.learner.loss), token-mean, dynamic sampling of "
            "mixed-outcome groups (up to rl.sampling.max_rounds generation rounds per step: more rollouts, the "
            "same number of updates)",
    "taura": "DAPO with TAURA token advantages (entropy and turn weighted)",
}
# The paper's deltas, points (robot / web / VideoMME-long), or what it reports instead
PAPER = {"no_semantic": "−17.1 / −19.2 / −13.1", "rl": "+10.0 / +8.0 / +9.3",
         "no_instruction": "−10.5 / −5.8 / −5.9", "no_reasoning": "−11.7 / −8.8 / −9.5",
         "grpo": "DAPO > GRPO", "dapo": "DAPO > GRPO"}


@dataclasses.dataclass(frozen=True)
class EvalSpec:
  """One evaluation: a memory design (with options) answered by a controller. Rows that share a spec share it."""
  design: str = "m3_graph"
  options: tuple[tuple[str, Any], ...] = ()
  answerer: str = "llm"  # llm | rules
  controller: str = "base"  # base | trained | warm | rl-ALGO-seedS
  instruction: bool = True
  source: str = "gold"  # gold: the held-out questions over gold memories; perception: the perception-built episodes

  @property
  def key(self) -> str:
    llm = f"-{self.controller}" if self.answerer == "llm" else ""
    tail = ("" if self.instruction else "-no_instruction") + ("" if self.source == "gold" else f"-{self.source}")
    return f"{design_key(self.design, self.options)}-{self.answerer}{llm}{tail}"


def design_key(name: str, options: tuple[tuple[str, Any], ...]) -> str:
  return name.replace(":", ".") + "".join(f"-{k}={v}" for k, v in options)


def has_thinking_step(model: str) -> bool:
  """Whether the controller model writes a thinking step before acting (Qwen3's <think>); SmolLM2 and the random
  tiny model do not."""
  return "qwen3" in model.lower()



@dataclasses.dataclass
class Row:
  id: str
  label: str
  change: str
  paper: str = "(report)"
  value: float | None = None
  err: float | None = None
  err_kind: str = ""
  n: int = 0
  delta: float | None = None  # points vs `vs`
  vs: str = ""
  note: str = ""
  evals: list[str] = dataclasses.field(default_factory=list)


class AblationRun(Protocol):
  """What the rows read of an ablation run (`ablate.Ablation`, which imports this module: a protocol here
  rather than an import back keeps the two files one-way)."""
  cfg: Any  # ablate.AblateConfig
  out: pathlib.Path
  records: list
  computed: list[str]

  def evaluate(self, spec: EvalSpec) -> dict: ...

  def memory_spec(self, **options) -> EvalSpec: ...

  def protocol(self, which: str) -> tuple[bool, int]: ...


def _single(ab: AblationRun, row: Row, spec: EvalSpec, vs: Row | None = None) -> Row:
  result = ab.evaluate(spec)
  row.evals = [spec.key]
  if "na" in result:
    row.note = result["na"]
    return row
  p, n = result["accuracy"], len(result["correct"])
  row.value, row.err, row.err_kind, row.n = p, math.sqrt(p * (1 - p) / n), "standard error over questions", n
  unsupported = result.get("unsupported_searches", {}).get("node", 0)
  if unsupported:
    total = sum(result["searches"].values())
    row.note = (f"no search_node: {unsupported} of {total} searches asked for it and got the empty result; "
                + row.note).rstrip("; ")
  return _delta(row, vs)


def _delta(row: Row, vs: Row | None) -> Row:
  if vs is not None and vs.value is not None and row.value is not None:
    row.delta, row.vs = 100.0 * (row.value - vs.value), vs.id
  return row


def build_rows(ab: AblationRun) -> list[Row]:
  cfg = ab.cfg
  want = set(cfg.rows)
  rows: list[Row] = []
  mem = cfg.memory_answerer

  def add(row: Row) -> Row:
    if row.id in want or row.id.split(":")[0] in want:
      rows.append(row)
    return row

  mem_who = f"{mem} answerer" + (f" ({'trained' if cfg.trained else 'untrained base'} controller)"
                                  if mem == "llm" else "")
  base = None
  if want & {"base", "no_semantic", "no_equivalence", "reference_mode", "designs"}:
    base = add(_single(ab, Row("base", "M3 graph (memory base)", f"paper mode, {mem_who}", "—"), ab.memory_spec()))
  graph_rows = (
      ("no_semantic", "no semantic memory", "episodic memories only", (("ablation", "no_semantic"),)),
      ("no_equivalence", "no equivalences / character merging", "face and voice ids stay separate",
       (("ablation", "no_equivalence"),)),
      ("reference_mode", "reference graph mode", "mode='reference' (±2 voting, union merge) vs paper",
       (("mode", "reference"),)))
  for rid, label, change, opts in graph_rows:
    if rid in want:
      add(_single(ab, Row(rid, label, change, PAPER.get(rid, "(report)")), ab.memory_spec(options=opts), base))
  # the search-time rows again on memories perception built: gold memories file every line under the face, so
  # merging the voice into it can only matter where a writer tagged speech by voice. (The graph mode also changes
  # how memorization weights edges, so its row would need the episode memorized again; it is not repeated.)
  search_rows = graph_rows[:2]
  if cfg.perception_seeds and want & {rid for rid, *_ in search_rows}:
    where = f"perception-built episodes {', '.join(map(str, cfg.perception_seeds))}, their own questions"
    built = _single(ab, Row("perception:base", "M3 graph (perception-built)", where, "—"),
                    ab.memory_spec(source="perception"))
    rows.append(built)
    for rid, label, change, opts in search_rows:
      if rid in want:
        add(_single(ab, Row(f"{rid}:perception", f"{label} (perception-built)", f"{change}; {where}",
                            PAPER.get(rid, "(report)")), ab.memory_spec(options=opts, source="perception"), built))
  if "designs" in want:
    for name in cfg.designs:
      add(_single(ab, Row(f"designs:{name}", f"memory design: {name}", f"{name} instead of the M3 graph", "—"),
                  ab.memory_spec(design=name), base))

  warm = bool(cfg.rl.warm_start_steps or cfg.rl.init_adapter)  # the RL rows start from a warm start, not the base
  prompting = None
  if want & {"prompting", "rl", "no_instruction"} or (not warm and want & {"warm_start", *ALGORITHMS}):
    prompting = add(_single(ab, Row("prompting", "prompting (untrained base)", f"{cfg.rl.model}, no training", "—"),
                            EvalSpec(controller="base")))
  trained = None
  if "rl" in want:
    row = Row("rl", "prompting vs RL", "the trained controller vs the untrained base", PAPER["rl"])
    if cfg.trained:
      trained = add(_single(ab, row, EvalSpec(controller="trained", instruction=ab.protocol("trained")[0]),
                            prompting))
    else:
      row.note = "no trained controller configured (set trained_model and/or trained_adapter)"
      add(row)
  if "no_instruction" in want:
    who = "trained" if cfg.trained else "base"
    ref, note = (trained if cfg.trained else prompting), ""
    if not ab.protocol(who)[0]:  # trained without it: its own protocol is the ablated one; evaluate it added
      note = (f"the {who} controller was trained without the instruction, so this is its own protocol and the "
              "delta is against adding it")
      ref = add(_single(ab, Row("no_instruction:with", f"{who} controller with the inter-turn instruction",
                                "the per-round instruction added to the tool-result message", "—"),
                        EvalSpec(controller=who, instruction=True)))
    elif ref is None:
      ref = _single(ab, Row(who, who, ""), EvalSpec(controller=who))
    add(_single(ab, Row("no_instruction", "no inter-turn instruction",
                        f"the per-round instruction left out of the tool-result message ({who} controller)",
                        PAPER["no_instruction"], note=note), EvalSpec(controller=who, instruction=False), ref))
  if "no_reasoning" in want:
    model = cfg.trained_model or cfg.rl.model
    note = ("n/a: no-thinking evaluation is not implemented" if has_thinking_step(model)
            else f"n/a: model has no thinking step ({model})")
    add(Row("no_reasoning", "no reasoning", "the controller answers without its thinking step",
            PAPER["no_reasoning"], note=note))
  start, start_spec = prompting, EvalSpec(controller="base")
  if warm and want & {"warm_start", *cfg.algorithms}:
    start_spec = EvalSpec(controller="warm", instruction=ab.protocol("warm")[0])
    start = add(_single(ab, Row("warm_start", "warm start (RL rows' start)", _warm_start_change(cfg.rl), "—"),
                        start_spec, prompting))
  paired_with = {}
  if start is not None and start.value is not None:
    paired_with[start.id] = np.asarray(ab.evaluate(start_spec)["correct"], np.float64)
  for algorithm in cfg.algorithms:
    if algorithm in want:
      row, per_question = _rl_row(ab, algorithm, start, paired_with)
      add(row)
      # every later algorithm against each earlier one: the paper's DAPO vs GRPO, and TAURA (DAPO with token
      # advantages) against both
      paired_with[algorithm] = per_question
  return rows


def _warm_start_change(rl) -> str:
  parts = [f"the adapter {rl.init_adapter.rsplit('/', 1)[-1]}"] if rl.init_adapter else []
  if rl.warm_start_steps:
    parts.append(f"{rl.warm_start_steps} behaviour-cloning steps")
  return " + ".join(parts) + " on the base"


def _rl_row(ab: AblationRun, algorithm: str, start: Row | None,
            paired_with: dict[str, np.ndarray]) -> tuple[Row, np.ndarray]:
  """The algorithm's row (mean ± std of its seeds' accuracies) and its per-question accuracy over seeds. The note
  adds paired intervals over the same questions (each question's correctness averaged over seeds, resampled
  together) against every entry of `paired_with` (the start, and the algorithms before this one): a seed std says
  how runs vary, the paired interval whether two algorithms differ on these questions."""
  cfg = ab.cfg
  # in the protocol the runs trained in (rl.inter_turn_instruction), as the warm start's row
  specs = [EvalSpec(controller=f"rl-{algorithm}-seed{s}", instruction=ab.protocol(f"rl-{algorithm}-seed{s}")[0])
           for s in cfg.rl_seeds]
  results = [ab.evaluate(spec) for spec in specs]
  accs = [r["accuracy"] for r in results]
  per_question = np.mean([np.asarray(r["correct"], np.float64) for r in results], axis=0)
  paired = []
  for name, other in paired_with.items():
    d, lo, hi = paired_bootstrap(per_question, other)
    paired.append(f"vs {name} {100 * d:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] points paired"
                  + (" (a tie)" if lo <= 0 <= hi else ""))
  rl = cfg.rl
  row = Row(algorithm, algorithm.upper(), f"{rl.steps} steps × {rl.batch_questions} questions × G={rl.group_size} "
            f"from the shared start: {ALGORITHMS[algorithm]}", PAPER.get(algorithm, "(report)"),
            value=float(np.mean(accs)), err=float(np.std(accs, ddof=1)), err_kind="std over seeds",
            n=len(ab.records), evals=[s.key for s in specs],
            note="; ".join(["seeds " + ", ".join(f"{s}: {a:.3f}" for s, a in zip(cfg.rl_seeds, accs)), *paired]))
  return _delta(row, start), per_question


def format_table(rows: list[Row]) -> str:
  lines = ["| ablation | what changes | ours (accuracy) | Δ ours (points) | paper Δ (robot / web / VideoMME-long) "
           "| note |", "|---|---|---|---|---|---|"]
  for r in rows:
    ours = "—" if r.value is None else f"{r.value:.3f} ± {r.err:.3f}" + (" (mean ± std)" if r.err_kind.startswith(
        "std") else "")
    delta = "—" if r.delta is None else f"{r.delta:+.1f} vs {r.vs}"
    lines.append(f"| {r.label} | {r.change} | {ours} | {delta} | {r.paper} | {r.note} |")
  return "\n".join(lines)


def plot(rows: list[Row], path) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  shown = [r for r in rows if r.value is not None]
  fig, ax = plt.subplots(figsize=(8, 0.45 * max(len(shown), 1) + 1.2))
  y = np.arange(len(shown))
  ax.barh(y, [r.value for r in shown], xerr=[r.err for r in shown], capsize=3,
          color=["tab:orange" if r.err_kind.startswith("std") else "tab:blue" for r in shown])
  for yi, r in zip(y, shown):
    ax.text(min(r.value + r.err, 0.9) + 0.02, yi, f"{r.value:.3f}", va="center", fontsize=8)
  ax.set_yticks(y, [r.label for r in shown])
  ax.invert_yaxis()
  ax.set_xlim(0, 1)
  ax.set_xlabel("held-out accuracy")
  ax.set_title("error bars: std over seeds (RL rows, orange),\nstandard error over questions (others)", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_outputs(ab: AblationRun, rows: list[Row]) -> dict[str, Any]:
  """Writes ablate.md, ablate.png (when cfg.plot) and ablate.json in out_dir; returns the JSON plus the table."""
  table = format_table(rows)
  evals = {k: json.loads((ab.out / "evals" / f"{k}.json").read_text()) for r in rows for k in r.evals}
  result = {"config": json.loads((ab.out / "config.json").read_text()), "algorithms": ALGORITHMS,
            "questions": [r.to_dict() for r in ab.records], "rows": [dataclasses.asdict(r) for r in rows],
            "evals": evals, "computed": list(ab.computed)}
  (ab.out / "ablate.md").write_text(table + "\n")
  if ab.cfg.plot:
    plot(rows, ab.out / "ablate.png")
  (ab.out / "ablate.json").write_text(json.dumps(result, indent=1))
  return {**result, "table": table}
