"""Decode/prefill throughput: m3jax sampler vs transformers `generate`, SmolLM2-135M-Instruct, float32, CPU.

  python -m bench.decode [--threads 2] [--prompt 128] [--new 128] [--long-bucket 4096] [--long-filled 256]

Same weights (the shipped GGUF, dequantised by each library), same thread count, greedy, no early stop. Also
measures, in the same run, the machine's floors for this model:
* the weight-matmul floor: one jitted step made of the weight matmuls alone (no attention, no cache, no sampling)
  at batch 8, over per-layer arrays, the faster of separate and fused q/k/v and gate/up matmuls
  (`step_over_matmul_floor_b8`);
* the weight-read floor at batch 1: the fastest of a jitted reduction over every weight byte a step reads and the
  batch-1 matmul step (a matvec per weight), since a batch-1 step cannot run faster than it reads its weights
  (`step_over_bandwidth_floor_b1`);
and a long-context row: the batch-8 decode step with `--long-filled` tokens in a `--long-bucket`-slot cache against
the same fill in the smallest bucket that holds it (`long_over_short`; the decode reads only the window it fills),
and the batch-1 step with the layer scan over stacked weights that the decode used before `Sampler(split_layers)`
(`split_over_scan_b1`: how much faster the split layers are), and at an RL rollout's width (16 rows) the step on
per-layer cache windows against the block loop over the stacked cache (`blocks_over_window_b16`). Every m3jax
decode step here is the slope between generating `--new` and `--new / 2` tokens, so a call's fixed costs stay out
of it; the tok/s ratios against transformers time both sides alike, as (generate - prefill) over the tokens
decoded.
"""

from __future__ import annotations

import argparse
import dataclasses
import os

