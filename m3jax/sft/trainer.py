"""SFT loop for the Omni thinker: gradient accumulation, orbax checkpoints with exact resume, eval loss, metrics.

Exact resume: batch k of the run is a pure function of (data seed, k) (grain random access, see sft.data), the
optimizer state and step come from the checkpoint, and nothing else is random, so a run killed after a checkpoint
and restarted reproduces the same loss curve.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx

from m3jax.models.omni.thinker import Thinker
from m3jax.sft.example import Batch
from m3jax.sft.loss import thinker_loss


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  steps: int = 100
  accum: int = 1  # micro-batches per optimizer step
  learning_rate: float = 1e-3
  warmup_steps: int = 10
  weight_decay: float = 0.0
  clip_norm: float = 1.0
  loss_chunk: int = 64
  eval_every: int = 20
  checkpoint_every: int = 20
  keep_checkpoints: int = 2

  def __post_init__(self):
    if self.steps < 1 or self.accum < 1 or self.loss_chunk < 1:
      raise ValueError(f"steps, accum and loss_chunk must be >= 1, got {self.steps}, {self.accum}, {self.loss_chunk}")
    if self.checkpoint_every < 1 or self.eval_every < 1:
      raise ValueError("checkpoint_every and eval_every must be >= 1")


def make_optimizer(model: Thinker, cfg: TrainConfig) -> nnx.Optimizer:
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1), max(cfg.steps, 2))
  tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adamw(sched, weight_decay=cfg.weight_decay))
  return nnx.Optimizer(model, tx, wrt=nnx.Param)


@nnx.jit(static_argnames=("chunk",))
def _grads(model: Thinker, batch: Batch, chunk: int):
  def f(m):
    total, count = thinker_loss(m, batch.inputs, batch.labels, batch.weights, chunk)
    return total, count
  (total, count), grads = nnx.value_and_grad(f, has_aux=True)(model)
  return total, count, grads


@nnx.jit
def _apply(model: Thinker, optimizer: nnx.Optimizer, grads, count):
  grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
  optimizer.update(model, grads)


@nnx.jit(static_argnames=("chunk",))
def _eval(model: Thinker, batch: Batch, chunk: int):
  return thinker_loss(model, batch.inputs, batch.labels, batch.weights, chunk)


def evaluate(model: Thinker, batches: Iterable[Batch], chunk: int) -> float:
  """Mean NLL per target token over all batches."""
  total = count = 0.0
  for b in batches:
    t, c = _eval(model, b, chunk)
    total, count = total + float(t), count + float(c)
  return total / max(count, 1.0)


class Trainer:
  """`train_batch(k)` gives micro-batch k (deterministic); `eval_batches()` the fixed eval set."""

  def __init__(self, model: Thinker, cfg: TrainConfig, out_dir: str | pathlib.Path,
               train_batch: Callable[[int], Batch], eval_batches: Callable[[], Sequence[Batch]],
               progress: bool = True):
    self.model, self.cfg = model, cfg
    self.out = pathlib.Path(out_dir)
    self.out.mkdir(parents=True, exist_ok=True)
    self.optimizer = make_optimizer(model, cfg)
    self.train_batch, self.eval_batches = train_batch, eval_batches
    self.progress = progress
    self.step = 0
    self._tb = None
    self.ckpt = ocp.CheckpointManager(
        (self.out / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep_checkpoints, create=True))
    self._restore()

  def _restore(self) -> None:
    last = self.ckpt.latest_step()
    if last is None:
      return
    target = {"model": nnx.state(self.model, nnx.Param), "opt": nnx.state(self.optimizer, nnx.optimizer.OptState)}
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    restored = self.ckpt.restore(last, args=ocp.args.StandardRestore(abstract))
    nnx.update(self.model, restored["model"])
    nnx.update(self.optimizer, restored["opt"])
    self.step = int(last)

  def _save(self) -> None:
    state = {"model": nnx.state(self.model, nnx.Param), "opt": nnx.state(self.optimizer, nnx.optimizer.OptState)}
    self.ckpt.save(self.step, args=ocp.args.StandardSave(state))
    self.ckpt.wait_until_finished()

  def _log(self, record: dict) -> None:
    with open(self.out / "metrics.jsonl", "a") as fh:
      fh.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k not in ("step", "kind") and isinstance(v, (int, float)):
          self._tb.add_scalar(f"{record['kind']}/{k}", v, record["step"])

  def run(self, kill_after: int | None = None) -> list[dict]:
    """Trains to cfg.steps (from the restored step). `kill_after`: stop after that many steps (resume tests)."""
    from tensorboardX import SummaryWriter
    from tqdm import tqdm
    self._tb = SummaryWriter(str(self.out / "tensorboard"))
    history: list[dict] = []
    if self.step == 0:
      rec = {"kind": "eval", "step": 0, "loss": evaluate(self.model, self.eval_batches(), self.cfg.loss_chunk)}
      self._log(rec)
      history.append(rec)
    bar = tqdm(total=self.cfg.steps, initial=self.step, disable=not self.progress, desc="sft")
    done = 0
    while self.step < self.cfg.steps and (kill_after is None or done < kill_after):
      t0 = time.perf_counter()
      grads, total, count, tokens = None, 0.0, 0.0, 0
      for k in range(self.cfg.accum):
        batch = self.train_batch(self.step * self.cfg.accum + k)
        t, c, g = _grads(self.model, batch, self.cfg.loss_chunk)
        grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
        total, count = total + t, count + c
        tokens += int(np.sum(batch.inputs.lengths))
      _apply(self.model, self.optimizer, grads, count)
      loss = float(total) / max(float(count), 1.0)
      self.step += 1
      done += 1
      dt = time.perf_counter() - t0
      rec = {"kind": "train", "step": self.step, "loss": loss, "tokens_per_s": tokens / dt, "seconds": dt}
      self._log(rec)
      history.append(rec)
      bar.update(1)
      bar.set_postfix(loss=f"{loss:.3f}")
      if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
        rec = {"kind": "eval", "step": self.step,
               "loss": evaluate(self.model, self.eval_batches(), self.cfg.loss_chunk)}
        self._log(rec)
        history.append(rec)
      if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps:
        self._save()
    bar.close()
    self._tb.close()
    plot_curve(self.out / "metrics.jsonl", self.out / "loss.png")
    return history


def plot_curve(metrics: pathlib.Path, png: pathlib.Path) -> None:
  """Train and eval loss vs step, from the JSONL log (so a resumed run plots its whole history)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  rows = [json.loads(line) for line in open(metrics)]
  fig, ax = plt.subplots(figsize=(6, 4))
  for kind in ("train", "eval"):
    pts = sorted({r["step"]: r["loss"] for r in rows if r["kind"] == kind}.items())
    if pts:
      ax.plot(*zip(*pts), label=kind, marker="o" if kind == "eval" else None)
  ax.set_xlabel("step")
  ax.set_ylabel("loss (nats / target token)")
  ax.legend()
  fig.tight_layout()
  fig.savefig(png)
  plt.close(fig)
