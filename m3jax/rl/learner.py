"""The DAPO learner: optax AdamW on a Decoder, sharded, with whole-batch token-mean gradient accumulation.

One rollout batch of N trajectories is trained for `epochs` passes of `mini_batches` optimizer steps each (so
the importance ratio moves away from 1 and the clip bounds can bind, unlike the reference's single step on the
data its old log-probs came from, §5.10). A mini-batch is laid out on the host as `[A, M, T]` (A accumulation
steps of M sequences, M sharded over `data`×`fsdp`); the mini-batch's loss denominator is computed first, then
a jitted step `lax.scan`s over the A micro-batches summing `objective / denominator` gradients, so the result is
the exact gradient of the whole-mini-batch token mean; a second jitted step clips and applies it. A step whose
gradients are not finite is skipped (optax.apply_if_finite) and counted.
With `length_bucket > 0` the rows of a mini-batch are sorted by length and every micro-batch is cut to its own
longest row, rounded up to a multiple of `length_bucket`: the micro-batches run one by one (one compilation per
length bucket) and their gradient sums are added. The denominator is still the whole mini-batch's, so the
objective is unchanged; only rows of the trajectories' padding are no longer computed (rows of 300 and 1100
tokens no longer both cost 1100). Sorting needs the whole global batch on every process, which `update`
requires anyway.
With `share_prefix = R` as well, the rows are instead sorted by their tokens and cut into calls of R rows, and the
prefix the R rows have in common (cut down to a multiple of `length_bucket`) runs once: its keys and values are
broadcast to the R rows, whose own remainders attend to them (`_shared_hidden`). WHY: the G trajectories of an RL
group share their prompt and, while the policy is nearly deterministic, often their first search and its tool
result too, so a group computed row by row repeats most of its work G times. Autodiff through the broadcast sums
the rows' gradients into the shared prefix, so the gradient is the same sum.
The parameter arrays live in the Decoder passed in: after each
update they are written back into it with `nnx.update`, so the sampler decodes with them without a copy
(the step donates the old arrays: build the Sampler after an update, as `m3jax.rl.program` does per rollout).
With LoRA adapters attached to the Decoder (`m3jax.models.lora`), only the adapters are differentiated and hold
AdamW state, the frozen base rides along as a constant, and the reference policy of the KL term is the same
model with zero adapters (no second copy of the weights).
The forward pass is `Decoder.hidden` with unrolled layers (`layer_loop`) and optional per-layer remat and the log-probs
come from `m3jax.rl.logprobs` in sequence × vocabulary chunks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from m3jax import parallel
from m3jax.distributed import put_global, replicate_single, to_host
from m3jax.models.decoder import Decoder
from m3jax.models.lora import LoRAParam
from m3jax.rl import logprobs as lp_lib
from m3jax.rl import losses
from m3jax.rl.rollout import bucket_length

Batch = dict[str, np.ndarray]


class LearnerConfigError(ValueError):
  """Inconsistent learner settings or batch shapes."""


@dataclasses.dataclass(frozen=True)
class OptimConfig:
  """AdamW + global-norm clipping; the reference's values are lr 1e-6 constant, wd 0.01, clip 1.0."""

  lr: float = 1e-6
  schedule: Literal["constant", "cosine", "linear"] = "constant"
  warmup_steps: int = 0
  total_steps: int = 1000  # decay horizon of the cosine / linear schedules
  b1: float = 0.9
  b2: float = 0.999
  weight_decay: float = 0.01
  grad_clip: float = 1.0

  def __post_init__(self):
    if self.lr <= 0 or self.total_steps < 1 or self.warmup_steps < 0 or self.grad_clip <= 0:
      raise LearnerConfigError("lr, total_steps, grad_clip must be positive and warmup_steps >= 0")


