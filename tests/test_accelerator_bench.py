"""bench/accelerator.py: its FLOP count matches the models, and `--tiny` runs every section on CPU.

The tiny run is what makes the benchmark work the first time an accelerator is lent: every section (decode,
SFT step, RL learner step, omni memorization) goes through the same m3jax classes as the full shapes.
"""

import math
import os
import pathlib
import subprocess
import sys

import jax
from flax import nnx

from bench import accelerator as bench

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_flop_count_covers_every_matmul_weight_of_the_qwen3_shapes():
  """`matmul_weights` (the MFU numerator's 6N) = the Decoder's parameters less its norm scales, and the
  non-embedding part is Qwen3's published 0.44B / 1.4B."""
  from m3jax.models.decoder import Decoder
  for name, published in (("qwen3-0.6b", 0.44e9), ("qwen3-1.7b", 1.4e9)):
    cfg = bench.qwen3(name, tiny=False)
    state = nnx.state(nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0))))
    sizes = {"/".join(map(str, path)): math.prod(x.shape) for path, x in jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: hasattr(x, "shape"))}
    norms = sum(n for k, n in sizes.items() if "norm" in k)
    assert bench.matmul_weights(cfg) == sum(sizes.values()) - norms, name
    non_embedding = bench.matmul_weights(cfg) - cfg.hidden_size * cfg.vocab_size
    assert abs(non_embedding / published - 1) < 0.01, (name, non_embedding)
  cfg = bench.qwen3("qwen3-1.7b", tiny=False)
  per_token = bench.train_flops(cfg, 1, 1024) / 1024
  assert per_token == 6 * bench.matmul_weights(cfg) + 6 * 28 * 16 * 128 * 1024


def test_tiny_run_reports_every_section():
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a plain host
  proc = subprocess.run([sys.executable, "-m", "bench.accelerator", "--tiny"], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  last = proc.stdout.strip().splitlines()[-1]
  assert last.startswith("RESULT "), proc.stdout[-3000:]
  fields = dict(kv.split("=", 1) for kv in last.split()[1:])
  expected = {"device", "bw_gbs", "bw_source", "peak_tflops", "peak_source", "sft_mfu", "rl_mfu", "memorize_clips_s",
              "seconds"}
  expected |= {f"decode_{m}_b{b}_{k}" for m in ("06b", "17b") for b in (1, 8, 64) for k in ("tok_s", "frac")}
  assert set(fields) == expected, sorted(set(fields) ^ expected)
  assert fields["device"] == "cpu" and fields["bw_source"] == "measured" and fields["peak_source"] == "measured"
  for k, v in fields.items():
    if k not in ("device", "bw_source", "peak_source", "seconds"):
      assert math.isfinite(float(v)) and float(v) > 0, (k, v)
