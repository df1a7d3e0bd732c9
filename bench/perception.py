"""Perception throughput on a generated 30-s clip: faces, VAD, speaker segmentation/embedding, ASR.

Run: python -m bench.perception [--seconds 30] [--face-fps 1] [--repeats 3]

The clip: two espeak-ng voices (en-us+f3, en-gb+m3) taking alternate turns with short pauses, and video frames
(640x360) showing the current speaker's real portrait (skimage astronaut / matplotlib grace_hopper) at a
jittered position. Frames are sampled at `--face-fps` (the memorization default is 1 fps, HOG upsample 0).
Every stage is timed after one warm-up run (jit compilation excluded; load and compile times are printed).
Competitors in the same process: Resemblyzer (PyTorch) for GE2E and transformers Whisper (greedy, the same
tiny.en weights) for ASR, timed interleaved by bench/whisper.py, which also times the work before the first decoder
token alone on both sides (`whisper_encoder_ratio`; `whisper_ceiling` = the whisper_ratio m3jax would reach if its
decoding took no time). Prints `RESULT realtime_factor=... ge2e_ratio=... whisper_ratio=... whisper_encoder_ratio=...
whisper_ceiling=...`.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import subprocess
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np  # noqa: E402
import soundfile as sf  # noqa: E402

from m3jax.perception import audio as A  # noqa: E402
from bench.harness import best_time, machine, require, result_line  # noqa: E402

VOICES = {"f3": ["-v", "en-us+f3"], "m3": ["-v", "en-gb+m3"]}
LINES = [
    "Good morning. Did you bring the blue folder from the office?",
    "Yes, it is in my bag, next to the laptop and the charger.",
    "Great. We need the budget numbers before the meeting at ten.",
    "I printed two copies, one for you and one for Maria.",
    "Thanks. Can you also call the caterer about lunch on Friday?",
    "Sure, I will call them right after this meeting ends.",
    "And remember that the projector in room four is still broken.",
    "Then let us move the presentation to the small room upstairs.",
]


def make_clip(seconds: float, face_fps: float, work: pathlib.Path, seed: int = 0):
  """Audio (16 kHz), frames [F, 360, 640, 3] uint8 and the true speaker turns."""
  import matplotlib.cbook as cbook
  import matplotlib.image as mpimg
  from skimage import data, transform

  rng = np.random.default_rng(seed)
  # Head-and-shoulders crops, 240 px tall, so faces are ~90-120 px (HOG without upsampling needs >= 80 px).
  hopper = np.asarray(mpimg.imread(cbook.get_sample_data("grace_hopper.jpg")))[60:420, 120:430]
  faces = {"f3": data.astronaut()[10:250, 110:330],
           "m3": (transform.resize(hopper, (240, 207), anti_aliasing=True) * 255).astype(np.uint8)}
  n = int(seconds * A.SAMPLE_RATE)
  audio, turns, t, k = np.zeros(n, np.float32), [], int(0.3 * A.SAMPLE_RATE), 0
  while True:
    voice = "f3" if k % 2 == 0 else "m3"
    path = work / f"line{k}.wav"
    subprocess.run(["espeak-ng", *VOICES[voice], "-w", str(path), LINES[k % len(LINES)]], check=True)
    wav, sr = sf.read(path, dtype="float32")
    wav = A.resample(wav, sr)
    idx = np.flatnonzero(np.abs(wav) > 1e-3)
    wav = wav[idx[0]:idx[-1] + 1]
    if t + wav.size > n:
      break
    audio[t:t + wav.size] = wav
    turns.append((t / A.SAMPLE_RATE, (t + wav.size) / A.SAMPLE_RATE, voice))
    t += wav.size + int(rng.uniform(0.3, 0.7) * A.SAMPLE_RATE)
    k += 1
  times = np.arange(0, seconds, 1.0 / face_fps)
  frames = np.full((len(times), 360, 640, 3), 60, np.uint8)
  for i, ft in enumerate(times):
    voice = next((v for a, b, v in turns if a - 0.5 <= ft <= b + 0.5), "f3")
    face = faces[voice]
    y, x = rng.integers(0, 360 - face.shape[0]), rng.integers(0, 640 - face.shape[1])
    frames[i, y:y + face.shape[0], x:x + face.shape[1]] = face
  return audio, frames, turns


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seconds", type=float, default=30.0)
  parser.add_argument("--face-fps", type=float, default=1.0)
  parser.add_argument("--upsample", type=int, default=0)
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  require({"torch": "torch", "transformers": "transformers", "resemblyzer": "resemblyzer"})  # competitors
  print(machine(), flush=True)

  from m3jax.perception.faces import DlibFaceBackend, detect_faces
  from m3jax.perception.speech import segment_speech
  from m3jax.perception.vad import SileroVAD
  from m3jax.perception.voices import SpeakerEncoder

  work = pathlib.Path(tempfile.mkdtemp(prefix="bench_perception_"))
  audio, frames, turns = make_clip(args.seconds, args.face_fps, work)
  print(f"clip: {args.seconds:.0f} s audio, {len(turns)} turns, {len(frames)} frames at {args.face_fps} fps")

  t = time.perf_counter()
  faces_backend, vad, encoder = DlibFaceBackend(upsample=args.upsample), SileroVAD.load(), SpeakerEncoder.load()
  try:
    from m3jax.perception.asr import Transcriber
    transcriber = Transcriber.load()
  except ImportError as e:  # the ASR module is built separately; report without it if it is missing
    print(f"ASR unavailable ({e}); realtime_factor excludes ASR")
    transcriber = None
  print(f"load: {time.perf_counter() - t:.2f} s")

  stages: dict[str, float] = {}
  t = time.perf_counter()
  segs = segment_speech(audio, A.SAMPLE_RATE, vad=vad, encoder=encoder)
  seg_audio = [audio[int(s.start_s * A.SAMPLE_RATE):int(s.end_s * A.SAMPLE_RATE)] for s in segs]
  if transcriber is not None:
    transcriber.transcribe(seg_audio)
  detect_faces(frames, backend=faces_backend)
  print(f"warm-up (jit compile + first run): {time.perf_counter() - t:.2f} s")

  stages["faces"], found = best_time(lambda: detect_faces(frames, backend=faces_backend), args.repeats)
  stages["vad"], _ = best_time(lambda: vad.speech_spans(audio, A.SAMPLE_RATE), args.repeats)
  seg_time, segs = best_time(lambda: segment_speech(audio, A.SAMPLE_RATE, vad=vad, encoder=encoder), args.repeats)
  stages["speaker"] = max(seg_time - stages["vad"], 0.0)  # change detection + merging + segment embeddings
  if transcriber is not None:
    stages["asr"], texts = best_time(lambda: transcriber.transcribe(seg_audio), args.repeats)
  total = sum(stages.values())
  rtf = args.seconds / total
  print(f"faces found: {len(found)}; speech segments: {len(segs)} (true turns {len(turns)})")
  for s in segs[:3]:
    print(f"  segment {s.start_s:6.2f}-{s.end_s:6.2f} s")
  for name, sec in stages.items():
    print(f"stage {name:8s} {sec:7.3f} s")
  print(f"total {total:.3f} s for {args.seconds:.0f} s of media -> realtime factor {rtf:.2f}"
        + ("" if transcriber is not None else " (WITHOUT ASR)"))

  ge2e_ratio = bench_ge2e(encoder, seg_audio, args.repeats)
  nan = float("nan")
  asr = bench_whisper(transcriber, seg_audio, args.repeats) if transcriber is not None else {}
  print(result_line(realtime_factor=f"{rtf:.2f}", ge2e_ratio=f"{ge2e_ratio:.2f}",
                    whisper_ratio=f"{asr.get('whisper_ratio', nan):.2f}",
                    whisper_encoder_ratio=f"{asr.get('encoder_ratio', nan):.2f}",
                    whisper_ceiling=f"{asr.get('ceiling', nan):.2f}", load=f"{os.getloadavg()[0]:.1f}"))


def bench_ge2e(encoder, segments: list[np.ndarray], repeats: int) -> float:
  """Utterance embeddings of all segments: m3jax (one batched call) vs Resemblyzer (its per-utterance API)."""
  from resemblyzer import VoiceEncoder

  ref = VoiceEncoder(device="cpu", verbose=False)
  prepared = [A.normalize_volume(s) for s in segments]
  ref.embed_utterance(prepared[0])  # librosa / torch warm-up
  encoder.embed(segments)
  t_ref, ref_out = best_time(lambda: np.stack([ref.embed_utterance(w) for w in prepared]), repeats)
  t_ours, ours = best_time(lambda: encoder.embed(segments), repeats)
  print(f"GE2E {len(segments)} segments: resemblyzer {t_ref:.3f} s, m3jax {t_ours:.3f} s, "
        f"max |diff| {np.abs(ours - ref_out).max():.2e}")
  import torch

  mels = np.concatenate([A.utterance_partials(w) for w in prepared])  # model only: same partials, one batch
  with torch.no_grad():
    t_ref_model, _ = best_time(lambda: ref(torch.from_numpy(mels)), repeats)
  t_model, _ = best_time(lambda: encoder.embed_partials(mels), repeats)
  print(f"GE2E model only, {len(mels)} partials in one batch: torch {t_ref_model:.3f} s, m3jax {t_model:.3f} s "
        f"(ratio {t_ref_model / t_model:.2f})")
  return t_ref / t_ours


def bench_whisper(transcriber, segments: list[np.ndarray], repeats: int) -> dict[str, float]:
  """Greedy transcripts of all segments: m3jax Transcriber vs transformers generate (bench/whisper.py)."""
  from bench.whisper import compare_whisper

  r = compare_whisper(transcriber, segments, repeats)
  print(f"Whisper {r['segments']} segments: transformers {r['transformers_s']:.3f} s, m3jax {r['m3jax_s']:.3f} s, "
        f"identical transcripts {r['same_text']}/{r['segments']}; before the first decoder token: transformers "
        f"{r['transformers_encoder_s']:.3f} s, m3jax {r['m3jax_encoder_s']:.3f} s")
  return r


if __name__ == "__main__":
  main()