@dataclasses.dataclass(frozen=True)
class LearnerConfig:
  loss: losses.LossConfig = losses.LossConfig()
  optim: OptimConfig = OptimConfig()
  temperature: float = 1.0  # logits are divided by it for every log-prob (the reference: rollout T = 0.6)
  epochs: int = 1
  mini_batches: int = 1  # optimizer steps per epoch
  micro_batch: int = 0  # sequences per accumulation step; 0 = the whole mini-batch in one step
  # > 0: micro-batches of rows of similar length, each padded only to a multiple of this (module docstring)
  length_bucket: int = 0
  # > 0: calls of this many rows, sorted by their tokens, computing the rows' common prefix once (module
  # docstring); needs length_bucket, to which the prefix is cut down and the rest rounded up. A mesh that shards
  # rows (data x fsdp > 1) runs the plain micro-batches instead
  share_prefix: int = 0
  seq_chunk: int = 256
  vocab_chunk: int = 8192
  # > 0: only trained (mask = 1) positions go through the vocabulary projection, gathered per row into a width
  # rounded up to a multiple of this (`logprobs.gathered_logprobs`; one compilation per width); 0: every
  # sequence chunk holding a trained token. A 256+256-token SmolLM2 row computes 256 instead of 512 positions'
  # logits; a multi-turn trajectory's ~200 completion tokens instead of its ~1000-1500
  logit_bucket: int = 256
  layer_loop: Literal["unroll", "scan"] = "unroll"  # "scan" compiles once for very deep models
  remat: bool = False  # rematerialise each layer in the backward pass (activation memory of one layer)
  # the decoder's activations and matmul inputs in the learner (DecoderConfig.compute_dtype); None: the model's
  # own. "bfloat16" keeps params and optimizer state, matmul accumulation, norms, softmaxes, the LM head and
  # the log-softmax in float32
  compute_dtype: Literal["float32", "bfloat16"] | None = None

  def __post_init__(self):
    if self.layer_loop not in ("unroll", "scan"):
      raise LearnerConfigError(f"layer_loop={self.layer_loop!r}; expected 'unroll' or 'scan'")
    if self.compute_dtype not in (None, "float32", "bfloat16"):
      raise LearnerConfigError(f"compute_dtype={self.compute_dtype!r}; expected 'float32' or 'bfloat16'")
    if (self.epochs < 1 or self.mini_batches < 1 or self.micro_batch < 0 or self.length_bucket < 0
        or self.logit_bucket < 0 or self.temperature <= 0 or self.share_prefix < 0):
      raise LearnerConfigError("epochs and mini_batches must be >= 1, micro_batch, length_bucket and "
                               "logit_bucket >= 0, "
                               "temperature > 0")
    if self.share_prefix and not self.length_bucket:
      raise LearnerConfigError("share_prefix needs length_bucket > 0 (the prefix is cut to a multiple of it)")


def make_optimizer(cfg: OptimConfig) -> optax.GradientTransformation:
  if cfg.schedule == "constant":
    decay = optax.constant_schedule(cfg.lr)
  elif cfg.schedule == "cosine":
    decay = optax.cosine_decay_schedule(cfg.lr, max(cfg.total_steps - cfg.warmup_steps, 1))
  else:
    decay = optax.linear_schedule(cfg.lr, 0.0, max(cfg.total_steps - cfg.warmup_steps, 1))
  sched = decay if not cfg.warmup_steps else optax.join_schedules(
      [optax.linear_schedule(0.0, cfg.lr, cfg.warmup_steps), decay], [cfg.warmup_steps])
  inner = optax.chain(optax.clip_by_global_norm(cfg.grad_clip),
                      optax.adamw(sched, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay))
  return optax.apply_if_finite(inner, max_consecutive_errors=2**30)


