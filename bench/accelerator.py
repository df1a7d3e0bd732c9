"""Accelerator benchmark: decode against the HBM roofline, SFT / RL learner MFU, Omni memorization clips/s.

  python -m bench.accelerator            # on a GPU / TPU host: full shapes, one chip, a few minutes
  python -m bench.accelerator --tiny     # the same code paths with tiny shapes on CPU (tests)

Everything runs through m3jax's own classes on one device (`jax.devices()[0]`) with random weights:
* decode: `Sampler.generate` (jitted prefill, on-device decode loop) on Qwen3-0.6B- and Qwen3-1.7B-shaped
  `Decoder`s, bf16 weights and KV cache, greedy, no stop token, batch 1 / 8 / 64. Decode tok/s = batch x new
  tokens / (generate time - prefill time). The roofline of one decode step is max(bytes / bandwidth,
  FLOPs / peak) with bytes = every weight once + each row's KV cache up to its position, so `frac` is the
  fraction of the step time the hardware allows.
* SFT: `Trainer._train_step` (`sft.trainer`: value_and_grad of the chunked target NLL + AdamW) of a `Thinker`
  whose language model is Qwen3-1.7B-shaped (f32 master weights, bf16 compute), text-only rows.
* RL: `Learner.update` (`rl.learner`: DAPO loss, one optimizer step with micro-batch accumulation) on the
  Qwen3-1.7B-shaped `Decoder`, same precision.
  MFU = model FLOPs / step time / peak. Model FLOPs are counted analytically: 6 x (weights used in matmuls,
  the LM head once) per token, plus causal attention 6 x layers x heads x head_dim x seq per token (QK^T and
  AV over the T/2 keys a token sees on average, x3 for forward + backward). Recomputation (the loss chunks'
  remat) is not counted, as MFU conventionally does not.
* memorization: `OmniWriter.replies` (the `omni` memory writer: the reference prompt with a clip's video,
  audio-in-video, face crops and transcripts, thinker prefill + sampler decode) on a Qwen2.5-Omni-7B-shaped
  thinker slice (every width of the 7B; `--slice-layers` LM layers, vision blocks and audio layers), bf16,
  clips of `--clip-seconds` at 2 fps, `--clip-batch` clips per generation call, `--clip-new` new tokens each.
  The prompt text is byte-tokenized (no Qwen tokenizer ships here): ~3x the BPE text tokens, small next to the
  clip's video tokens. Host pre-processing (frame resize, log-mels) is inside the timing, as in memorization.

Bandwidth is measured (a jitted read+write of a large buffer, and a reduction; the faster) and printed next to
the device-kind table value; peak bf16 FLOP/s comes from the table by device kind, or is measured with a large
jitted matmul where the kind is unknown (CPU); the source of each is printed. Final line:
RESULT device=... bw_gbs=... peak_tflops=... decode_<model>_b<B>_tok_s=... decode_<model>_b<B>_frac=...
  sft_mfu=... rl_mfu=... memorize_clips_s=... seconds=...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time

import numpy as np

from bench.harness import best_time, result_line

# Per-chip HBM bandwidth (bytes/s) and dense bf16 peak (FLOP/s), keyed on a substring of `device_kind`.
BANDWIDTH = {"H200": 4.8e12, "H100": 3.35e12, "A100": 2.0e12, "TPU v5 lite": 0.82e12, "TPU v5e": 0.82e12,
             "TPU v5p": 2.76e12, "TPU v5": 2.76e12, "TPU v4": 1.2e12, "TPU v6 lite": 1.64e12, "TPU v6e": 1.64e12}
PEAK_BF16 = {"H200": 989e12, "H100 PCIe": 756e12, "H100": 989e12, "A100": 312e12, "TPU v5 lite": 197e12,
             "TPU v5e": 197e12, "TPU v5p": 459e12, "TPU v5": 459e12, "TPU v4": 275e12, "TPU v6 lite": 918e12,
             "TPU v6e": 918e12}


@dataclasses.dataclass(frozen=True)
class Sizes:
  tiny: bool
  prompt: int = 128  # decode prompt tokens
  new: int = 128  # decode new tokens
  batches: tuple[int, ...] = (1, 8, 64)
  train_rows: int = 8  # SFT rows per step
  seq: int = 1024  # SFT / RL sequence length
  rl_rows: int = 16
  rl_micro: int = 8
  steps: int = 3  # timed training steps (after one compiling step)
  slice_layers: int = 4
  clip_seconds: float = 30.0
  frame_hw: tuple[int, int] = (364, 644)  # a multiple of 28: the processor keeps the size
  clip_batch: int = 4
  clip_new: int = 128
  bw_bytes: int = 1 << 30
  matmul_n: int = 8192


TINY = dict(tiny=True, prompt=16, new=8, train_rows=2, seq=64, rl_rows=4, rl_micro=2, steps=1, slice_layers=1,
            clip_seconds=2.0, frame_hw=(56, 56), clip_batch=2, clip_new=4, bw_bytes=1 << 24, matmul_n=256)


# ------------------------------------------------------------------------------------------------ shapes
def qwen3(name: str, tiny: bool, param_dtype: str = "bfloat16", **extra):
  """A Qwen3-0.6B / 1.7B-shaped DecoderConfig (tiny: 2 layers, width 32 / 64, 512 tokens)."""
  from m3jax.models.decoder import DecoderConfig
  width = {"qwen3-0.6b": (1024, 3072), "qwen3-1.7b": (2048, 6144)}[name]
  if tiny:
    shape = dict(vocab_size=512, hidden_size=width[0] // 32, intermediate_size=width[1] // 32, num_layers=2,
                 num_heads=4, num_kv_heads=2, head_dim=16)
  else:
    shape = dict(vocab_size=151936, hidden_size=width[0], intermediate_size=width[1], num_layers=28,
                 num_heads=16, num_kv_heads=8, head_dim=128)
  return DecoderConfig(**shape, rope_theta=1e6, qk_norm=True, tie_embeddings=True, model_type="qwen3",
                       max_position_embeddings=40960, param_dtype=param_dtype, compute_dtype="bfloat16", **extra)


def matmul_weights(cfg) -> int:
  """Weights one token multiplies by: q, k, v, o, gate, up, down per layer, and the LM head."""
  c = cfg
  per_layer = 2 * c.hidden_size * c.num_heads * c.head_dim + 2 * c.hidden_size * c.num_kv_heads * c.head_dim
  return c.num_layers * (per_layer + 3 * c.hidden_size * c.intermediate_size) + c.hidden_size * c.vocab_size


def train_flops(cfg, rows: int, seq: int) -> float:
  """Model FLOPs of one training step on rows x seq tokens (forward + backward, causal attention)."""
  tokens = rows * seq
  return 6.0 * matmul_weights(cfg) * tokens + 6.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * seq * tokens


def omni_slice(layers: int, tiny: bool):
  """A Qwen2.5-Omni-7B thinker with `layers` LM layers, vision blocks and audio layers (tiny: TinyThinker)."""
  from m3jax.models.decoder import DecoderConfig
  from m3jax.models.omni.audio import AudioConfig
  from m3jax.models.omni.chat import ByteTokenizer, ChatTokens
  from m3jax.models.omni.rope import RopeIndexConfig
  from m3jax.models.omni.thinker import ThinkerConfig
  from m3jax.models.omni.vision import VisionConfig
  from m3jax.sft.run import TinyThinker
  import jax.numpy as jnp
  if tiny:
    t = TinyThinker(hidden=32, layers=layers, vision_hidden=16, vision_depth=layers, audio_hidden=16,
                    audio_layers=layers)
    cfg = t.thinker_config()
    cfg = dataclasses.replace(cfg, text=dataclasses.replace(cfg.text, param_dtype="bfloat16",
                                                            compute_dtype="bfloat16"),
                              vision=dataclasses.replace(cfg.vision, param_dtype=jnp.bfloat16),
                              audio=dataclasses.replace(cfg.audio, param_dtype=jnp.bfloat16))
    return cfg.with_attention_chunk(64), t.chat_tokens(), ByteTokenizer()
  text = DecoderConfig(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_layers=layers,
                       num_heads=28, num_kv_heads=4, head_dim=128, rope_theta=1e6, qkv_bias=True,
                       mrope_section=(16, 24, 24), max_position_embeddings=32768, model_type="qwen2_5_omni_text",
                       param_dtype="bfloat16", compute_dtype="bfloat16")
  vision = VisionConfig(depth=layers, fullatt_block_indexes=(layers - 1,), param_dtype=jnp.bfloat16)
  audio = AudioConfig(encoder_layers=layers, param_dtype=jnp.bfloat16)
  cfg = ThinkerConfig(text, vision, audio, RopeIndexConfig(), ChatTokens().media)
  return cfg.with_attention_chunk(1024), ChatTokens(), ByteTokenizer()  # load_omni_writer's chunk


def hardware(sz: Sizes) -> dict:
  """Device kind, measured bandwidth (and the table's), peak bf16 FLOP/s (table, else measured)."""
  import jax
  import jax.numpy as jnp
  dev = jax.devices()[0]
  kind = dev.device_kind
  x = jax.device_put(jnp.ones((sz.bw_bytes // 4,), jnp.float32), dev)
  copy = jax.jit(lambda a: a * 2.0 + 1.0)  # reads and writes the buffer once
  total = jax.jit(jnp.sum)  # reads it once
  jax.block_until_ready((copy(x), total(x)))
  bw_copy = 2 * sz.bw_bytes / best_time(lambda: jax.block_until_ready(copy(x)), 5)[0]
  bw_sum = sz.bw_bytes / best_time(lambda: jax.block_until_ready(total(x)), 5)[0]
  del x
  table_bw = next((v for k, v in BANDWIDTH.items() if k in kind), None)
  peak = next((v for k, v in PEAK_BF16.items() if k in kind), None)
  peak_source = "table"
  if peak is None:
    n = sz.matmul_n
    a = jax.device_put(jnp.ones((n, n), jnp.bfloat16), dev)
    mm = jax.jit(lambda a: a @ a)
    jax.block_until_ready(mm(a))
    peak = 2 * n ** 3 / best_time(lambda: jax.block_until_ready(mm(a)), 5)[0]
    peak_source = f"measured {n}^3 bf16 matmul"
  return dict(kind=kind, bw=max(bw_copy, bw_sum), bw_copy=bw_copy, bw_sum=bw_sum, table_bw=table_bw, peak=peak,
              peak_source=peak_source)


# ------------------------------------------------------------------------------------------------ decode
def decode(name: str, sz: Sizes, hw: dict) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from m3jax.models.decoder import Decoder
  from m3jax.engine.prefill import prefill as _prefill
  from m3jax.engine.sampling import Sampler, SamplingConfig
  cfg = qwen3(name, sz.tiny)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  weight_bytes = sum(x.nbytes for x in jax.tree.leaves(nnx.state(model)))
  rng = np.random.default_rng(0)
  out = {}
  for batch in sz.batches:
    prompts = rng.integers(100, cfg.vocab_size, (batch, sz.prompt))
    scfg = SamplingConfig(max_new_tokens=sz.new, greedy=True, length_buckets=(sz.prompt + sz.new,),
                          batch_buckets=(batch,))
    sampler = Sampler(model, scfg)
    sampler.generate(prompts.tolist())  # compiles prefill and decode

    def prefill():
      cache = model.init_cache(batch, sz.prompt + sz.new)
      jax.block_until_ready(_prefill(sampler.graphdef, sampler.params, cache, jnp.asarray(prompts, jnp.int32),
                                     jnp.full((batch,), sz.prompt, jnp.int32)))

    prefill()
    whole = best_time(lambda: sampler.generate(prompts.tolist()), 3)[0]
    seconds = whole - best_time(prefill, 3)[0]
    if seconds <= 0:  # the decode part is below the timing noise (tiny sizes on a busy host): count the prefill
      seconds = whole  # too, which gives a lower bound on the decode rate
    tok_s = batch * sz.new / seconds
    ctx = sz.prompt + sz.new / 2  # mean keys read per row and step
    kv_bytes = batch * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * ctx * 2
    flops = batch * (2 * matmul_weights(cfg) + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * ctx)
    step_min = max((weight_bytes + kv_bytes) / hw["bw"], flops / hw["peak"])
    out[batch] = dict(tok_s=tok_s, frac=tok_s / (batch / step_min))
    print(f"decode {name} batch {batch}: {tok_s:.1f} tok/s, {out[batch]['frac']:.3f} of the roofline "
          f"({batch / step_min:.0f} tok/s; weights {weight_bytes / 1e9:.2f} GB)", flush=True)
  return out


# ------------------------------------------------------------------------------------------------ training
def sft_mfu(sz: Sizes, hw: dict) -> float:
  """MFU of `Trainer._train_step` on a Thinker with a Qwen3-1.7B-shaped LM (text-only rows)."""
  import jax
  from flax import nnx

  from m3jax.models.omni.chat import Batch
  from m3jax.models.omni.thinker import Thinker, ThinkerInputs
  from m3jax.sft.run import TinyThinker
  from m3jax.sft.trainer import TrainConfig, Trainer
  lm = qwen3("qwen3-1.7b", sz.tiny, "float32")
  q = lm.head_dim // 2
  lm = dataclasses.replace(lm, mrope_section=(q - 2 * (q // 3), q // 3, q // 3))  # the thinker's LM is mRoPE
  towers = TinyThinker(hidden=lm.hidden_size).thinker_config()  # tiny towers (text rows never run them)
  cfg = dataclasses.replace(towers, text=lm)
  rng = np.random.default_rng(0)
  ids = rng.integers(0, 256, (sz.train_rows, sz.seq)).astype(np.int32)  # below every media id
  inputs = ThinkerInputs.build(cfg, ids)
  labels = np.concatenate([ids[:, 1:], np.zeros((sz.train_rows, 1), np.int32)], axis=1)
  weights = np.ones(ids.shape, np.float32)
  weights[:, -1] = 0
  batch = Batch(inputs, labels, weights)
  with tempfile.TemporaryDirectory() as out:
    trainer = Trainer(Thinker(cfg, rngs=nnx.Rngs(0)), TrainConfig(steps=1000, loss_chunk=min(sz.seq, 512)), out,
                      lambda k: batch, lambda: [batch], progress=False)
    trainer._train_step()  # compiles
    t = time.perf_counter()
    for _ in range(sz.steps):
      trainer._train_step()
    jax.block_until_ready(trainer.params)
    seconds = (time.perf_counter() - t) / sz.steps
  mfu = train_flops(lm, sz.train_rows, sz.seq) / seconds / hw["peak"]
  print(f"SFT step ({sz.train_rows} x {sz.seq} tokens): {seconds * 1e3:.1f} ms, MFU {mfu:.3f}", flush=True)
  return mfu


def rl_mfu(sz: Sizes, hw: dict) -> float:
  """MFU of one `Learner.update` (one optimizer step over rl_rows, micro-batches of rl_micro)."""
  from flax import nnx

  from m3jax.models.decoder import Decoder
  from m3jax.rl.learner import Learner, LearnerConfig, OptimConfig
  cfg = qwen3("qwen3-1.7b", sz.tiny, "float32")
  lcfg = LearnerConfig(optim=OptimConfig(lr=1e-6), micro_batch=sz.rl_micro, seq_chunk=min(sz.seq, 256),
                       vocab_chunk=min(cfg.vocab_size, 8192), layer_loop="scan")
  learner = Learner(Decoder(cfg, rngs=nnx.Rngs(0)), lcfg)
  rng = np.random.default_rng(0)
  n, t = sz.rl_rows, sz.seq
  mask = np.ones((n, t), np.float32)
  mask[:, 0] = 0
  batch = {"tokens": rng.integers(1, cfg.vocab_size, (n, t)).astype(np.int32), "lengths": np.full(n, t, np.int32),
           "mask": mask, "advantages": rng.normal(size=(n, 1)).astype(np.float32) * mask,
           "old_logp": np.full((n, t), -np.log(cfg.vocab_size), np.float32)}
  learner.update(batch, seed=0)  # compiles
  t0 = time.perf_counter()
  for s in range(sz.steps):
    learner.update(batch, seed=s + 1)  # returns with the metrics on the host: the step is complete
  seconds = (time.perf_counter() - t0) / sz.steps
  mfu = train_flops(cfg, n, t) / seconds / hw["peak"]
  print(f"RL learner step ({n} x {t} tokens, micro-batch {sz.rl_micro}): {seconds * 1e3:.1f} ms, MFU {mfu:.3f}",
        flush=True)
  return mfu


# ------------------------------------------------------------------------------------------------ memorization
def memorize_clips_s(sz: Sizes) -> float:
  """Clips/s of the omni writer's generation (`OmniWriter.replies`) on an Omni-7B-shaped thinker slice."""
  from flax import nnx

  from m3jax.memorize.observations import ClipObservation, FaceObservation, SpeechObservation
  from m3jax.memorize.omni_writer import ClipMedia, OmniWriter
  from m3jax.models.omni.processor import ProcessorConfig
  from m3jax.models.omni.thinker import Thinker
  from m3jax.engine.sampling import SamplingConfig
  cfg, chat, tok = omni_slice(sz.slice_layers, sz.tiny)
  proc = ProcessorConfig(n_mels=cfg.audio.num_mel_bins, patch_size=cfg.vision.patch_size)
  if sz.tiny:
    proc = dataclasses.replace(proc, video_min_pixels=28 * 28, video_max_pixels=56 * 56, image_min_pixels=28 * 28,
                               image_max_pixels=28 * 28 * 4)
  sampling = SamplingConfig(max_new_tokens=sz.clip_new, greedy=True, length_buckets=tuple(2 ** k for k in range(8, 18)))
  writer = OmniWriter(Thinker(cfg, rngs=nnx.Rngs(0)), tok, chat, processor=proc, sampling=sampling,
                      batch=sz.clip_batch)
  rng = np.random.default_rng(0)
  h, w = sz.frame_hw
  n_frames = max(4, int(round(sz.clip_seconds * proc.video_fps)))
  crop = 112 if not sz.tiny else 28

  def clip(i: int):
    obs = ClipObservation(i, sz.clip_seconds * i, sz.clip_seconds,
                          faces=(FaceObservation(0, 5, 0.0, 3.0), FaceObservation(1, 4, 1.0, 4.0)),
                          speech=(SpeechObservation(2, 0.0, 2.0, "Hello, I am Anna and this is my kitchen."),
                                  SpeechObservation(3, 2.5, 4.0, "Nice to meet you, Anna.")))
    media = ClipMedia(rng.integers(0, 256, (n_frames, h, w, 3), dtype=np.uint8),
                      (0.1 * rng.standard_normal(int(16000 * sz.clip_seconds))).astype(np.float32),
                      {0: rng.integers(0, 256, (crop, crop, 3), dtype=np.uint8),
                       1: rng.integers(0, 256, (crop, crop, 3), dtype=np.uint8)})
    return obs, media

  warm = [clip(i) for i in range(sz.clip_batch)]
  writer.replies([c for c, _ in warm], [m for _, m in warm])  # compiles
  timed = [clip(i) for i in range(2 * sz.clip_batch)]
  t = time.perf_counter()
  writer.replies([c for c, _ in timed], [m for _, m in timed])
  seconds = time.perf_counter() - t
  rate = len(timed) / seconds
  print(f"memorization ({sz.slice_layers}-layer Omni-7B slice, {sz.clip_seconds:.0f}-s clips of {n_frames} "
        f"{h}x{w} frames, {sz.clip_batch} per call, {sz.clip_new} new tokens): {rate:.3f} clips/s", flush=True)
  return rate


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tiny", action="store_true", help="tiny shapes, compiled without LLVM optimisation (CPU, tests)")
  ap.add_argument("--skip", default="", help="comma-separated sections to skip: decode,sft,rl,memorize")
  for f in dataclasses.fields(Sizes):
    if f.type in ("int", "float"):
      ap.add_argument(f"--{f.name.replace('_', '-')}", type=int if f.type == "int" else float, default=None)
  args = ap.parse_args()
  start = time.perf_counter()
  if args.tiny:  # CPU code-path check: compile fast (LLVM -O0) rather than run fast; before jax starts
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
                               " --xla_llvm_disable_expensive_passes=true")
  import jax
  sz = Sizes(**(TINY if args.tiny else {"tiny": False}))
  sz = dataclasses.replace(sz, **{f.name: getattr(args, f.name) for f in dataclasses.fields(Sizes)
                                  if getattr(args, f.name, None) is not None})
  skip = set(filter(None, args.skip.split(",")))
  if skip - {"decode", "sft", "rl", "memorize"}:
    raise SystemExit(f"--skip: unknown sections {sorted(skip - {'decode', 'sft', 'rl', 'memorize'})}")
  hw = hardware(sz)
  table = f"{hw['table_bw'] / 1e9:.0f} GB/s" if hw["table_bw"] else "not in the table"
  print(f"device: {hw['kind']} ({jax.device_count()} device(s), benchmarking one); bandwidth measured "
        f"{hw['bw'] / 1e9:.0f} GB/s (copy {hw['bw_copy'] / 1e9:.0f}, reduction {hw['bw_sum'] / 1e9:.0f}; table "
        f"{table}); peak bf16 {hw['peak'] / 1e12:.1f} TFLOP/s ({hw['peak_source']})", flush=True)
  # significant digits, not fixed decimals: a tiny run on a busy CPU must not print a measured rate as 0
  result = {"device": hw["kind"].replace(" ", "_"), "bw_gbs": f"{hw['bw'] / 1e9:.3g}",
            "bw_source": "measured", "peak_tflops": f"{hw['peak'] / 1e12:.3g}",
            "peak_source": "table" if hw["peak_source"] == "table" else "measured"}
  for section in ("decode", "sft", "rl", "memorize"):
    if section in skip:
      continue
    t = time.perf_counter()
    if section == "decode":
      for name in ("qwen3-0.6b", "qwen3-1.7b"):
        for batch, r in decode(name, sz, hw).items():
          key = name.replace("qwen3-", "").replace(".", "")
          result[f"decode_{key}_b{batch}_tok_s"] = f"{r['tok_s']:.4g}"
          result[f"decode_{key}_b{batch}_frac"] = f"{r['frac']:.3g}"
    elif section == "sft":
      result["sft_mfu"] = f"{sft_mfu(sz, hw):.3g}"
    elif section == "rl":
      result["rl_mfu"] = f"{rl_mfu(sz, hw):.3g}"
    else:
      result["memorize_clips_s"] = f"{memorize_clips_s(sz):.3g}"
    print(f"({section}: {time.perf_counter() - t:.0f} s with compilation)", flush=True)
  result["seconds"] = f"{time.perf_counter() - start:.0f}"
  print(result_line(**result))


if __name__ == "__main__":
  main()
