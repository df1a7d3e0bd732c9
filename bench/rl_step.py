"""DAPO train-step throughput: m3jax `Learner.update` vs google-tunix 0.1.7's DAPO policy loss in a jitted step.

  python -m bench.rl_step [--size small|tiny] [--seqs 16] [--prompt 32] [--completion 32] [--reps 8]

Same Qwen3-shaped model (qk-norm, GQA, tied embeddings), same batch, lengths, loss (clip-higher 0.2/0.28,
token-mean, no KL), optimizer (AdamW) and one optimizer step per call on both sides. tunix is driven by its own
registered DAPO/GRPO loss (`function_registry.get_policy_loss_fn("grpo")`, the loss its DAPOLearner uses) from an
`nnx.jit` step, which its CPU notes call the fairest train-step comparison. m3jax's step also does global-norm
clipping and the non-finite check. Both steps alternate (noise on a shared CPU hits both alike); the median
over `--reps` is reported after two warm-up calls each. Tokens/s counts padded tokens N·(P+C) (rows are full).
google-tunix is not an m3jax dependency: `bench/setup` installs it (pinned) into bench/.venv-bench, so run this as
`bench/.venv-bench/bin/python -m bench.rl_step`; without it the script says so in one line.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from m3jax.host_memory import retain_freed_memory
from bench.harness import machine, require, result_line

SIZES = {  # tunix's CPU-notes configurations
    "tiny": dict(num_layers=2, embed=128, hidden=256, heads=4, head_dim=32, kv_heads=2, vocab=512),
    "small": dict(num_layers=4, embed=256, hidden=1024, heads=4, head_dim=64, kv_heads=2, vocab=512),
}


def tunix_step_fn(size: dict, lr: float, n: int, p: int, c: int, seed: int):
  from jax.sharding import AxisType
  from tunix.models.qwen3 import model as q3
  from tunix.rl import common, function_registry
  from tunix.rl.grpo import dapo_learner

  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
  cfg = q3.ModelConfig(num_layers=size["num_layers"], vocab_size=size["vocab"], embed_dim=size["embed"],
                       hidden_dim=size["hidden"], num_heads=size["heads"], head_dim=size["head_dim"],
                       num_kv_heads=size["kv_heads"], rope_theta=1_000_000, norm_eps=1e-6, use_tied_embedding=True)
  with jax.set_mesh(mesh):
    model = q3.Qwen3(cfg, rngs=nnx.Rngs(seed))
  opt = nnx.Optimizer(model, optax.adamw(lr), wrt=nnx.Param)
  algo = dapo_learner.DAPOConfig(num_generations=2, num_iterations=1, overlong_buffer=None)
  algo.beta = 0.0  # tunix 0.1.7 bug workaround (DAPO asks for a reference model otherwise)
  algo.temperature = 1.0
  loss_fn = function_registry.get_policy_loss_fn("grpo")
  rng = np.random.default_rng(seed)
  ex = common.TrainExample(
      prompt_ids=jnp.asarray(rng.integers(5, size["vocab"], (n, p)), jnp.int32), prompt_mask=jnp.ones((n, p), bool),
      completion_ids=jnp.asarray(rng.integers(5, size["vocab"], (n, c)), jnp.int32),
      completion_mask=jnp.ones((n, c), jnp.int32), advantages=jnp.asarray(rng.normal(size=n), jnp.float32),
      ref_per_token_logps=None, old_per_token_logps=None)

  @nnx.jit
  def step(model, opt, ex):
    (loss, aux), g = nnx.value_and_grad(lambda m: loss_fn(m, ex, algo, 0, 2), has_aux=True)(model)
    opt.update(model, g)
    return loss

  def run():
    jax.block_until_ready(step(model, opt, ex))
  return run


def m3jax_step_fn(size: dict, lr: float, n: int, p: int, c: int, seed: int):
  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig

  dcfg = DecoderConfig(vocab_size=size["vocab"], hidden_size=size["embed"], intermediate_size=size["hidden"],
                       num_layers=size["num_layers"], num_heads=size["heads"], num_kv_heads=size["kv_heads"],
                       head_dim=size["head_dim"], rope_theta=1_000_000, qk_norm=True, tie_embeddings=True,
                       model_type="qwen3")
  model = Decoder(dcfg, rngs=nnx.Rngs(seed))
  learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=lr, weight_decay=1e-4), seq_chunk=p + c,
                                         vocab_chunk=size["vocab"]))
  rng = np.random.default_rng(seed)
  t = p + c
  tokens = np.concatenate([rng.integers(5, size["vocab"], (n, p)), rng.integers(5, size["vocab"], (n, c))], 1)
  mask = np.zeros((n, t), np.float32)
  mask[:, p:] = 1.0
  batch = {"tokens": tokens.astype(np.int32), "lengths": np.full((n,), t, np.int32), "mask": mask,
           "advantages": (rng.normal(size=(n, 1)) * mask).astype(np.float32)}
  batch["old_logp"] = learner.logprobs(batch)[0] * mask
  state = {"k": 0}

  def run():
    state["k"] += 1
    learner.update(batch, seed=state["k"])  # returns host metrics: the step has finished
  return run


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--size", default="small", choices=sorted(SIZES))
  ap.add_argument("--seqs", type=int, default=16)
  ap.add_argument("--prompt", type=int, default=32)
  ap.add_argument("--completion", type=int, default=32)
  ap.add_argument("--reps", type=int, default=8)
  args = ap.parse_args()
  require({"tunix": "google-tunix"})  # the competitor's packages (bench/setup)
  print(machine(), flush=True)
  retain_freed_memory()  # process-wide: tunix (also XLA:CPU) runs under it too
  size, n, p, c = SIZES[args.size], args.seqs, args.prompt, args.completion
  runs = {"tunix": tunix_step_fn(size, 1e-5, n, p, c, 0), "m3jax": m3jax_step_fn(size, 1e-5, n, p, c, 0)}
  for run in runs.values():  # compile + one warm step
    run()
    run()
  times: dict[str, list[float]] = {k: [] for k in runs}
  for _ in range(args.reps):
    for name, run in runs.items():
      t0 = time.perf_counter()
      run()
      times[name].append(time.perf_counter() - t0)
  tokens = n * (p + c)
  med = {k: statistics.median(v) for k, v in times.items()}
  for k, v in med.items():
    print(f"{k:6s} step {v * 1e3:8.1f} ms  {tokens / v:10.0f} tok/s  (all: {[round(x * 1e3) for x in times[k]]})")
  print(result_line(rl_step_ratio=f"{med['tunix'] / med['m3jax']:.3f}", m3jax_tok_s=f"{tokens / med['m3jax']:.0f}",
                    tunix_tok_s=f"{tokens / med['tunix']:.0f}", size=args.size, seqs=n, len=f"{p}+{c}"))


if __name__ == "__main__":
  main()