class Learner:
  """Owns the optimizer state; trains the parameters of `model` in place."""

  def __init__(self, model: Decoder, cfg: LearnerConfig, *, mesh: Mesh | None = None,
               ref_model: Decoder | None = None):
    self.cfg, self.mesh, self.model = cfg, mesh, model
    lora = getattr(model, "lora", None) is not None
    if lora and ref_model is not None:
      raise LearnerConfigError("with LoRA adapters the frozen base is the reference policy: pass no ref_model")
    if cfg.loss.kl_coef > 0 and ref_model is None and not lora:
      raise LearnerConfigError("loss.kl_coef > 0 needs a frozen ref_model")
    # with adapters only they are trained (and hold optimizer state); the frozen base rides in `rest`
    self.graphdef, params, rest = nnx.split(model, LoRAParam if lora else nnx.Param, ...)
    self.rest = self._shard(rest)
    self.params = self._shard(params)
    if lora:  # zero adapters add an exact 0: the base model's log-probs, with no second copy of it
      self.ref_params = jax.tree.map(jnp.zeros_like, self.params)
    else:
      self.ref_params = None if ref_model is None else self._shard(nnx.state(ref_model, nnx.Param))
    self.opt_state = self._place_opt(_init_opt(cfg.optim, self.params))
    self.step = 0
    nnx.update(self.model, self.params)

  # ------------------------------------------------------------------------------------------- public API
  def logprobs(self, batch: Batch, *, reference: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-token (log-prob, entropy) [N, T] of `batch["tokens"]` under the current (or reference) policy.

    With `batch["mask"]`, only values at masked positions are meaningful (unused chunks are skipped); with
    `length_bucket`, positions past a row's micro-batch width are 0."""
    params = self.ref_params if reference else self.params
    if params is None:
      raise LearnerConfigError("no reference model was given")
    n, t = batch["tokens"].shape
    rows = {"tokens": batch["tokens"], "lengths": batch["lengths"],
            "mask": batch.get("mask", np.ones((n, t), np.float32))}
    out = np.zeros((n, t), np.float32), np.zeros((n, t), np.float32)
    for idx, width, prefix in self._calls(rows, np.arange(n), with_mask="mask" in batch):
      x = self._slice(rows, idx, width)
      logp, ent = _logprobs_fn(self.graphdef, self.cfg, prefix, self.rest, params, x["tokens"], x["lengths"],
                               x["mask"], x.get("positions"))
      out[0][idx, :width], out[1][idx, :width] = to_host(logp), to_host(ent)
    return out

  def update(self, batch: Batch, seed: int) -> list[dict[str, float]]:
    """Trains on one rollout batch (needs tokens, lengths, mask, advantages, old_logp[, ref_logp]).

    Returns one metrics dict per optimizer step. Rows are shuffled per epoch with `seed` (deterministic).
    """
    n = self._check(batch)
    size = n // self.cfg.mini_batches
    rng = np.random.default_rng(seed)
    history = []
    for _ in range(self.cfg.epochs):
      perm = rng.permutation(n)
      for k in range(self.cfg.mini_batches):
        rows = perm[k * size:(k + 1) * size]
        # the whole mini-batch's denominator, before it is cut into micro-batches (a host scalar: one program
        # for every mini-batch, and valid input on every process of a multi-process mesh)
        denom = np.float32(losses.denominator(batch["mask"][rows], self.cfg.loss.agg_mode))
        acc = None
        for idx, width, prefix in self._calls(batch, rows):
          part = _grad_sums(self.graphdef, self.cfg, prefix, self.rest, self.params, self._slice(batch, idx, width),
                            denom)
          acc = part if acc is None else _add(acc, part)
        self.params, self.opt_state, metrics = _apply(self.cfg.optim, self.params, self.opt_state, *acc, denom)
        self.step += 1
        history.append({k: float(v) for k, v in jax.device_get(metrics).items()})
    nnx.update(self.model, self.params)
    return history

  @property
  def skipped_steps(self) -> int:
    return int(self.opt_state.total_notfinite)

  def state(self) -> dict[str, Any]:
    """Everything an exact resume needs from the learner (see m3jax.checkpoint); with LoRA the params are the
    adapters alone (the base is reloaded, frozen)."""
    return {"params": self.params, "opt_state": self.opt_state, "step": self.step}

  def restore(self, state: dict[str, Any]) -> None:
    self.params = self._shard(state["params"])
    self.opt_state = state["opt_state"]
    self.step = int(state["step"])
    nnx.update(self.model, self.params)

  # ------------------------------------------------------------------------------------------- internals
  def _micro(self, n: int) -> int:
    """Number of accumulation steps for a set of n rows."""
    m = self.cfg.micro_batch or n
    if n % m:
      raise LearnerConfigError(f"{n} rows do not split into micro-batches of {m}")
    shards = 1 if self.mesh is None else self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    if m % shards:
      raise LearnerConfigError(f"micro-batch of {m} rows does not split over {shards} data×fsdp devices")
    return n // m

  def _micro_batches(self, lengths: np.ndarray, rows: np.ndarray, width: int,
                     mask: np.ndarray | None = None) -> list[tuple[np.ndarray, int]]:
    """(row indices [A, M], width) per jitted call: all A micro-batches at the batch's width at once, or with
    `length_bucket` one micro-batch per call, rows sorted by length, each cut to its own length bucket; there a
    micro-batch with no trained position in `mask` is left out."""
    a = self._micro(len(rows))
    if not self.cfg.length_bucket:  # strided, so the contiguous M-shards of every micro-batch stay on their devices
      return [(rows.reshape(len(rows) // a, a).T, width)]
    by_length = rows[np.argsort(lengths[rows], kind="stable")].reshape(a, -1)
    # a micro-batch of padding rows only (a rollout batch keeps its shape when dynamic sampling keeps fewer
    # groups) adds exact zeros to the gradient sums and has no log-prob anyone reads: it is not run, unless nothing
    # else is
    real = [r for r in by_length if mask is None or mask[r].any()] or list(by_length[:1])
    return [(r[None], bucket_length(int(lengths[r].max()), self.cfg.length_bucket, width)) for r in real]

  def _calls(self, batch: Batch, rows: np.ndarray, with_mask: bool = True) -> list[tuple[np.ndarray, int, int]]:
    """(row indices [A, M], width, shared prefix length) per jitted call over `rows` of `batch`: the micro-batches
    of `_micro_batches` (prefix 0), or with `share_prefix` those of `_shared_calls`, unless the mesh shards rows
    (a call's prefix runs on one row, which data/fsdp sharding cannot split)."""
    mask = batch["mask"] if with_mask else None
    sharded = self.mesh is not None and self.mesh.shape["data"] * self.mesh.shape["fsdp"] > 1
    if self.cfg.share_prefix and not sharded:
      return self._shared_calls(batch["tokens"], batch["lengths"], rows, mask)
    return [(idx, width, 0) for idx, width in
            self._micro_batches(batch["lengths"], rows, batch["tokens"].shape[1], mask)]

  def _shared_calls(self, tokens: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
                    mask: np.ndarray | None = None) -> list[tuple[np.ndarray, int, int]]:
    """`rows` sorted by their tokens (rows with a common prefix side by side) and cut into calls of `share_prefix`
    rows: each call's shared prefix is the rows' longest common prefix, short of their shortest row's last token,
    cut down to a multiple of `length_bucket`, and its width the prefix plus the longest remainder rounded up to
    one. A call with no trained position in `mask` is left out, unless nothing else is."""
    r, bucket, t = self.cfg.share_prefix, self.cfg.length_bucket, tokens.shape[1]
    if len(rows) % r:
      raise LearnerConfigError(f"{len(rows)} rows do not split into calls of share_prefix={r} rows")
    ordered = rows[np.lexsort(tokens[rows].T[::-1])]  # lexicographic: column 0 is the primary key
    calls = []
    for idx in ordered.reshape(-1, r):
      if mask is not None and not mask[idx].any():
        continue
      n = int(lengths[idx].min())
      same = (tokens[idx, :n] == tokens[idx[:1], :n]).all(axis=0)
      common = n if same.all() else int(np.argmin(same))
      prefix = min(common, n - 1) // bucket * bucket
      calls.append((idx[None], prefix + bucket_length(int(lengths[idx].max()) - prefix, bucket, t - prefix),
                    prefix))
    return calls or [(ordered[:r][None], bucket_length(int(lengths[ordered[:r]].max()), bucket, t), 0)]

  def _slice(self, batch: Batch, idx: np.ndarray, width: int) -> dict[str, jax.Array]:
    """The rows `idx` ([A, M]) of every batch array, cut to `width` positions, placed as `_put` places them;
    with `logit_bucket`, plus the rows' trained `positions` [A, M, K] (`logprobs.trained_positions`)."""
    out = {k: self._put(v[idx] if v.ndim == 1 else v[idx, :width]) for k, v in batch.items()}
    positions = (lp_lib.trained_positions(batch["mask"][idx, :width], self.cfg.logit_bucket)
                 if self.cfg.logit_bucket else None)
    if positions is not None:
      out["positions"] = self._put(positions)
    return out

  def _shard(self, params: nnx.State) -> nnx.State:
    """Places every parameter on the mesh by its `logical` axis names (no-op without a mesh)."""
    if self.mesh is None:  # committed to one device, so restored and fresh arrays hit the same compilation
      return jax.device_put(params, jax.devices()[0])

    def place(v: nnx.Variable) -> nnx.Variable:  # global (multi-process) arrays; state without axis names replicated
      names = v.get_metadata().get("logical")
      sharding = (parallel.replicated(self.mesh) if names is None
                  else parallel.named_sharding(self.mesh, names, v.get_value().shape))
      return v.replace(put_global(v.get_value(), sharding))

    return jax.tree.map(place, params, is_leaf=lambda x: isinstance(x, nnx.Variable))

  def _place_opt(self, opt_state):
    """The optimizer state committed where the parameters live: `_init_opt` returns the step and skip counts
    uncommitted on one device, and jit keys its cache on commitment (the second update would compile again);
    on a mesh see `replicate_single`."""
    if self.mesh is None:
      return jax.device_put(opt_state, jax.devices()[0])
    return replicate_single(opt_state, self.mesh)

  def _put(self, x: np.ndarray) -> jax.Array:
    """[A, M, ...] host rows -> a global array, M sharded over data×fsdp; each process feeds only its rows."""
    if self.mesh is None:
      return jax.device_put(x, jax.devices()[0])
    spec = P(None, ("data", "fsdp"), *([None] * (x.ndim - 2)))
    return put_global(x, NamedSharding(self.mesh, spec))

  def _check(self, batch: Batch) -> int:
    needed = {"tokens", "lengths", "mask", "advantages", "old_logp"} | (
        {"ref_logp"} if self.cfg.loss.kl_coef > 0 else set())
    missing = needed - set(batch)
    if missing:
      raise LearnerConfigError(f"batch lacks {sorted(missing)}")
    n, t = batch["tokens"].shape
    for k in needed - {"tokens", "lengths"}:
      if batch[k].shape != (n, t):
        raise LearnerConfigError(f"batch[{k!r}] has shape {batch[k].shape}, expected {(n, t)}")
    if (batch["mask"][np.arange(t)[None, :] >= batch["lengths"][:, None]] != 0).any():
      raise LearnerConfigError("batch['mask'] marks positions at or past a row's length")
    if n % self.cfg.mini_batches:
      raise LearnerConfigError(f"{n} rows do not split into {self.cfg.mini_batches} mini-batches")
    self._micro(n // self.cfg.mini_batches)
    return n



# The jitted functions are module-level with (graphdef, config) static, so every Learner of the same
# architecture and settings shares one compilation (tests, resumes and benchmarks build several).
def _forward(graphdef, cfg: LearnerConfig, prefix: int, rest, params, tokens, lengths, mask, positions=None):
  model = nnx.merge(graphdef, params, rest)
  if cfg.compute_dtype is not None:  # a traced copy: the caller's model keeps its own policy
    model.cfg = dataclasses.replace(model.cfg, compute_dtype=cfg.compute_dtype)
  if prefix:
    h = _shared_hidden(model, cfg, tokens, lengths, prefix)
  else:
    h, _ = model.hidden(tokens, chunk_len=lengths, layer_loop=cfg.layer_loop, remat=cfg.remat)
  if cfg.compute_dtype is not None:  # the LM head in float32 too, as the log-softmax always is
    h = h.astype(jnp.float32)
  kw = dict(temperature=cfg.temperature, seq_chunk=cfg.seq_chunk, vocab_chunk=cfg.vocab_chunk)
  if positions is not None:
    return lp_lib.gathered_logprobs(h, model.lm_head_weight(), tokens, positions, **kw)
  return lp_lib.sequence_logprobs(h, model.lm_head_weight(), tokens, mask, **kw)


def _shared_hidden(model: Decoder, cfg: LearnerConfig, tokens: jax.Array, lengths: jax.Array,
                   prefix: int) -> jax.Array:
  """`model.hidden(tokens, chunk_len=lengths)` [M, T, D] for rows whose first `prefix` tokens are the same: the
  prefix runs on row 0 alone, returning every layer's keys and values, which are broadcast to the M rows; the
  rows' remaining tokens run on top of them (`Decoder.hidden`'s `return_kv` / `prefix_kv`)."""
  m = tokens.shape[0]
  kw = dict(layer_loop=cfg.layer_loop, remat=cfg.remat)
  head, (k, v) = model.hidden(tokens[:1, :prefix], return_kv=True, **kw)
  rows = lambda x, axis: jnp.broadcast_to(x, (*x.shape[:axis], m, *x.shape[axis + 1:]))
  tail, _ = model.hidden(tokens[:, prefix:], chunk_len=lengths - prefix, prefix_kv=(rows(k, 1), rows(v, 1)), **kw)
  return jnp.concatenate([rows(head, 0), tail], axis=1)


@functools.partial(jax.jit, static_argnums=0)
def _init_opt(cfg: OptimConfig, params):
  return make_optimizer(cfg).init(params)


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _logprobs_fn(graphdef, cfg: LearnerConfig, prefix: int, rest, params, tokens, lengths, mask, positions=None):
  return jax.lax.map(lambda xs: _forward(graphdef, cfg, prefix, rest, params, *xs),
                     (tokens, lengths, mask, positions))


@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def _grad_sums(graphdef, cfg: LearnerConfig, prefix: int, rest, params, mb, denom):
  """Over the [A, M, T] micro-batches of `mb`: the summed gradients of objective / denom (the whole
  mini-batch's denominator) and the summed metric numerators."""
  lcfg = cfg.loss

  def micro_loss(p, x):
    logp, ent = _forward(graphdef, cfg, prefix, rest, p, x["tokens"], x["lengths"], x["mask"], x.get("positions"))
    sums = losses.loss_sums(logp, x["old_logp"], x["advantages"], x["mask"], lcfg,
                            ref_logp=x.get("ref_logp"), entropy=ent)
    return sums["objective"] / jnp.maximum(denom, 1e-8), sums

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

  def body(acc, x):
    (_, sums), g = grad_fn(params, x)
    return jax.tree.map(jnp.add, acc, (g, sums)), None

  zero_sums = jax.eval_shape(lambda: micro_loss(params, jax.tree.map(lambda v: v[0], mb))[1])
  init = (jax.tree.map(jnp.zeros_like, params), jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), zero_sums))
  (grads, sums), _ = jax.lax.scan(body, init, mb)
  return grads, sums


_add = jax.jit(lambda acc, part: jax.tree.map(jnp.add, acc, part), donate_argnums=0)


@functools.partial(jax.jit, static_argnums=0, donate_argnums=(1, 2))
def _apply(cfg: OptimConfig, params, opt_state, grads, sums, denom):
  updates, new_opt = make_optimizer(cfg).update(grads, opt_state, params)
  new_params = optax.apply_updates(params, updates)
  metrics = losses.finalize_metrics(sums, denom)
  metrics["grad_norm"] = optax.tree.norm(grads)
  metrics["skipped"] = 1.0 - new_opt.last_finite.astype(jnp.float32)
  return new_params, new_opt, metrics
