"""Pre-processing for the thinker, equal to transformers' Qwen2.5-Omni processor + qwen-omni-utils usage.

* Images: `smart_resize` to a multiple of 28 px within [min, max] pixels, PIL bicubic, /255, CLIP mean/std, then
  patches of (C, temporal 2, 14, 14) ordered by 2x2 merge blocks (an image is its own frame repeated twice).
* Videos: frames sampled at `fps` (2 by default, an even count, >= 4), resized like images with the video pixel
  bounds, the frame count padded to a multiple of 2 with the last frame; `second_per_grid` = 2 / fps.
* Audio: 16 kHz mono, cut to 30 s, 128-bin Whisper log-mels (m3jax.perception.logmel); the real frames
  (ceil(samples / 160)) are kept, which is what the processor's `feature_attention_mask` selects.
All numpy/PIL on the host: these outputs feed `ThinkerInputs.build`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from m3jax.perception.logmel import HOP, N_SAMPLES, log_mel_spectrogram

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class MediaInputError(ValueError):
  """An image, video or audio input the processor cannot use (wrong shape/dtype, empty, extreme aspect ratio)."""


@dataclass(frozen=True)
class ProcessorConfig:
  patch_size: int = 14
  temporal_patch_size: int = 2
  merge_size: int = 2
  image_min_pixels: int = 56 * 56
  image_max_pixels: int = 28 * 28 * 1280
  video_min_pixels: int = 128 * 28 * 28
  video_max_pixels: int = 768 * 28 * 28
  video_fps: float = 2.0
  min_frames: int = 4
  max_frames: int = 768
  n_mels: int = 128

  @property
  def factor(self) -> int:
    return self.patch_size * self.merge_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
  """Closest (h, w) with both divisible by `factor`, pixel count within bounds, aspect ratio kept."""
  if min(height, width) <= 0:
    raise MediaInputError(f"image size {height}x{width} is empty")
  if max(height, width) / min(height, width) > 200:
    raise MediaInputError(f"aspect ratio {max(height, width) / min(height, width):.1f} is above 200")
  h, w = round(height / factor) * factor, round(width / factor) * factor
  if h * w > max_pixels:
    beta = math.sqrt(height * width / max_pixels)
    h = max(factor, math.floor(height / beta / factor) * factor)
    w = max(factor, math.floor(width / beta / factor) * factor)
  elif h * w < min_pixels:
    beta = math.sqrt(min_pixels / (height * width))
    h, w = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
  return h, w


def _rgb_uint8(img: np.ndarray) -> np.ndarray:
  img = np.asarray(img)
  if img.ndim != 3 or img.shape[-1] != 3 or img.dtype != np.uint8:
    raise MediaInputError(f"expected an RGB uint8 [H, W, 3] array, got {img.dtype} {img.shape}")
  return img


def _resize_normalize(img: np.ndarray, h: int, w: int) -> np.ndarray:
  """[H, W, 3] uint8 -> normalised float32 [3, h, w]."""
  out = np.asarray(Image.fromarray(img).resize((w, h), Image.Resampling.BICUBIC), np.float32) / 255.0
  out = (out - np.asarray(OPENAI_CLIP_MEAN, np.float32)) / np.asarray(OPENAI_CLIP_STD, np.float32)
  return out.transpose(2, 0, 1).astype(np.float32)


def patchify(frames: np.ndarray, cfg: ProcessorConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
  """[T, C, H, W] -> patches [grid_t*grid_h*grid_w, C*tp*p*p] in merge-block order, and the (t, h, w) grid."""
  tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
  if pad := -frames.shape[0] % tp:
    frames = np.concatenate([frames, np.repeat(frames[-1:], pad, axis=0)])
  t, c, hh, ww = frames.shape
  gt, gh, gw = t // tp, hh // p, ww // p
  x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
  x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
  return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def process_image(img: np.ndarray, cfg: ProcessorConfig = ProcessorConfig()) -> tuple[np.ndarray, np.ndarray]:
  """RGB uint8 [H, W, 3] -> (patches [N, 1176], grid_thw [3])."""
  img = _rgb_uint8(img)
  h, w = smart_resize(img.shape[0], img.shape[1], cfg.factor, cfg.image_min_pixels, cfg.image_max_pixels)
  frame = _resize_normalize(img, h, w)
  patches, grid = patchify(np.repeat(frame[None], cfg.temporal_patch_size, axis=0), cfg)
  return patches, np.asarray(grid, np.int64)


def sample_frame_indices(total_frames: int, video_fps: float, cfg: ProcessorConfig = ProcessorConfig()) -> np.ndarray:
  """qwen-vl-utils' `smart_nframes` + linspace: an even number of frames at `cfg.video_fps`, at least 4."""
  if total_frames <= 0 or video_fps <= 0:
    raise MediaInputError(f"video has {total_frames} frames at {video_fps} fps")
  f = cfg.temporal_patch_size
  lo = math.ceil(cfg.min_frames / f) * f
  hi = math.floor(min(cfg.max_frames, total_frames) / f) * f
  n = total_frames / video_fps * cfg.video_fps
  n = math.floor(min(min(max(n, lo), hi), total_frames) / f) * f
  if n < f:
    raise MediaInputError(f"video with {total_frames} frames is too short (needs >= {f})")
  return np.round(np.linspace(0, total_frames - 1, n)).astype(np.int64)


def process_video(frames: np.ndarray, cfg: ProcessorConfig = ProcessorConfig()) -> tuple[np.ndarray, np.ndarray, float]:
  """Already-sampled RGB uint8 frames [T, H, W, 3] -> (patches, grid_thw [3], second_per_grid)."""
  frames = np.asarray(frames)
  if frames.ndim != 4 or frames.shape[0] == 0:
    raise MediaInputError(f"expected video frames [T, H, W, 3], got shape {frames.shape}")
  _rgb_uint8(frames[0])
  h, w = smart_resize(frames.shape[1], frames.shape[2], cfg.factor, cfg.video_min_pixels, cfg.video_max_pixels)
  stack = np.stack([_resize_normalize(f, h, w) for f in frames])
  patches, grid = patchify(stack, cfg)
  return patches, np.asarray(grid, np.int64), cfg.temporal_patch_size / cfg.video_fps


def process_audio(wavs: list[np.ndarray], cfg: ProcessorConfig = ProcessorConfig()) -> tuple[np.ndarray, np.ndarray]:
  """16 kHz mono waveforms -> (packed real log-mel frames [n_mels, sum(lengths)], lengths [n])."""
  if not wavs:
    raise MediaInputError("no audio given")
  feats, lengths = [], []
  for wav in wavs:
    wav = np.asarray(wav, np.float32)
    if wav.ndim != 1 or wav.size == 0:
      raise MediaInputError(f"audio must be a non-empty 1-D 16 kHz waveform, got shape {wav.shape}")
    n = min(math.ceil(wav.size / HOP), N_SAMPLES // HOP)
    mel = np.asarray(log_mel_spectrogram(wav, n_mels=cfg.n_mels))[0]
    feats.append(mel[:, :n])
    lengths.append(n)
  return np.concatenate(feats, axis=1), np.asarray(lengths, np.int64)

