"""SFT loop for the Omni thinker or a text decoder (the text memory writer; the batch kind picks the loss,
`loss.batch_loss`): gradient accumulation, orbax checkpoints with exact resume, eval loss, metrics.

Exact resume: batch k of the run is a pure function of (data seed, k) (grain random access, see sft.data), the
optimizer state and step come from the checkpoint, and nothing else is random, so a run killed after a checkpoint
and restarted reproduces the same loss curve.
"""

from __future__ import annotations

import dataclasses
import functools
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
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from m3jax.chunks import ChunkBudget, ChunkConfig, write_atomic
from m3jax.distributed import gather_objects, put_global, replicate_single
from m3jax.models.lora import LoRAParam
from m3jax.models.decoder import Decoder
from m3jax.models.omni.thinker import Thinker
from m3jax.models.omni.chat import Batch
from m3jax.sft.loss import TextBatch, batch_loss


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


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
  sched = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1), max(cfg.steps, 2))
  return optax.chain(optax.clip_by_global_norm(cfg.clip_norm), optax.adamw(sched, weight_decay=cfg.weight_decay))


# The step functions are pure jax.jit functions of the parameter pytree with the module's graphdef as a static
# argument (as in the RL learner), not nnx.jit methods: nnx.jit walks the whole module (and optimizer) graph in
# Python on every call (the tiny CPU thinker's step: 80.2 -> 75.9 ms), and the update donates the old buffers.
@functools.partial(jax.jit, static_argnums=(0, 4))
def _grads(graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State, batch: Batch, chunk: int):
  """(sum of target-token NLL, target-token count, gradient of the sum)."""
  def f(p):
    return batch_loss(nnx.merge(graphdef, p, rest), batch, chunk)
  (total, count), grads = jax.value_and_grad(f, has_aux=True)(params)
  return total, count, grads


@functools.partial(jax.jit, donate_argnums=(0,))
def _accumulate(acc, total, count, grads):
  return jax.tree.map(jnp.add, acc, (total, count, grads))


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(1, 2))
def _apply(cfg: TrainConfig, params: nnx.State, opt_state, grads, count):
  """One AdamW step on the token-mean gradient (the summed gradient over all micro-batches / their token count)."""
  grads = jax.tree.map(lambda g: g / jnp.maximum(count, 1.0), grads)
  updates, opt_state = make_optimizer(cfg).update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


@functools.partial(jax.jit, static_argnums=(0, 4))
def _eval(graphdef: nnx.GraphDef, params: nnx.State, rest: nnx.State, batch: Batch, chunk: int):
  return batch_loss(nnx.merge(graphdef, params, rest), batch, chunk)


def place_batch(batch: Batch | TextBatch, mesh: Mesh | None) -> Batch | TextBatch:
  """The host batch as global arrays on `mesh`: the token rows sharded over data x fsdp (each process feeds
  its own rows with `jax.make_array_from_process_local_data`), the packed media and their plans replicated
  (they are packed across rows). Rows that do not divide over data x fsdp stay replicated. No mesh: as is."""
  if mesh is None:
    return batch
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  split = batch.labels.shape[0] % shards == 0
  rows = NamedSharding(mesh, P(("data", "fsdp")) if split else P())
  if isinstance(batch, TextBatch):
    return TextBatch(*(put_global(x, rows) for x in batch))
  rows3 = NamedSharding(mesh, P(None, ("data", "fsdp")) if split else P())
  rep = NamedSharding(mesh, P())
  inp = batch.inputs
  inputs = inp.replace(input_ids=put_global(inp.input_ids, rows), lengths=put_global(inp.lengths, rows),
                       positions=put_global(inp.positions, rows3), rope_deltas=put_global(inp.rope_deltas, rows),
                       pixel_values=jax.tree.map(lambda x: put_global(x, rep), inp.pixel_values),
                       audio_features=jax.tree.map(lambda x: put_global(x, rep), inp.audio_features),
                       plans=jax.tree.map(lambda x: put_global(x, rep), inp.plans))
  return Batch(inputs, put_global(batch.labels, rows), put_global(batch.weights, rows))