from bench.harness import best_time, cpu_model, machine, require, result_line


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--threads", type=int, default=os.cpu_count())
  ap.add_argument("--prompt", type=int, default=128)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  ap.add_argument("--long-bucket", type=int, default=4096)
  ap.add_argument("--long-filled", type=int, default=256)
  args = ap.parse_args()
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  print(machine(), flush=True)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={args.threads}")
  import numpy as np
  import torch
  import transformers

  from m3jax.models.llm import load_llm
  from m3jax.models.weights.gguf import smollm2_path

  torch.set_num_threads(args.threads)
  best = lambda f: best_time(f, args.repeats)[0]
  model, tok = load_llm()
  path = smollm2_path()
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32).eval()
  rs = np.random.RandomState(0)
  results = {}
  for batch in (1, 8):
    prompts = rs.randint(100, 40000, (batch, args.prompt))
    m3_total, m3_pre, m3_step = _m3_times(model, prompts, args.new, args.prompt + args.new, best)
    ids = torch.tensor(prompts)
    with torch.no_grad():
      hf_gen = lambda: hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=args.new,
                                   min_new_tokens=args.new, do_sample=False, pad_token_id=0)
      hf_gen()
      hf_total = best(hf_gen)
      hf_pre = best(lambda: hf(ids, use_cache=True))
    m3_dec = batch * args.new / (m3_total - m3_pre)
    hf_dec = batch * args.new / (hf_total - hf_pre)
    results[batch] = dict(m3_decode=m3_dec, hf_decode=hf_dec, m3_prefill=batch * args.prompt / m3_pre,
                          hf_prefill=batch * args.prompt / hf_pre, m3_step=m3_step)
    print(f"batch {batch}: decode tok/s m3jax {m3_dec:.1f} vs transformers {hf_dec:.1f}; prefill tok/s m3jax "
          f"{results[batch]['m3_prefill']:.0f} vs transformers {results[batch]['hf_prefill']:.0f}", flush=True)

  # the decode step as it was before the split layers: one layer scan over the stacked weights
  *_, scan_step1 = _m3_times(model, rs.randint(100, 40000, (1, args.prompt)), args.new, args.prompt + args.new, best,
                             split_layers=False)
  print(f"batch 1: decode step {results[1]['m3_step'] * 1e3:.2f} ms with split layers (the default on CPU), "
        f"{scan_step1 * 1e3:.2f} ms with the layer scan", flush=True)

  long_prompts = rs.randint(100, 40000, (8, args.long_filled))
  steps = {}
  for bucket in (args.long_filled + args.new, args.long_bucket):
    *_, steps[bucket] = _m3_times(model, long_prompts, args.new, bucket, best)
    print(f"batch 8, {args.long_filled} filled (+{args.new} decoded) in a {bucket}-slot cache: decode step "
          f"{steps[bucket] * 1e3:.2f} ms", flush=True)
  long_step, short_step = steps[args.long_bucket], steps[args.long_filled + args.new]

  # the decode loop on per-layer arrays of the slots it fills (`decoder.LayerKV`) against the block loop over the
  # stacked cache, at an RL rollout's width: 16 rows of --long-filled tokens in a 512-slot cache, alternated
  wide = rs.randint(100, 40000, (16, args.long_filled))
  wide_slots = max(512, args.long_filled + args.new)
  window_steps = {True: [], False: []}
  for _ in range(2):
    for window in (True, False):
      *_, step = _m3_times(model, wide, args.new, wide_slots, best, decode_window=window)
      window_steps[window].append(step)
  win16, blk16 = (float(np.median(window_steps[w])) for w in (True, False))
  print(f"batch 16, {args.long_filled} filled in a {wide_slots}-slot cache: decode step {win16 * 1e3:.2f} ms on "
        f"per-layer windows, {blk16 * 1e3:.2f} ms with the block loop over the stacked cache", flush=True)

  floor8 = _matmul_floor_step(model, 8, best)
  matvec1 = _matmul_floor_step(model, 1, best)
  read1, n_bytes = _weight_read(model, best)
  floor1 = min(matvec1, read1)
  step1, step8 = results[1]["m3_step"], results[8]["m3_step"]
  print(f"batch 8: decode step {step8 * 1e3:.2f} ms, weight-matmul floor {floor8 * 1e3:.2f} ms")
  print(f"batch 1: decode step {step1 * 1e3:.2f} ms; weight read ({n_bytes / 1e6:.0f} MB): reduction "
        f"{read1 * 1e3:.2f} ms ({n_bytes / read1 / 1e9:.1f} GB/s), matvec step {matvec1 * 1e3:.2f} ms "
        f"({n_bytes / matvec1 / 1e9:.1f} GB/s); floor = the faster, {floor1 * 1e3:.2f} ms")
  print(result_line(
      decode_ratio_b1=f"{results[1]['m3_decode'] / results[1]['hf_decode']:.2f}",
      decode_ratio_b8=f"{results[8]['m3_decode'] / results[8]['hf_decode']:.2f}",
      prefill_ratio=f"{results[8]['m3_prefill'] / results[8]['hf_prefill']:.2f}",
      step_over_matmul_floor_b8=f"{step8 / floor8:.2f}", step_over_bandwidth_floor_b1=f"{step1 / floor1:.2f}",
      long_ctx_step_ms=f"{long_step * 1e3:.2f}", short_ctx_step_ms=f"{short_step * 1e3:.2f}",
      long_over_short=f"{long_step / short_step:.2f}", decode_tok_s_b1=f"{results[1]['m3_decode']:.1f}",
      decode_tok_s_b8=f"{results[8]['m3_decode']:.1f}", split_over_scan_b1=f"{scan_step1 / results[1]['m3_step']:.2f}",
      step_ms_b16_window=f"{win16 * 1e3:.2f}", step_ms_b16_blocks=f"{blk16 * 1e3:.2f}",
      blocks_over_window_b16=f"{blk16 / win16:.2f}", cpu=cpu_model()))


