"""SFT step throughput: m3jax (jitted grads + AdamW update, Flax NNX) vs a transformers PyTorch training step of
`Qwen2_5OmniThinkerForConditionalGeneration`, same tiny config, same weights, same batch (video + audio-in-video +
face image + text, loss on the target tokens only).

  python -m bench.sft_step [--steps 5] [--batch 2] [--hidden 64] [--layers 2] [--attention-chunk 128]

Both are timed after a warm-up step (compilation excluded), interleaved, first under glibc's default allocator
settings and then under m3jax.host_memory's (the ratio takes each side's faster phase); tokens = real (unpadded)
tokens per step.
Final line: `RESULT sft_step_ratio=<m3jax tokens/s / torch tokens/s> m3jax_tok_s=... torch_tok_s=...`.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import numpy as np

from bench.harness import machine, require, result_line


def _example(i: int):
  from m3jax.models.omni.chat import MemoryExample
  rng = np.random.default_rng(i)
  frames = rng.integers(0, 256, (8, 112, 112, 3), dtype=np.uint8)
  audio = (0.1 * rng.standard_normal(16000 * 8)).astype(np.float32)
  crop = rng.integers(0, 256, (56, 56, 3), dtype=np.uint8)
  voices = {"<voice_1>": [{"start_time": "00:00", "end_time": "00:04", "asr": "Hello, my name is Anna."}]}
  target = json.dumps({"video_descriptions": ["<face_0> is present.", "<voice_1> says: \"Hello\""],
                       "high_level_conclusions": ["Equivalence: <face_0>, <voice_1>"]})
  return MemoryExample(frames, audio, ((0, crop),), voices, target)


def _hf_config(tiny):
  from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
  cfg = tiny.thinker_config()
  t, v, a, tok = cfg.text, cfg.vision, cfg.audio, cfg.tokens
  return Qwen2_5OmniThinkerConfig(
      audio_config=dict(num_mel_bins=a.num_mel_bins, encoder_layers=a.encoder_layers,
                        encoder_attention_heads=a.encoder_attention_heads, encoder_ffn_dim=a.encoder_ffn_dim,
                        d_model=a.d_model, output_dim=a.output_dim, n_window=a.n_window,
                        max_source_positions=a.max_source_positions),
      vision_config=dict(depth=v.depth, hidden_size=v.hidden_size, intermediate_size=v.intermediate_size,
                         num_heads=v.num_heads, patch_size=v.patch_size, temporal_patch_size=v.temporal_patch_size,
                         spatial_merge_size=v.spatial_merge_size, window_size=v.window_size,
                         out_hidden_size=v.out_hidden_size, fullatt_block_indexes=list(v.fullatt_block_indexes)),
      text_config=dict(vocab_size=t.vocab_size, hidden_size=t.hidden_size, intermediate_size=t.intermediate_size,
                       num_hidden_layers=t.num_layers, num_attention_heads=t.num_heads,
                       num_key_value_heads=t.num_kv_heads,
                       rope_parameters={"rope_type": "default", "rope_theta": t.rope_theta,
                                        "mrope_section": list(t.mrope_section)}),
      audio_token_index=tok.audio, image_token_index=tok.image, video_token_index=tok.video,
      audio_start_token_id=tok.audio_bos, audio_end_token_id=tok.audio_eos, vision_start_token_id=tok.vision_bos,
      vision_end_token_id=tok.vision_eos)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--steps", type=int, default=5)
  ap.add_argument("--batch", type=int, default=2)
  ap.add_argument("--hidden", type=int, default=64)
  ap.add_argument("--layers", type=int, default=2)
  # query blocks of 128 keep each block's scores in cache (flash-style, like torch's SDPA kernel); 0 = one block
  ap.add_argument("--attention-chunk", type=int, default=128)
  args = ap.parse_args()
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  print(machine(), flush=True)
  jax.config.update("jax_default_matmul_precision", "highest")
  import torch
  from flax import nnx

  from m3jax.host_memory import retain_freed_memory
  from m3jax.models.omni.processor import ProcessorConfig
  from m3jax.models.omni.weights import thinker_from_tensors
  from m3jax.models.omni.chat import ByteTokenizer, collate, encode_example
  from m3jax.sft.run import TinyThinker
  from m3jax.sft.trainer import TrainConfig, _apply, _grads, make_optimizer
  from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

  tiny = TinyThinker(hidden=args.hidden, layers=args.layers)
  cfg = tiny.thinker_config().with_attention_chunk(args.attention_chunk)
  proc = ProcessorConfig(video_min_pixels=28 * 28, video_max_pixels=112 * 112, image_min_pixels=28 * 28,
                         image_max_pixels=56 * 56)
  enc = [encode_example(_example(i), "Write the memories as JSON.", ByteTokenizer(), tiny.chat_tokens(), proc)
         for i in range(args.batch)]
  length = -(-max(len(e.ids) for e in enc) // 128) * 128
  batch = collate(cfg, enc, length)
  tokens = int(batch.inputs.lengths.sum())

  torch.manual_seed(0)
  hf_cfg = _hf_config(tiny)
  hf = Qwen2_5OmniThinkerForConditionalGeneration(hf_cfg).train()
  sd = {k: v.detach().numpy() for k, v in hf.state_dict().items()}
  model = thinker_from_tensors(cfg, sd.__getitem__, sd.keys())
  tcfg = TrainConfig(steps=1000, learning_rate=1e-4, loss_chunk=128)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  state = {"params": params, "opt": make_optimizer(tcfg).init(params)}

  ids = torch.from_numpy(np.stack([np.pad(e.ids, (0, length - len(e.ids))) for e in enc]).astype(np.int64))
  mask = (torch.arange(length)[None] < torch.from_numpy(batch.inputs.lengths)[:, None]).long()
  labels = torch.full_like(ids, -100)
  for b, e in enumerate(enc):
    labels[b, :len(e.ids)] = torch.where(torch.from_numpy(e.loss_mask), ids[b, :len(e.ids)], -100)
  n_frames = max(int(e.audio_lengths[0]) for e in enc)
  feats = np.zeros((len(enc), cfg.audio.num_mel_bins, n_frames), np.float32)
  fmask = np.zeros((len(enc), n_frames), np.int64)
  for b, e in enumerate(enc):
    feats[b, :, :e.audio_lengths[0]], fmask[b, :e.audio_lengths[0]] = e.audio_features, 1
  hf_inputs = dict(
      input_ids=ids, attention_mask=mask, labels=labels, input_features=torch.from_numpy(feats),
      feature_attention_mask=torch.from_numpy(fmask),
      pixel_values=torch.from_numpy(np.concatenate([e.image_patches for e in enc])),
      image_grid_thw=torch.from_numpy(np.concatenate([e.image_grids for e in enc])),
      pixel_values_videos=torch.from_numpy(np.concatenate([e.video_patches for e in enc])),
      video_grid_thw=torch.from_numpy(np.concatenate([e.video_grid for e in enc])),
      video_second_per_grid=torch.tensor([e.second_per_grid for e in enc]), use_audio_in_video=True)
  torch_opt = torch.optim.AdamW(hf.parameters(), lr=1e-4)

  def torch_step():
    torch_opt.zero_grad()
    loss = hf(**hf_inputs).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
    torch_opt.step()
    return loss.item()

  def jax_step():  # what Trainer._train_step runs for accum=1
    total, count, grads = _grads(graphdef, state["params"], rest, batch, 128)
    state["params"], state["opt"] = _apply(tcfg, state["params"], state["opt"], grads, count)
    jax.block_until_ready(state["params"])
    return float(total) / float(count)

  def throughput(steps: int) -> dict[str, float]:
    jax_step(), torch_step()  # warm-up (the first call compiles; after an allocator change, the heap grows)
    times = {"m3jax": [], "torch": []}
    for _ in range(steps):  # interleaved, so machine-load changes hit both alike
      for name, step in (("m3jax", jax_step), ("torch", torch_step)):
        t = time.perf_counter()
        step()
        times[name].append(time.perf_counter() - t)
    return {k: tokens / float(np.median(v)) for k, v in times.items()}

  l_jax, l_torch = jax_step(), torch_step()  # first losses match: same weights, same batch
  print(f"first-step loss m3jax={l_jax:.5f} torch={l_torch:.5f} tokens/step={tokens} length={length}")
  # Each side at its best host-allocator setting: glibc's defaults, then what m3jax's entry points set
  # (m3jax.host_memory; process-wide, so torch runs under it too). The ratio takes each side's faster phase.
  phases = {"default": throughput(args.steps)}
  retain_freed_memory()
  phases["retained"] = throughput(args.steps)
  for name, tps in phases.items():
    print(f"allocator={name}: m3jax {tps['m3jax']:.1f} tok/s, torch {tps['torch']:.1f} tok/s")
  best = {k: max(phases, key=lambda p: phases[p][k]) for k in ("m3jax", "torch")}
  tps = {k: phases[best[k]][k] for k in best}
  print(result_line(sft_step_ratio=f"{tps['m3jax'] / tps['torch']:.2f}", m3jax_tok_s=f"{tps['m3jax']:.1f}",
                    torch_tok_s=f"{tps['torch']:.1f}", m3jax_allocator=best['m3jax'], torch_allocator=best['torch'],
                    tokens_per_step=tokens, steps=args.steps, attention_chunk=args.attention_chunk,
                    load=f"{os.getloadavg()[0]:.1f}"))


if __name__ == "__main__":
  main()