def _mean_nll(graphdef, params, rest, batches: Iterable[Batch], chunk: int, place=lambda b: b) -> float:
  """Mean NLL per target token over all batches."""
  total = count = 0.0
  for b in batches:
    t, c = _eval(graphdef, params, rest, place(b), chunk)
    total, count = total + float(t), count + float(c)
  return total / max(count, 1.0)


class Trainer:
  """`train_batch(k)` gives micro-batch k (deterministic); `eval_batches()` the fixed eval set. The loop holds the
  parameters and optimizer state as pytrees (`params`, `opt_state`); `model` holds the trained ones after `run`."""

  def __init__(self, model: Thinker | Decoder, cfg: TrainConfig, out_dir: str | pathlib.Path,
               train_batch: Callable[[int], Batch], eval_batches: Callable[[], Sequence[Batch]],
               progress: bool = True, mesh: Mesh | None = None, chunk: ChunkConfig = ChunkConfig()):
    self.model, self.cfg, self.mesh, self.chunk = model, cfg, mesh, chunk
    self.out = pathlib.Path(out_dir)
    self.out.mkdir(parents=True, exist_ok=True)
    # with LoRA adapters on the language model only they are trained, checkpointed and hold optimizer state
    lora = bool(jax.tree.leaves(nnx.state(model, LoRAParam)))
    self.graphdef, self.params, self.rest = nnx.split(model, LoRAParam if lora else nnx.Param, ...)
    if mesh is not None:  # replicated parameters (data parallel); the batch rows are sharded (place_batch)
      rep = NamedSharding(mesh, P())
      self.params, self.rest = jax.tree.map(lambda x: put_global(x, rep), (self.params, self.rest))
    self.lead = jax.process_index() == 0  # the one process that writes logs and plots
    self.opt_state = make_optimizer(cfg).init(self.params)
    if mesh is not None:  # the step counts too, so a restored state is placed as a fresh one
      self.opt_state = replicate_single(self.opt_state, mesh)
    self.train_batch, self.eval_batches = train_batch, eval_batches
    self.progress = progress
    self.step = 0
    self._tb = None
    self.ckpt = ocp.CheckpointManager(
        (self.out / "checkpoints").absolute(),
        options=ocp.CheckpointManagerOptions(max_to_keep=cfg.keep_checkpoints, create=True,
                                             cleanup_tmp_directories=True))
    self._restore()

  def _restore(self) -> None:
    last = self.ckpt.latest_step()
    self._truncate_log(-1 if last is None else int(last))
    if last is None:
      return
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, self._state())
    restored = self.ckpt.restore(last, args=ocp.args.StandardRestore(abstract))
    self.params, self.opt_state = restored["model"], restored["opt"]
    nnx.update(self.model, self.params)
    self.step = int(last)

  def _truncate_log(self, step: int) -> None:
    """Drops the log's records after `step` (the checkpoint resumed from; -1: a fresh run), so a chunk killed
    after its checkpoint does not leave those steps twice in the curve; a line a kill cut short goes too."""
    path = self.out / "metrics.jsonl"
    if not (self.lead and path.exists()):
      return
    kept = []
    for line in path.read_text().splitlines():
      try:
        if json.loads(line)["step"] <= step:
          kept.append(line + "\n")
      except (ValueError, KeyError):
        pass
    write_atomic(path, "".join(kept))

  def _eval_loss(self) -> float:
    return _mean_nll(self.graphdef, self.params, self.rest, self.eval_batches(), self.cfg.loss_chunk,
                     lambda b: place_batch(b, self.mesh))

  def _state(self) -> dict:
    return {"model": self.params, "opt": self.opt_state}

  def _save(self) -> None:
    self.ckpt.save(self.step, args=ocp.args.StandardSave(self._state()))
    self.ckpt.wait_until_finished()

  def _log(self, record: dict) -> None:
    if not self.lead:
      return
    with open(self.out / "metrics.jsonl", "a") as fh:
      fh.write(json.dumps(record) + "\n")
    if self._tb is not None:
      for k, v in record.items():
        if k not in ("step", "kind") and isinstance(v, (int, float)):
          self._tb.add_scalar(f"{record['kind']}/{k}", v, record["step"])

  def _train_step(self) -> dict:
    """One optimizer step over `accum` micro-batches; advances `step` and returns its train record."""
    t0 = time.perf_counter()
    acc, tokens = None, 0
    for k in range(self.cfg.accum):
      batch = self.train_batch(self.step * self.cfg.accum + k)
      out = _grads(self.graphdef, self.params, self.rest, place_batch(batch, self.mesh), self.cfg.loss_chunk)
      acc = out if acc is None else _accumulate(acc, *out)
      tokens += int(np.sum(batch.lengths if isinstance(batch, TextBatch) else batch.inputs.lengths))
    total, count, grads = acc
    self.params, self.opt_state = _apply(self.cfg, self.params, self.opt_state, grads, count)
    loss = float(total) / max(float(count), 1.0)
    self.step += 1
    dt = time.perf_counter() - t0
    return {"kind": "train", "step": self.step, "loss": loss, "tokens_per_s": tokens / dt, "seconds": dt}

  def run(self, kill_after: int | None = None) -> list[dict]:
    """Trains to cfg.steps (from the restored step), or until the chunk's budget (`chunk`, m3jax.chunks) is
    spent, saving the step reached. `kill_after`: stop after that many steps without that last save (a killed
    run, for resume tests)."""
    from tensorboardX import SummaryWriter
    from tqdm import tqdm
    budget = ChunkBudget(self.chunk)
    self.start_step = self.step
    self._tb = SummaryWriter(str(self.out / "tensorboard"), purge_step=self.step + 1 if self.step else None) \
        if self.lead else None
    history: list[dict] = []
    if self.step == 0:
      rec = {"kind": "eval", "step": 0, "loss": self._eval_loss()}
      self._log(rec)
      history.append(rec)
    bar = tqdm(total=self.cfg.steps, initial=self.step, disable=not (self.progress and self.lead), desc="sft")
    done, saved = 0, self.step
    try:  # the step donates the parameter buffers; the module gets the live ones back however the loop ends
      while self.step < self.cfg.steps and (kill_after is None or done < kill_after):
        if bool(gather_objects(budget.exhausted())[0]):  # process 0's clock decides for every process
          break
        rec = self._train_step()
        done += 1
        self._log(rec)
        history.append(rec)
        bar.update(1)
        bar.set_postfix(loss=f"{rec['loss']:.3f}")
        if self.step % self.cfg.eval_every == 0 or self.step == self.cfg.steps:
          rec = {"kind": "eval", "step": self.step, "loss": self._eval_loss()}
          self._log(rec)
          history.append(rec)
        budget.step_done()
        if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps:
          self._save()
          saved = self.step
      if self.step != saved and kill_after is None:  # the chunk's end: the state the next one continues from
        self._save()
    finally:
      nnx.update(self.model, self.params)
    bar.close()
    if self.lead:
      self._tb.close()
      plot_curve(self.out / "metrics.jsonl", self.out / "loss.png")
      if kill_after is None and not self.finished:  # a chunk's end: a commit of out_dir carries the newest one
        for step in sorted(self.ckpt.all_steps())[:-1]:
          self.ckpt.delete(step)
    return history

  @property
  def finished(self) -> bool:
    return self.step >= self.cfg.steps

  def summary(self) -> dict:
    """Where the run stands after `run` (m3jax.chunks)."""
    return {"start_step": getattr(self, "start_step", self.step), "step": self.step, "steps": self.cfg.steps,
            "finished": self.finished}


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
