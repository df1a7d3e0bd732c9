"""Real synthetic speech for perception tests: espeak-ng voices rendered to 16 kHz float32 arrays."""

from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import soundfile as sf

from m3jax.perception import audio as A

# Clearly distinct speakers: female / male / klatt / regional variants at different pitches.
VOICES = {
    "f3": ["-v", "en-us+f3"],
    "m3": ["-v", "en-gb+m3"],
    "klatt": ["-v", "en-us+klatt", "-p", "70"],
    "scot_f5": ["-v", "en-gb-scotland+f5"],
    "m1_low": ["-v", "en-us+m1", "-p", "15"],
}
SENTENCES = [
    "Please call Stella and ask her to bring these things with her from the store.",
    "The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "We also need a small plastic snake and a big toy frog for the kids.",
]


def say(text: str, voice: str, out_dir: pathlib.Path, name: str) -> np.ndarray:
  """Renders `text` with an espeak-ng voice and returns the 16 kHz waveform."""
  path = out_dir / f"{name}.wav"
  subprocess.run(["espeak-ng", *VOICES[voice], "-w", str(path), text], check=True, capture_output=True)
  wav, sr = sf.read(path, dtype="float32")
  return A.resample(wav, sr)


def trim(wav: np.ndarray, level: float = 1e-3) -> np.ndarray:
  """Drops espeak's leading/trailing silence so turn boundaries are known exactly."""
  idx = np.flatnonzero(np.abs(wav) > level)
  return wav[idx[0]:idx[-1] + 1] if idx.size else wav[:0]


def dialogue(turns: list[tuple[str, str]], out_dir: pathlib.Path, gap_s: float = 0.5,
             lead_s: float = 0.5) -> tuple[np.ndarray, list[tuple[float, float, str]]]:
  """Concatenates trimmed turns with silent gaps; returns audio and the true (start_s, end_s, voice)."""
  pieces, truth, t = [np.zeros(int(lead_s * A.SAMPLE_RATE), np.float32)], [], lead_s
  for k, (voice, text) in enumerate(turns):
    wav = trim(say(text, voice, out_dir, f"turn{k}_{voice}"))
    truth.append((t, t + wav.size / A.SAMPLE_RATE, voice))
    gap = np.zeros(int(gap_s * A.SAMPLE_RATE), np.float32)
    pieces += [wav, gap]
    t += (wav.size + gap.size) / A.SAMPLE_RATE
  return np.concatenate(pieces), truth
