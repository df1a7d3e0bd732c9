"""Training runs as a sequence of chunks of at most N minutes, each resuming exactly from the last one's state.

Why: a run here takes hours, and the machines that run it are lent for a while (90 minutes, say) and then taken
back. A chunk trains until its budget is spent, checked between steps, then writes its state and exits 0 with
the command that continues the run; that same command (in `OUT_DIR/continue.cmd`) started again later, on any
machine with the repository, continues from the newest checkpoint. The programs already resume exactly (every
random choice is a pure function of (seed, step), the checkpoint holds parameters, optimizer state, data
position and the curve's log): this module only decides when a chunk stops and records the run's chunks.

A chunk's out_dir is meant to be committed as it stands (`git add -f runs/NAME`, runs/ is ignored): the newest
checkpoint (orbax, written to a temporary directory and renamed, so a kill never leaves a half-written one),
metrics.jsonl (the curve; a resumed chunk drops lines after its checkpoint), the adapter so far, `continue.cmd`
and `chunks.json` (one record per chunk: when, how long, from and to which step).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import pathlib
import shlex
import time
from typing import Callable, Sequence

_IMPORTED = time.monotonic()  # train.py imports this module first thing: the chunk's clock starts with the process

CONTINUE_FILE = "continue.cmd"
LOG_FILE = "chunks.json"


@dataclasses.dataclass(frozen=True)
class ChunkConfig:
  """When a chunk stops. `max_minutes` counts from the process's start (model loading and compiles included);
  a chunk stops before a step when that step, taking as long as the longest step of this chunk so far, would end
  past it. `max_steps` stops after that many steps (warm-start and training steps alike) whatever the clock says:
  fixed chunk boundaries for tests and for a budget counted in steps. 0 turns either off. A chunk always runs
  at least one step, so a run always advances."""
  max_minutes: float = 90.0
  max_steps: int = 0

  def __post_init__(self):
    if self.max_minutes < 0 or self.max_steps < 0:
      raise ValueError(f"chunk.max_minutes and chunk.max_steps must be >= 0, got {self.max_minutes}, "
                       f"{self.max_steps}")


class ChunkBudget:
  """Counts one chunk's steps and their durations. `clock` is injectable (a fake clock in tests)."""

  def __init__(self, cfg: ChunkConfig, started: float | None = None, clock: Callable[[], float] = time.monotonic):
    self.cfg, self.clock = cfg, clock
    self.started = _IMPORTED if started is None else started
    self._last = clock()
    self.steps = 0
    self.longest = 0.0
    self.stopped = False

  def step_done(self) -> None:
    """Marks the end of a step (its duration runs from the previous mark, or from this budget's creation)."""
    now = self.clock()
    self.longest = max(self.longest, now - self._last)
    self._last = now
    self.steps += 1

  def exhausted(self) -> bool:
    """Whether the chunk should stop before its next step (never before its first)."""
    c = self.cfg
    if self.steps == 0:
      return False
    if c.max_steps and self.steps >= c.max_steps:
      return True
    return bool(c.max_minutes) and self.clock() - self.started + self.longest > 60.0 * c.max_minutes

  def elapsed_minutes(self) -> float:
    return (self.clock() - self.started) / 60.0


def elapsed_minutes() -> float:
  """Minutes since this process imported the module (train.py does so first: the chunk's wall time)."""
  return (time.monotonic() - _IMPORTED) / 60.0


def command(program: str, argv: Sequence[str]) -> str:
  """The shell command that runs `train.py` with `argv` again (from the repository root)."""
  return shlex.join(["python", program, *argv])


def write_atomic(path: pathlib.Path, text: str) -> None:
  """Writes `text` to `path` through a temporary file and a rename: a kill leaves the old file or the new one."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
  tmp.write_text(text)
  os.replace(tmp, path)


def begin(out_dir: str | pathlib.Path, cmd: str) -> None:
  """Before the chunk trains: `continue.cmd` holds the command, so a chunk killed mid-way is continued by it."""
  write_atomic(pathlib.Path(out_dir) / CONTINUE_FILE,
               "# continues this run from its newest checkpoint (run from the repository root)\n" + cmd + "\n")


def end(out_dir: str | pathlib.Path, cmd: str, summary: dict, budget_minutes: float) -> str:
  """After the chunk: appends its record to `chunks.json` and returns the line to print (how to continue, or
  that the run is finished). `summary` holds `step` (reached), `steps` (the run's target), `start_step`,
  `finished` and optionally `progress` (words for where the run stands, e.g. inside a warm start)."""
  out = pathlib.Path(out_dir)
  log = out / LOG_FILE
  records = json.loads(log.read_text())["chunks"] if log.exists() else []
  records.append({"ended_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "minutes": round(budget_minutes, 2), "from_step": summary.get("start_step"),
                  "to_step": summary["step"], "finished": bool(summary["finished"])})
  write_atomic(log, json.dumps({"command": cmd, "steps": summary["steps"], "step": summary["step"],
                                "finished": bool(summary["finished"]), "chunks": records}, indent=1) + "\n")
  progress = summary.get("progress") or f"step {summary['step']}/{summary['steps']}"
  if summary["finished"]:
    return f"run finished at {progress} ({out})"
  return f"chunk ended at {progress}; continue with: {cmd}  (also in {out / CONTINUE_FILE})"