def _m3_times(model, prompts, new: int, slots: int, best, split_layers: bool | None = None,
              decode_window: bool = True) -> tuple[float, float, float]:
  """(generate, prefill, decode step) seconds for greedy decoding of `new` tokens after `prompts` in a `slots`-slot
  cache. The step is the slope between generating `new` and `new // 2` tokens: (generate - prefill) / new would
  also charge the step with whatever else one generate call costs beyond the separately timed prefill, which no
  further token pays (on a 2-core AMD EPYC a batch-8 call in a 4096-slot cache cost 1.2 s more than in a 384-slot
  one beyond its steps, about half of it zeroing the ~1.5 GB cache; long_over_short read 1.60 that way, 1.27 as
  slopes)."""
  import jax
  import jax.numpy as jnp

  from m3jax.engine.prefill import prefill as _prefill
  from m3jax.engine.sampling import Sampler, SamplingConfig

  batch, n = prompts.shape
  cfg = SamplingConfig(max_new_tokens=new, greedy=True, length_buckets=(n, slots))
  sampler = Sampler(model, cfg, split_layers=split_layers, decode_window=decode_window)
  sampler.generate(prompts.tolist())  # compile

  def prefill():
    cache = model.init_cache(batch, slots)
    out = _prefill(sampler.graphdef, sampler.params, cache, jnp.asarray(prompts, jnp.int32),
                   jnp.full((batch,), n, jnp.int32))
    jax.block_until_ready(out)

  prefill()
  half = dataclasses.replace(cfg, max_new_tokens=new // 2)
  sampler.generate(prompts.tolist(), config=half)  # compile
  total, half_total = best(lambda: sampler.generate(prompts.tolist())), best(
      lambda: sampler.generate(prompts.tolist(), config=half))
  return total, best(prefill), (total - half_total) / (new - new // 2)


def _layer_weights(model):
  return {n: getattr(model, n)[...] for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")}


def _matmul_floor_step(model, batch: int, best) -> float:
  """One step of the model's weight matmuls alone (q, k, v, o, gate, up, down per layer + lm_head): the faster of
  separate matmuls and q/k/v and gate/up fused into one matmul each, as the decode's split layers hold them."""
  return min(_matmul_step(model, batch, best, fused) for fused in (False, True))


def _matmul_step(model, batch: int, best, fused: bool) -> float:
  import jax
  import jax.numpy as jnp

  from m3jax.models.decoder import dense

  head = model.lm_head_weight()
  q_end = model.cfg.num_heads * model.cfg.head_dim
  kv_end = q_end + model.cfg.num_kv_heads * model.cfg.head_dim

  @jax.jit
  def step(x, weights, head):
    def layer(x, w):  # the decoder's own 2-D matmuls (`dense`), nothing else
      if fused:
        qkv = dense(x, w["w_qkv"], 1, jnp.float32)
        q, k, v = qkv[:, :q_end].reshape(x.shape[0], *w["wo"].shape[:2]), qkv[:, q_end:kv_end], qkv[:, kv_end:]
        gate, up = jnp.split(dense(dense(q, w["wo"], 2, jnp.float32), w["w_gate_up"], 1, jnp.float32), 2, -1)
      else:
        q, k, v = (dense(x, w[n], 1, jnp.float32) for n in ("wq", "wk", "wv"))
        o = dense(q, w["wo"], 2, jnp.float32)
        gate, up = dense(o, w["w_gate"], 1, jnp.float32), dense(o, w["w_up"], 1, jnp.float32)
      return x + dense(gate * up, w["w_down"], 1, jnp.float32), (k, v)  # k, v are outputs so they are computed

    kv = []
    for w in weights:  # unrolled over separate per-layer arrays: on XLA:CPU the fastest form (no weight copies)
      x, out = layer(x, w)
      kv.append(out)
    return x @ head, kv

  names = ("w_qkv", "wo", "w_gate_up", "w_down") if fused else ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
  weights = [{n: w[n] for n in names} for w in model.split_layers(fuse=fused)]
  x = jnp.ones((batch, model.cfg.hidden_size), jnp.float32)
  jax.block_until_ready(step(x, weights, head))
  reps = 20
  return best(lambda: [jax.block_until_ready(step(x, weights, head)) for _ in range(reps)]) / reps


def _weight_read(model, best) -> tuple[float, int]:
  """Seconds of one jitted pass summing every weight a decode step reads (the layers' matrices and the lm head),
  and their bytes."""
  import jax
  import jax.numpy as jnp

  arrays = list(_layer_weights(model).values()) + [model.lm_head_weight()]
  read = jax.jit(lambda ws: sum(jnp.sum(w) for w in ws))
  jax.block_until_ready(read(arrays))
  reps = 20
  seconds = best(lambda: [jax.block_until_ready(read(arrays)) for _ in range(reps)]) / reps
  return seconds, sum(a.size * a.dtype.itemsize for a in arrays)


if __name__ == "__main__":
  main()
