"""The DAPO learner against its FLOP floor: model GFLOP/s of `Learner.update` vs the best jitted matmul, one run.

  python -m bench.learner_flops [--rows 4] [--prompt 256] [--completion 256] [--reps 3] [--bf16]

The model is SmolLM2-135M-Instruct's shape (30 layers, d=576, ff=1536, 9/3 heads, vocabulary 49152, tied
embeddings) with random weights: FLOPs and time depend on shapes only. One update of `--rows` rows of
prompt + completion tokens (the completion trained): DAPO loss, AdamW, one mini-batch in micro-batches of 2
rows, scanned layers and query-chunked attention (128), as configs/rl_controller.py trains, with rank-8 LoRA on
every projection (the shipped controller's recipe) and with full fine-tuning. Its FLOPs are model FLOPs
(`m3jax.rl.flops`: useful work, no rematerialisation or padding). The floor is the best rate a jitted float32
`jnp.matmul` reaches on this machine in the same run, over the step's own projection shapes and 2048³. Every
program is timed `--reps` times after a compile, in turn; medians.

`--bf16` adds the LoRA learner with `compute_dtype="bfloat16"` and the same matmuls in bfloat16 (float32
accumulation): whether this CPU's bf16 units (AVX512-BF16, AMX) speed the learner up as they speed up a plain dot.

`lora_dense_logits` is the LoRA learner with `logit_bucket=0` (every sequence chunk holding a trained token through
the vocabulary projection, as before only trained positions were gathered), interleaved with the others:
`gathered_logits_speedup` is its time over the default's. Measured (Intel Xeon, AVX-512/AMX, 2 cores shared, load
3.6-9.2; `--rows 2 --reps 6 --no-full`, twice, and `--reps 3` once): 1.27, 1.16 and 0.97; the median of the 15
interleaved pairs 1.17, the gathered learner faster in 12 of 15 (the dense path computes 512 logit rows of a
256+256 row, ~58-87 GFLOP more than 256 of the update's 562 model GFLOP, i.e. 1.10-1.15x expected).

Final line: RESULT lora_gflop_s=… full_gflop_s=… matmul_gflop_s=… lora_of_floor=… full_of_floor=…
lora_dense_logits_of_floor=… gathered_logits_speedup=…
[lora_bf16_gflop_s=… bf16_speedup=… bf16_matmul_gflop_s=…] rows=… tokens=… cpu=…
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from m3jax.host_memory import retain_freed_memory
from m3jax.models import lora
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.rl.flops import learner_step_flops
from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig
from bench.harness import cpu_model, machine, result_line

SMOLLM2 = DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                        num_kv_heads=3, head_dim=64, rope_theta=100000.0, rms_norm_eps=1e-5, tie_embeddings=True,
                        max_position_embeddings=8192, attention_chunk=128)  # as RLConfig.attention_chunk


def learner_run(rank: int, rows: int, prompt: int, completion: int, compute_dtype: str | None = None,
                logit_bucket: int = LearnerConfig.logit_bucket):
  """(run, model FLOPs of one update) for a LoRA (rank > 0) or full fine-tuning learner; `compute_dtype`
  "bfloat16": activations and matmul inputs in bf16 with f32 parameters, accumulation and log-softmax
  (`LearnerConfig.compute_dtype`). `logit_bucket` 0: every sequence chunk holding a trained token goes through
  the vocabulary projection (the learner before only trained positions did)."""
  model = Decoder(SMOLLM2, rngs=nnx.Rngs(0))
  if rank:
    lora.attach(model, lora.LoRAConfig(rank=rank, alpha=2.0 * rank))
  learner = Learner(model, LearnerConfig(optim=OptimConfig(lr=1e-5), micro_batch=2, layer_loop="scan",
                                         seq_chunk=256, vocab_chunk=8192, compute_dtype=compute_dtype,
                                         logit_bucket=logit_bucket))
  rng = np.random.default_rng(0)
  t = prompt + completion
  mask = np.zeros((rows, t), np.float32)
  mask[:, prompt:] = 1.0
  batch = {"tokens": rng.integers(5, SMOLLM2.vocab_size, (rows, t)).astype(np.int32),
           "lengths": np.full((rows,), t, np.int32), "mask": mask,
           "advantages": (rng.normal(size=(rows, 1)) * mask).astype(np.float32)}
  batch["old_logp"] = learner.logprobs(batch)[0] * mask
  flops = learner_step_flops(SMOLLM2, batch["lengths"], int(mask.sum()), rank,
                             lora.LoRAConfig().targets if rank else ())["total"]
  step = [0]

  def run():
    step[0] += 1
    learner.update(batch, seed=step[0])  # returns host metrics: the step has finished
  return run, flops


def matmul_runs(rows: int, tokens: int, dtype=jnp.float32) -> dict[str, tuple]:
  """Jitted matmuls (`dtype` inputs, float32 results): the update's projection shapes and a large square one."""
  n = rows * tokens
  d, ff = SMOLLM2.hidden_size, SMOLLM2.intermediate_size
  shapes = {"[n,d]x[d,ff]": (n, d, ff), "[n,ff]x[ff,d]": (n, ff, d), "2048^3": (2048, 2048, 2048)}
  out = {}
  for name, (m, k, nn) in shapes.items():
    a = jax.random.normal(jax.random.key(1), (m, k), dtype)
    b = jax.random.normal(jax.random.key(2), (k, nn), dtype)
    f = jax.jit(lambda a, b: jnp.matmul(a, b, preferred_element_type=jnp.float32))
    suffix = "" if dtype == jnp.float32 else f" {jnp.dtype(dtype).name}"
    out[name + suffix] = (lambda f=f, a=a, b=b: jax.block_until_ready(f(a, b)), 2.0 * m * k * nn)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--rows", type=int, default=4)
  ap.add_argument("--prompt", type=int, default=256)
  ap.add_argument("--completion", type=int, default=256)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--no-full", action="store_true", help="skip the full fine-tuning learner (memory, time)")
  ap.add_argument("--bf16", action="store_true", help="also the LoRA learner with compute_dtype=bfloat16 and "
                  "bf16 matmuls (this CPU kind may have AVX512-BF16/AMX)")
  args = ap.parse_args()
  retain_freed_memory()
  print(machine(), flush=True)
  runs = {"lora": learner_run(8, args.rows, args.prompt, args.completion),
          "lora_dense_logits": learner_run(8, args.rows, args.prompt, args.completion, logit_bucket=0),
          **({} if args.no_full else {"full": learner_run(0, args.rows, args.prompt, args.completion)}),
          **matmul_runs(args.rows, args.prompt + args.completion)}
  if args.bf16:
    runs["lora_bf16"] = learner_run(8, args.rows, args.prompt, args.completion, "bfloat16")
    runs.update(matmul_runs(args.rows, args.prompt + args.completion, jnp.bfloat16))
  learners = [k for k in runs if k.startswith(("lora", "full"))]
  for run, _ in runs.values():  # compile
    run()
  times: dict[str, list[float]] = {k: [] for k in runs}
  for _ in range(args.reps):
    for name, (run, _) in runs.items():
      t0 = time.perf_counter()
      run()
      times[name].append(time.perf_counter() - t0)
  rate = {k: runs[k][1] / statistics.median(v) / 1e9 for k, v in times.items()}
  for k, v in times.items():
    print(f"{k:14s} {statistics.median(v) * 1e3:9.1f} ms  {runs[k][1] / 1e9:8.1f} GFLOP  {rate[k]:7.1f} GFLOP/s  "
          f"(all ms: {[round(x * 1e3) for x in v]})", flush=True)
  floor = max(rate[k] for k in runs if k not in learners and "bfloat16" not in k)
  print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
  fields = {"lora_gflop_s": f"{rate['lora']:.1f}", "matmul_gflop_s": f"{floor:.1f}",
            "lora_of_floor": f"{rate['lora'] / floor:.3f}"}
  if not args.no_full:
    fields.update(full_gflop_s=f"{rate['full']:.1f}", full_of_floor=f"{rate['full'] / floor:.3f}")
  fields.update(lora_dense_logits_of_floor=f"{rate['lora_dense_logits'] / floor:.3f}",
                gathered_logits_speedup=f"{rate['lora'] / rate['lora_dense_logits']:.2f}")
  if args.bf16:
    fields.update(lora_bf16_gflop_s=f"{rate['lora_bf16']:.1f}", bf16_speedup=f"{rate['lora_bf16'] / rate['lora']:.2f}",
                  bf16_matmul_gflop_s=f"{max(rate[k] for k in runs if 'bfloat16' in k):.1f}")
  print(result_line(**fields, rows=args.rows, tokens=f"{args.prompt}+{args.completion}",
                    cpu=cpu_model().replace(" ", "_")))


if __name__ == "__main__":
  main()
