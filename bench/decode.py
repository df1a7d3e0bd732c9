"""Decode/prefill throughput: m3jax sampler vs transformers `generate`, SmolLM2-135M-Instruct, float32, CPU.

  python bench/decode.py [--threads 2] [--prompt 128] [--new 128]

Same weights (the shipped GGUF, dequantised by each library), same thread count, greedy, no early stop. Also
measures the machine's floor for this model: one jitted step made of the weight matmuls alone (no attention, no
cache, no sampling) at batch 8, and reports how far a real decode step is above it.
"""

from __future__ import annotations

import argparse
import os
import time
from competitors import require  # bench/competitors.py (bench/ leads sys.path)


def main():
  ap = argparse.ArgumentParser()
  ap.add_argument("--threads", type=int, default=os.cpu_count())
  ap.add_argument("--prompt", type=int, default=128)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args()
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_cpu_multi_thread_eigen=true intra_op_parallelism_threads={args.threads}")
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  import transformers

  from m3jax.models.llm import load_llm
  from m3jax.models.sampling import Sampler, SamplingConfig, _prefill
  from m3jax.models.weights.gguf import smollm2_path

  torch.set_num_threads(args.threads)
  best = lambda f: min(_timed(f) for _ in range(args.repeats))
  model, tok = load_llm()
  path = smollm2_path()
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                         dtype=torch.float32).eval()
  rs = np.random.RandomState(0)
  results = {}
  for batch in (1, 8):
    prompts = rs.randint(100, 40000, (batch, args.prompt))
    cfg = SamplingConfig(max_new_tokens=args.new, greedy=True, length_buckets=(args.prompt, args.prompt + args.new))
    sampler = Sampler(model, cfg)
    sampler.generate(prompts.tolist())  # compile

    def m3_prefill():
      cache = model.init_cache(batch, args.prompt + args.new)
      out = _prefill(sampler.graphdef, sampler.params, cache, jnp.asarray(prompts, jnp.int32),
                     jnp.full((batch,), args.prompt, jnp.int32))
      jax.block_until_ready(out)

    m3_prefill()
    m3_total, m3_pre = best(lambda: sampler.generate(prompts.tolist())), best(m3_prefill)
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
                          hf_prefill=batch * args.prompt / hf_pre, m3_step=(m3_total - m3_pre) / args.new)
    print(f"batch {batch}: decode tok/s m3jax {m3_dec:.1f} vs transformers {hf_dec:.1f}; prefill tok/s m3jax "
          f"{results[batch]['m3_prefill']:.0f} vs transformers {results[batch]['hf_prefill']:.0f}", flush=True)

  floor = _matmul_floor_step(model, 8, best)
  step8 = results[8]["m3_step"]
  print(f"batch 8: decode step {step8 * 1e3:.2f} ms, weight-matmul floor {floor * 1e3:.2f} ms")
  print("RESULT decode_ratio_b1={:.2f} decode_ratio_b8={:.2f} prefill_ratio={:.2f} step_over_matmul_floor_b8={:.2f} "
        "decode_tok_s_b1={:.1f} decode_tok_s_b8={:.1f}".format(
            results[1]["m3_decode"] / results[1]["hf_decode"], results[8]["m3_decode"] / results[8]["hf_decode"],
            results[8]["m3_prefill"] / results[8]["hf_prefill"], step8 / floor, results[1]["m3_decode"],
            results[8]["m3_decode"]))


def _timed(fn) -> float:
  t = time.perf_counter()
  fn()
  return time.perf_counter() - t


def _matmul_floor_step(model, batch: int, best) -> float:
  """One step of the model's weight matmuls alone (q, k, v, o, gate, up, down per layer + lm_head)."""
  import jax
  import jax.numpy as jnp

  from m3jax.models.decoder import dense

  names = ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
  weights = {n: getattr(model, n)[...] for n in names}
  head = model.lm_head_weight()
  D = model.cfg.hidden_size

  @jax.jit
  def step(x, weights, head):
    def layer(x, w):  # the decoder's own 2-D matmuls (`dense`), nothing else
      q, k, v = (dense(x, w[n], 1, jnp.float32) for n in ("wq", "wk", "wv"))
      o = dense(q, w["wo"], 2, jnp.float32)
      h = dense(o, w["w_gate"], 1, jnp.float32) * dense(o, w["w_up"], 1, jnp.float32)
      return x + dense(h, w["w_down"], 1, jnp.float32), (k, v)  # k, v are outputs so they are computed

    x, kv = jax.lax.scan(layer, x, weights)
    return x @ head, kv

  x = jnp.ones((batch, D), jnp.float32)
  jax.block_until_ready(step(x, weights, head))
  reps = 20
  return best(lambda: [jax.block_until_ready(step(x, weights, head)) for _ in range(reps)]) / reps


if __name__ == "__main__":
  main()
