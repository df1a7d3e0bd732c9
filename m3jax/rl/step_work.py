"""Where a DAPO step's time goes, counted where it is spent: the sampler's prefill and decode
(`m3jax.engine.work`), the searcher's calls, the judge's, the learner's. `RLProgram.train_step` reports each
step's share as `time/*` and `work/*` metrics, so `bench/rl_throughput.py` can sum a step's parts to its wall time
and set each against its floor.

Compiling is counted too (`compile_s`, and `learner_compile_s` for the learner's programs; `train_step` reports
the whole step's, update included), from JAX's own monitoring events: lowering to MLIR plus XLA's compile of
every program dispatched (tracing is left out, since nested traces would count twice). WHY: the learner compiles
once per call shape, and a short run or a benchmark of a few steps meets most of its shapes for the first time,
so the time a step spends compiling is what tells a cold step from a long run's steady one.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import jax

from m3jax.engine.work import EngineWork

ENGINE = ("prefill_s", "prefill_attended", "prefill_rows", "prefill_reused", "decode_s", "decode_steps",
          "decode_kv_read", "decode_kv_needed")


COMPILE_EVENTS = ("/jax/core/compile/jaxpr_to_mlir_module_duration", "/jax/core/compile/backend_compile_duration")
LEARNER_PROGRAMS = ("_grad_sums", "_logprobs_fn", "_apply", "_init_opt", "_add")  # m3jax.rl.learner's jits
_COMPILED = {"compile_s": 0.0, "learner_compile_s": 0.0}  # this process's totals, from the one listener below
_LISTENING = [False]


def _count_compile(event: str, seconds: float, fun_name: str = "", **_) -> None:
  if event in COMPILE_EVENTS:
    _COMPILED["compile_s"] += seconds
    if fun_name.removeprefix("jit(").removesuffix(")") in LEARNER_PROGRAMS:
      _COMPILED["learner_compile_s"] += seconds


def compiled_seconds() -> dict[str, float]:
  """Seconds this process has spent compiling since the first StepWork: all programs, and the learner's."""
  if not _LISTENING[0]:
    jax.monitoring.register_event_duration_secs_listener(_count_compile)
    _LISTENING[0] = True
  return dict(_COMPILED)


@dataclasses.dataclass
class StepWork:
  """Running totals over a program's rollouts (this process)."""

  engine: EngineWork = dataclasses.field(default_factory=EngineWork)
  search_s: float = 0.0
  judge_s: float = 0.0

  def __post_init__(self):
    compiled_seconds()  # starts counting

  def add_engine(self, work: EngineWork) -> None:
    for k in ENGINE:
      setattr(self.engine, k, getattr(self.engine, k) + getattr(work, k))

  def totals(self) -> dict[str, float]:
    out = {k: float(getattr(self.engine, k)) for k in ENGINE}
    out.update(search_s=self.search_s, judge_s=self.judge_s, **compiled_seconds())
    return out

  def since(self, before: dict[str, float]) -> dict[str, float]:
    """This step's share as metrics: `time/<part>_s` seconds and `work/<count>` counts."""
    now = self.totals()
    return {(f"time/{k}" if k.endswith("_s") else f"work/{k}"): now[k] - before[k] for k in now}


class TimedSearcher:
  """A searcher whose `search` calls add their wall seconds to `work.search_s` (searches run on the host, so
  their time is their own); everything else passes through."""

  def __init__(self, searcher: Any, work: StepWork):
    self._searcher, self._work = searcher, work

  def search(self, requests):
    t0 = time.perf_counter()
    try:
      return self._searcher.search(requests)
    finally:
      self._work.search_s += time.perf_counter() - t0

  def __getattr__(self, name):
    return getattr(self._searcher, name)
