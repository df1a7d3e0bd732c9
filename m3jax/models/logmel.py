"""Whisper log-mel front end in JAX, numerically equal to transformers' `WhisperFeatureExtractor`.

Whisper was trained on 30-s windows: audio is zero-padded (or cut) to 480,000 samples at 16 kHz, framed with a
centred 400-point periodic Hann STFT (hop 160, reflect padding), projected on a Slaney mel bank (0–8 kHz), then
log10-compressed, floored at (max − 8) per example and rescaled by (x + 4) / 4. The whole batch is one jitted call.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

SAMPLE_RATE = 16_000
N_FFT = 400
HOP = 160
CHUNK_SECONDS = 30
N_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE


def _hz_to_mel(f: np.ndarray) -> np.ndarray:
  """Slaney mel scale: linear below 1 kHz, logarithmic above."""
  f = np.asarray(f, dtype=np.float64)
  return np.where(f < 1000.0, 3.0 * f / 200.0, 15.0 + 27.0 * np.log(np.maximum(f, 1e-10) / 1000.0) / np.log(6.4))


def _mel_to_hz(m: np.ndarray) -> np.ndarray:
  m = np.asarray(m, dtype=np.float64)
  return np.where(m < 15.0, 200.0 * m / 3.0, 1000.0 * np.exp(np.log(6.4) * (m - 15.0) / 27.0))


@functools.lru_cache(maxsize=4)
def mel_filters(n_mels: int, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
  """Slaney-normalised triangular mel filters, shape [n_fft // 2 + 1, n_mels] (float32)."""
  fft_freqs = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
  edges = _mel_to_hz(np.linspace(_hz_to_mel(0.0), _hz_to_mel(8000.0), n_mels + 2))
  slopes = edges[None, :] - fft_freqs[:, None]
  widths = np.diff(edges)
  down = -slopes[:, :-2] / widths[:-1]
  up = slopes[:, 2:] / widths[1:]
  bank = np.maximum(0.0, np.minimum(down, up))
  bank *= 2.0 / (edges[2:] - edges[:-2])
  return bank.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("n_mels",))
def log_mel_padded(audio: Float[Array, "B N"], n_mels: int) -> Float[Array, "B M F"]:
  """Log-mels of audio already padded/trimmed to the model window (callable inside other jitted code)."""
  pad = N_FFT // 2
  x = jnp.pad(audio, ((0, 0), (pad, pad)), mode="reflect")
  n_frames = 1 + (x.shape[1] - N_FFT) // HOP
  idx = jnp.arange(n_frames - 1)[:, None] * HOP + jnp.arange(N_FFT)[None, :]  # the last frame is dropped
  window = 0.5 - 0.5 * jnp.cos(2.0 * jnp.pi * jnp.arange(N_FFT) / N_FFT)  # periodic Hann
  spec = jnp.fft.rfft(x[:, idx] * window, axis=-1)
  power = spec.real ** 2 + spec.imag ** 2  # [B, F, n_fft/2+1]
  mel = jnp.einsum("bfk,km->bmf", power, jnp.asarray(mel_filters(n_mels)))
  log_spec = jnp.log10(jnp.maximum(mel, 1e-10))
  log_spec = jnp.maximum(log_spec, log_spec.max(axis=(1, 2), keepdims=True) - 8.0)
  return (log_spec + 4.0) / 4.0


def pad_or_trim(audio: np.ndarray, length: int = N_SAMPLES) -> np.ndarray:
  """Zero-pads or cuts the last axis to `length` samples (Whisper's fixed 30-s window)."""
  audio = np.asarray(audio, dtype=np.float32)
  if audio.shape[-1] >= length:
    return audio[..., :length]
  return np.pad(audio, [(0, 0)] * (audio.ndim - 1) + [(0, length - audio.shape[-1])])


def log_mel_spectrogram(audio: np.ndarray | Float[Array, "B N"], n_mels: int = 80,
                        n_samples: int = N_SAMPLES) -> Float[Array, "B M F"]:
  """Log-mels of 16-kHz mono audio: [N] or [B, N] → [B, n_mels, n_samples // 160] (3000 frames for 30 s).

  Inputs are padded/trimmed to `n_samples` exactly as WhisperFeatureExtractor does before the STFT.
  """
  if n_mels not in (80, 128):
    raise ValueError(f"Whisper uses 80 or 128 mel bins, got n_mels={n_mels}")
  arr = np.asarray(audio, dtype=np.float32)
  if arr.ndim == 1:
    arr = arr[None]
  if arr.ndim != 2 or arr.shape[-1] == 0:
    raise ValueError(f"audio must be a non-empty [samples] or [batch, samples] array, got shape {arr.shape}")
  if not np.isfinite(arr).all():
    raise ValueError("audio contains NaN or infinite samples")
  return log_mel_padded(jnp.asarray(pad_or_trim(arr, n_samples)), n_mels)
