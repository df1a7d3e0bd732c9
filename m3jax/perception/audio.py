"""Audio front end shared by the speaker encoder and the speech segmenter.

The GE2E speaker encoder was trained on Resemblyzer's features, so the features here reproduce them exactly
(without librosa): 16 kHz audio, volume raised to -30 dBFS, power mel spectrogram with a 25 ms Hann window
(n_fft 400, periodic), 10 ms hop, centred frames with zero padding, 40 Slaney-scale, Slaney-normalised mel
bands from 0 to 8 kHz; utterances cut into 1.6 s partials at 1.3 partials/s (Resemblyzer's
`compute_partial_slices`), whose embeddings are averaged.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from jaxtyping import Float
from scipy import signal

SAMPLE_RATE = 16_000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s
NORM_TARGET_DBFS = -30.0
_INT16_MAX = 2**15 - 1


class AudioInputError(ValueError):
  """Audio that cannot be processed: empty, not 1-D, non-finite samples, bad sample rate."""


def check_audio(audio: np.ndarray, name: str = "audio") -> Float[np.ndarray, "T"]:
  """Validates a mono waveform and returns it as float32; names the problem otherwise."""
  audio = np.asarray(audio)
  if audio.ndim != 1:
    raise AudioInputError(f"{name} must be a 1-D mono waveform, got shape {audio.shape}")
  if not np.issubdtype(audio.dtype, np.floating):
    raise AudioInputError(f"{name} must be floating point in [-1, 1], got dtype {audio.dtype}")
  if not np.all(np.isfinite(audio)):
    raise AudioInputError(f"{name} contains NaN or infinite samples")
  return audio.astype(np.float32, copy=False)


def resample(audio: Float[np.ndarray, "T"], sr: int, target_sr: int = SAMPLE_RATE) -> Float[np.ndarray, "T2"]:
  """Polyphase resampling (Kaiser-windowed FIR), the band-limited method soxr/librosa also approximate."""
  if sr <= 0:
    raise AudioInputError(f"sample rate must be positive, got {sr}")
  audio = check_audio(audio)
  if sr == target_sr or audio.size == 0:
    return audio
  g = math.gcd(int(sr), int(target_sr))
  out = signal.resample_poly(audio.astype(np.float64), target_sr // g, sr // g, window=("kaiser", 8.0))
  return out.astype(np.float32)


def normalize_volume(wav: Float[np.ndarray, "T"], target_dbfs: float = NORM_TARGET_DBFS) -> Float[np.ndarray, "T"]:
  """Raises (never lowers) the RMS level to `target_dbfs`, as Resemblyzer's `preprocess_wav` does."""
  rms = np.sqrt(np.mean((wav.astype(np.float64) * _INT16_MAX) ** 2)) if wav.size else 0.0
  if rms == 0.0:
    return wav
  change_db = target_dbfs - 20.0 * np.log10(rms / _INT16_MAX)
  if change_db < 0:
    return wav
  return (wav * (10.0 ** (change_db / 20.0))).astype(np.float32)


def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
  """Slaney mel scale: linear below 1 kHz, logarithmic above."""
  hz = np.asarray(hz, dtype=np.float64)
  f_sp, min_log_hz = 200.0 / 3, 1000.0
  min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
  return np.where(hz >= min_log_hz, min_log_mel + np.log(np.maximum(hz, 1e-10) / min_log_hz) / logstep, hz / f_sp)


def _mel_to_hz(mel: np.ndarray) -> np.ndarray:
  f_sp, min_log_hz = 200.0 / 3, 1000.0
  min_log_mel, logstep = min_log_hz / f_sp, np.log(6.4) / 27.0
  return np.where(mel >= min_log_mel, min_log_hz * np.exp(logstep * (mel - min_log_mel)), f_sp * mel)


@functools.cache
def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> Float[np.ndarray, "M F"]:
  """Triangular Slaney filters with area normalisation (librosa's `filters.mel` defaults)."""
  fft_freqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
  mel_pts = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(sr / 2.0), n_mels + 2))
  fdiff = np.diff(mel_pts)
  ramps = mel_pts[:, None] - fft_freqs[None, :]
  lower = -ramps[:-2] / fdiff[:-1, None]
  upper = ramps[2:] / fdiff[1:, None]
  weights = np.maximum(0.0, np.minimum(lower, upper))
  weights *= (2.0 / (mel_pts[2:n_mels + 2] - mel_pts[:n_mels]))[:, None]
  return weights.astype(np.float32)


@functools.cache
def _hann(n: int) -> np.ndarray:
  return (0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / n)).astype(np.float32)  # periodic


def mel_spectrogram(wav: Float[np.ndarray, "T"]) -> Float[np.ndarray, "frames 40"]:
  """Power mel spectrogram (not log), one row per 10 ms, `1 + T // 160` rows (centred frames)."""
  padded = np.pad(wav.astype(np.float32), (N_FFT // 2, N_FFT // 2))
  n_frames = 1 + (padded.size - N_FFT) // HOP
  frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:n_frames]
  power = np.abs(np.fft.rfft(frames * _hann(N_FFT), axis=-1).astype(np.complex64)) ** 2
  return (power @ mel_filterbank().T).astype(np.float32)


def partial_slices(n_samples: int, rate: float = 1.3, min_coverage: float = 0.75) -> list[tuple[int, int]]:
  """Mel-frame ranges of the 1.6 s partials of an utterance, exactly as Resemblyzer chooses them.

  The last partial is kept only if at least `min_coverage` of it is real audio (always kept when it is the
  only one); callers zero-pad the waveform up to the last partial's end.
  """
  n_frames = int(np.ceil((n_samples + 1) / HOP))
  frame_step = int(np.round((SAMPLE_RATE / rate) / HOP))
  if not 0 < frame_step <= PARTIAL_FRAMES:
    raise ValueError(f"partial rate {rate} out of range")
  steps = max(1, n_frames - PARTIAL_FRAMES + frame_step + 1)
  slices = [(i, i + PARTIAL_FRAMES) for i in range(0, steps, frame_step)]
  start, stop = slices[-1]
  coverage = (n_samples - start * HOP) / ((stop - start) * HOP)
  if coverage < min_coverage and len(slices) > 1:
    slices = slices[:-1]
  return slices


def utterance_partials(wav: Float[np.ndarray, "T"], rate: float = 1.3,
                       min_coverage: float = 0.75) -> Float[np.ndarray, "P 160 40"]:
  """All partial mel windows of one (already normalised) 16 kHz utterance."""
  slices = partial_slices(wav.size, rate, min_coverage)
  need = slices[-1][1] * HOP
  if need >= wav.size:
    wav = np.pad(wav, (0, need - wav.size))
  mel = mel_spectrogram(wav)
  return np.stack([mel[a:b] for a, b in slices])
