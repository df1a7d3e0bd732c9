"""Voice activity detection: Silero VAD probabilities (jitted, bucketed) and Silero's speech-span rules.

`SileroVAD.speech_spans` reproduces `silero_vad.get_speech_timestamps` (default settings, no maximum span
length): enter speech at p >= threshold, leave after `min_silence_ms` below `threshold - 0.15`, drop spans
shorter than `min_speech_ms`, pad each by `speech_pad_ms` (splitting short gaps between neighbours).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jaxtyping import Float

from m3jax.models import silero_vad as S
from m3jax.perception import audio as A

MIN_CHUNK_BUCKET = 64


@dataclasses.dataclass(frozen=True)
class VADConfig:
  threshold: float = 0.5
  min_speech_ms: int = 250
  min_silence_ms: int = 100
  speech_pad_ms: int = 30

  def __post_init__(self):
    if not 0.0 < self.threshold < 1.0:
      raise ValueError(f"VADConfig.threshold must be in (0, 1), got {self.threshold}")
    for name in ("min_speech_ms", "min_silence_ms", "speech_pad_ms"):
      if getattr(self, name) < 0:
        raise ValueError(f"VADConfig.{name} must be >= 0, got {getattr(self, name)}")


class SileroVAD:
  """Silero VAD v6 at 16 kHz; one jitted call per clip (chunk count padded to a power of two)."""

  def __init__(self, params: dict[str, jax.Array], config: VADConfig = VADConfig()):
    self.params = params
    self.config = config
    self._probs = jax.jit(S.speech_probs)
    self._probs_rows = jax.jit(jax.vmap(S.speech_probs, in_axes=(None, 0)))

  @classmethod
  def load(cls, path: str | None = None, config: VADConfig = VADConfig()) -> "SileroVAD":
    return cls(S.load_silero_params(path), config)

  def probs(self, audio_16k: Float[np.ndarray, "T"]) -> Float[np.ndarray, "N"]:
    """Speech probability per 32 ms chunk (the last chunk zero-padded), as Silero computes them."""
    audio_16k = A.check_audio(audio_16k)
    n = -(-audio_16k.size // S.CHUNK)
    if n == 0:
      return np.zeros((0,), np.float32)
    bucket = max(MIN_CHUNK_BUCKET, 1 << (n - 1).bit_length())
    padded = np.zeros(bucket * S.CHUNK, np.float32)
    padded[:audio_16k.size] = audio_16k
    return np.asarray(self._probs(self.params, padded))[:n]

  def probs_batch(self, audios: list[np.ndarray]) -> list[Float[np.ndarray, "N"]]:
    """`probs` of several clips in one call (several videos' clips memorized in lock-step): the clips are
    zero-padded to the longest one's chunk bucket (the model is causal, so a clip's probabilities do not see the
    padding) and the rows to a power of two, so few shapes compile."""
    audios = [A.check_audio(a) for a in audios]
    counts = [-(-a.size // S.CHUNK) for a in audios]
    bucket = max(MIN_CHUNK_BUCKET, 1 << (max(counts, default=1) - 1).bit_length())
    padded = np.zeros((1 << (len(audios) - 1).bit_length(), bucket * S.CHUNK), np.float32)
    for row, a in zip(padded, audios):
      row[:a.size] = a
    probs = np.asarray(self._probs_rows(self.params, padded))
    return [probs[k, :n] for k, n in enumerate(counts)]

  def speech_spans(self, audio: np.ndarray, sr: int) -> list[tuple[int, int]]:
    """Speech spans as (start, end) sample indices at 16 kHz."""
    wav = A.resample(A.check_audio(audio), sr)
    return spans_from_probs(self.probs(wav), wav.size, self.config)


def spans_from_probs(probs: Float[np.ndarray, "N"], n_samples: int, cfg: VADConfig) -> list[tuple[int, int]]:
  """Silero's hysteresis over chunk probabilities (a tiny sequential state machine, one pass)."""
  sr, step = A.SAMPLE_RATE, S.CHUNK
  min_speech = sr * cfg.min_speech_ms / 1000
  min_silence = sr * cfg.min_silence_ms / 1000
  pad = sr * cfg.speech_pad_ms / 1000
  neg_threshold = max(cfg.threshold - 0.15, 0.01)
  spans: list[list[int]] = []
  start, temp_end, triggered = 0, 0, False
  for i, p in enumerate(probs.tolist()):
    cur = step * i
    if p >= cfg.threshold and temp_end:
      temp_end = 0
    if p >= cfg.threshold and not triggered:
      triggered, start = True, cur
      continue
    if p < neg_threshold and triggered:
      temp_end = temp_end or cur
      if cur - temp_end < min_silence:
        continue
      if temp_end - start > min_speech:
        spans.append([start, temp_end])
      temp_end, triggered = 0, False
  if triggered and n_samples - start > min_speech:
    spans.append([start, n_samples])
  for i, span in enumerate(spans):
    if i == 0:
      span[0] = int(max(0, span[0] - pad))
    if i + 1 < len(spans):
      gap = spans[i + 1][0] - span[1]
      if gap < 2 * pad:
        span[1] += int(gap // 2)
        spans[i + 1][0] = int(max(0, spans[i + 1][0] - gap // 2))
      else:
        span[1] = int(min(n_samples, span[1] + pad))
        spans[i + 1][0] = int(max(0, spans[i + 1][0] - pad))
    else:
      span[1] = int(min(n_samples, span[1] + pad))
  return [(a, b) for a, b in spans]
