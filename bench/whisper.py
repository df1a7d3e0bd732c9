"""m3jax Whisper vs transformers Whisper (PyTorch): greedy transcription throughput on the same espeak batch.

  python bench/whisper.py [--segments 8] [--repeats 2]

Both sides get the shipped tiny.en weights (CTranslate2 file; the PyTorch model is built from the same tensors),
the same ~8 espeak-ng segments (16 kHz via sox), the same prompt and greedy decoding, and the same CPU thread
count (torch.set_num_threads = the CPUs this process may run on; XLA's CPU client uses the same, so
`taskset -c 0 python bench/whisper.py` compares both on one core). Each side is timed end to end
(audio → text, front end included) after one warm-up run; runs alternate and the best of `repeats` counts.
Process CPU seconds (all threads) of the best run are reported too, and the 1-minute load average at the end:
on a shared machine wall times move with other work.

The front end + encoder + cross-attention K/V of every decoder layer (all the work before the first decoder token,
~37 GFLOP of float32 matmuls per 30-s window for tiny.en) are also timed alone on both sides, interleaved with the
end-to-end runs: `encoder_ratio` compares them, and `ceiling` = transformers end-to-end seconds / m3jax encoder
seconds is the whole-run ratio m3jax would reach if its decoding took no time at all. Final line:
`RESULT whisper_ratio=<transformers seconds / m3jax seconds> ... encoder_ratio=... ceiling=... cpu_ratio=... load=...`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import tempfile
import time

import numpy as np
import soundfile as sf
from competitors import require  # bench/competitors.py (bench/ leads sys.path)

VOICES = ["en-us", "en-gb+m3", "en-us+f2", "en-us+m1", "en-gb-scotland+f5", "en-us+klatt", "en-gb+f3", "en-us+m7"]
SENTENCES = [
    "Please call Stella and ask her to bring these things with her from the store.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Meeting notes: we agreed to ship the new release on Friday afternoon.",
    "I left my keys in the kitchen next to the red coffee mug this morning.",
    "Tomorrow we will visit the museum and then have lunch with my sister.",
    "The weather report says it will rain heavily over the weekend.",
    "Can you remind me where we parked the car after the football game?",
    "She bought three apples, two oranges and a loaf of fresh bread.",
]


def espeak_segments(n: int, out_dir: pathlib.Path) -> list[np.ndarray]:
  """n utterances (cycling voices and sentences), resampled to 16 kHz float32 with sox."""
  waves = []
  for i in range(n):
    raw, wav = out_dir / f"{i}.wav", out_dir / f"{i}_16k.wav"
    text = SENTENCES[i % len(SENTENCES)]
    subprocess.run(["espeak-ng", "-v", VOICES[i % len(VOICES)], "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(["sox", str(raw), "-r", "16000", str(wav)], check=True, capture_output=True)
    waves.append(sf.read(wav, dtype="float32")[0])
  return waves


def _best_times(fns: dict, repeats: int) -> tuple[dict[str, tuple[float, float]], dict[str, list[str]]]:
  """Warm-up run of each (compilation / kernel selection), then `repeats` interleaved timed runs (so load changes
  on a shared machine hit both sides alike); per side the (wall, process CPU) seconds of its fastest run."""
  outputs = {name: fn() for name, fn in fns.items()}
  best = {name: (float("inf"), float("inf")) for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start, cpu = time.perf_counter(), time.process_time()
      outputs[name] = fn()
      wall, cpu = time.perf_counter() - start, time.process_time() - cpu
      if wall < best[name][0]:
        best[name] = (wall, cpu)
  return best, outputs


def run_whisper_bench(n_segments: int = 8, repeats: int = 2) -> dict[str, float]:
  """Both implementations on `n_segments` espeak utterances transcribed as one batch."""
  from m3jax.perception.asr import Transcriber

  with tempfile.TemporaryDirectory() as tmp:
    segments = espeak_segments(n_segments, pathlib.Path(tmp))
  transcriber = Transcriber.load(max_batch=max(16, 1 << (n_segments - 1).bit_length()))  # one batch
  return compare_whisper(transcriber, segments, repeats)


def compare_whisper(transcriber, segments: list[np.ndarray], repeats: int) -> dict[str, float]:
  """Times `transcriber` and transformers on the same segments; returns seconds, ratios and transcript agreement."""
  import jax
  import torch
  from tokenizers import Tokenizer
  from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

  from m3jax.models.weights.ct2 import ct2_whisper_to_hf, read_ct2
  from m3jax.perception.asr import ENGLISH_PROMPT, shipped_model_dir

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  config, state = ct2_whisper_to_hf(read_ct2(shipped_model_dir())[1])
  hf = WhisperForConditionalGeneration(WhisperConfig(**config)).eval()
  hf.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
  extractor = WhisperFeatureExtractor()
  tokenizer = Tokenizer.from_file(str(shipped_model_dir() / "tokenizer.json"))
  gen = GenerationConfig(decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256,
                         max_new_tokens=transcriber.sampler.config.max_new_tokens, do_sample=False, num_beams=1)

  def transformers_run() -> list[str]:
    with torch.inference_mode():
      feats = extractor(segments, sampling_rate=16000, return_tensors="pt").input_features
      out = hf.generate(feats, decoder_input_ids=torch.tensor([list(ENGLISH_PROMPT)] * len(segments)),
                        generation_config=gen)
    return [tokenizer.decode([t for t in row.tolist() if t < 50256], skip_special_tokens=True).strip()
            for row in out]

  def transformers_encoder() -> list:
    """transformers' work before its first decoder token: features, encoder, each layer's cross K/V."""
    with torch.inference_mode():
      feats = extractor(segments, sampling_rate=16000, return_tensors="pt").input_features
      enc = hf.model.encoder(feats).last_hidden_state
      return [(layer.encoder_attn.k_proj(enc), layer.encoder_attn.v_proj(enc)) for layer in hf.model.decoder.layers]

  best, texts = _best_times({"m3jax": lambda: transcriber.transcribe(segments), "hf": transformers_run,
                             "m3jax_encoder": lambda: jax.block_until_ready(transcriber.encode_to_cache(segments)),
                             "hf_encoder": transformers_encoder}, repeats)
  ((t_m3, cpu_m3), m3_texts), ((t_hf, cpu_hf), hf_texts) = (best["m3jax"], texts["m3jax"]), (best["hf"], texts["hf"])
  audio_s = sum(s.size for s in segments) / 16000
  enc_m3, enc_hf = best["m3jax_encoder"][0], best["hf_encoder"][0]
  return dict(whisper_ratio=t_hf / t_m3, m3jax_s=t_m3, transformers_s=t_hf, m3jax_encoder_s=enc_m3,
              transformers_encoder_s=enc_hf, encoder_ratio=enc_hf / enc_m3, ceiling=t_hf / enc_m3, m3jax_cpu_s=cpu_m3,
              transformers_cpu_s=cpu_hf, cpu_ratio=cpu_hf / cpu_m3, audio_s=audio_s, segments=len(segments),
              same_text=sum(a == b for a, b in zip(m3_texts, hf_texts)), load=os.getloadavg()[0])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--segments", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  r = run_whisper_bench(args.segments, args.repeats)
  print(f"m3jax {r['m3jax_s']:.2f}s (cpu {r['m3jax_cpu_s']:.2f}s)  transformers {r['transformers_s']:.2f}s "
        f"(cpu {r['transformers_cpu_s']:.2f}s)  for {r['segments']} segments ({r['audio_s']:.1f}s of audio); "
        f"identical transcripts {r['same_text']}/{r['segments']}")
  print(f"before the first decoder token (front end, encoder, cross K/V): m3jax {r['m3jax_encoder_s']:.2f}s, "
        f"transformers {r['transformers_encoder_s']:.2f}s")
  print(f"RESULT whisper_ratio={r['whisper_ratio']:.2f} m3jax_s={r['m3jax_s']:.2f} "
        f"transformers_s={r['transformers_s']:.2f} same_text={r['same_text']}/{r['segments']} "
        f"encoder_ratio={r['encoder_ratio']:.2f} ceiling={r['ceiling']:.2f} "
        f"cpu_ratio={r['cpu_ratio']:.2f} load={r['load']:.1f}")


if __name__ == "__main__":
  main()
