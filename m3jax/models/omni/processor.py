"""Pre-processing for the thinker, equal to transformers' Qwen2.5-Omni processor + qwen-omni-utils usage.

* Images: `smart_resize` to a multiple of 28 px within [min, max] pixels, PIL bicubic, /255, CLIP mean/std, then
  patches of (C, temporal 2, 14, 14) ordered by 2x2 merge blocks (an image is its own frame repeated twice).
* Videos (what M3-Agent's `process_mm_info(..., use_audio_in_video=True)` + the processor do): every frame of the
  clip decoded (`read_video`), an even number of them picked at `fps` (2 by default, >= 4) with torch.linspace
  indices, the frame size bounded per frame and by a whole-video pixel budget, resized with torchvision's
  antialiased bicubic on uint8 (`resize_frames`, bit-exact), the frame count padded to a multiple of 2 with the
  last frame; `second_per_grid` = 2 / fps (the processor is not told the real sampling rate).
* Audio: 16 kHz mono, cut to 30 s, 128-bin Whisper log-mels (m3jax.models.logmel); the real frames
  (ceil(samples / 160)) are kept, which is what the processor's `feature_attention_mask` selects.
All numpy/PIL/PyAV on the host: these outputs feed `ThinkerInputs.build`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from m3jax.models.logmel import HOP, N_SAMPLES, log_mel_spectrogram

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
  video_total_pixels: float = 128000 * 28 * 28 * 0.9  # qwen-omni-utils' budget for all frames together
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


def _normalize(img: np.ndarray) -> np.ndarray:
  """[..., H, W, 3] uint8 -> CLIP-normalised float32 [..., 3, H, W]."""
  out = img.astype(np.float32) / 255.0
  out = (out - np.asarray(OPENAI_CLIP_MEAN, np.float32)) / np.asarray(OPENAI_CLIP_STD, np.float32)
  return np.moveaxis(out, -1, -3).astype(np.float32)


def _resize_normalize(img: np.ndarray, h: int, w: int) -> np.ndarray:
  """[H, W, 3] uint8 -> PIL bicubic -> normalised float32 [3, h, w] (images)."""
  return _normalize(np.asarray(Image.fromarray(img).resize((w, h), Image.Resampling.BICUBIC)))


# ----------------------------------------------------------------- torch-exact numerics for the video path
_F32, _F64 = np.float32, np.float64


def _fma32(a, b, c) -> np.ndarray:
  """float32 fused multiply-add (a*b is exact in float64; one rounding to float32 after the add)."""
  return (np.asarray(a, _F64) * np.asarray(b, _F64) + np.asarray(c, _F64)).astype(_F32)


def torch_linspace(start: float, end: float, n: int) -> np.ndarray:
  """torch.linspace(start, end, n) in float32 on CPU, bit for bit (first half from start, second from end)."""
  if n == 1:
    return np.asarray([start], _F32)
  step = _F32((_F32(end) - _F32(start)) / _F32(n - 1))
  i = np.arange(n)
  lo = (_F64(step) * i + _F64(_F32(start))).astype(_F32)
  hi = (_F64(_F32(end)) - _F64(step) * (n - 1 - i)).astype(_F32)
  return np.where(i < n // 2, lo, hi)


def _cubic_aa(x: np.ndarray) -> np.ndarray:
  """torch's antialias bicubic filter (a = -0.5, PIL's), float32 with the CPU kernel's fused multiply-adds."""
  a = _F32(-0.5)
  x = np.abs(x).astype(_F32)
  near = _fma32((_fma32(a + _F32(2), x, -(a + _F32(3))) * x).astype(_F32), x, _F32(1))
  far = _fma32(_fma32(_fma32(a, x, -(_F32(5) * a)), x, _F32(8) * a), x, -(_F32(4) * a))
  return np.where(x < 1, near, np.where(x < 2, far, _F32(0))).astype(_F32)


def _aa_weights(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """(first input index, tap count, normalised float32 weights [n_out, taps]) of torch's `_upsample_bicubic2d_aa`
  (align_corners=False): the filter widens by the scale when downsampling, which is the antialiasing."""
  scale = _F32(n_in) / _F32(n_out)
  support = _F32(2.0 * _F64(scale)) if scale >= 1.0 else _F32(2.0)
  invscale = _F32(1.0 / _F64(scale)) if scale >= 1.0 else _F32(1.0)
  taps = int(np.ceil(support)) * 2 + 1
  center = (_F64(scale) * (np.arange(n_out) + 0.5)).astype(_F32)
  xmin = np.maximum(((center - support).astype(_F64) + 0.5).astype(np.int64), 0)
  xsize = np.minimum(((center + support).astype(_F64) + 0.5).astype(np.int64), n_in) - xmin
  xsize = np.clip(xsize, 0, taps)
  j = np.arange(taps)
  arg = (((j[None] + xmin[:, None]).astype(_F32) - center[:, None]).astype(_F64) + 0.5) * _F64(invscale)
  w = np.where(j[None] < xsize[:, None], _cubic_aa(arg.astype(_F32)), _F32(0))
  total = np.zeros(n_out, _F32)
  for k in range(taps):
    total = (total + w[:, k]).astype(_F32)
  return xmin, xsize, np.where(total[:, None] != 0, w / total[:, None], w).astype(_F32)


def _resample_axis(x: np.ndarray, axis: int, n_out: int) -> np.ndarray:
  """One separable pass along `axis` (float32). The accumulation order is the compiled CPU kernel's: the first
  4*floor((taps-1)/4) adds are plain, the remaining ones fused (this is what makes the result bit-exact)."""
  x = np.moveaxis(x, axis, -1)
  xmin, xsize, w = _aa_weights(x.shape[-1], n_out)
  plain_steps = 4 * ((xsize - 1) // 4)
  out = (x[..., xmin] * w[:, 0]).astype(_F32)
  for k in range(1, w.shape[1]):
    term = x[..., np.minimum(xmin + k, x.shape[-1] - 1)]
    plain = (out + (term * w[:, k]).astype(_F32)).astype(_F32)
    new = np.where(k - 1 < plain_steps, plain, _fma32(term, w[:, k], out))
    out = np.where(k < xsize, new, out)
  return np.moveaxis(out, -1, axis)


def resize_frames(frames: np.ndarray, h: int, w: int) -> np.ndarray:
  """uint8 [..., H, W, 3] -> uint8 [..., h, w, 3], equal to torchvision `F.resize(uint8 TCHW, [h, w], BICUBIC,
  antialias=True)` on CPU (width pass, then height pass, clamp, round half to even)."""
  if frames.shape[-3:-1] == (h, w):
    return frames
  x = frames.astype(_F32)
  if x.shape[-2] != w:
    x = _resample_axis(x, -2, w)
  if x.shape[-3] != h:
    x = _resample_axis(x, -3, h)
  return np.round(np.clip(x, 0, 255)).astype(np.uint8)


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
  """qwen-omni-utils' `smart_nframes` + `torch.linspace(0, total - 1, n).round()`: an even number of frames at
  `cfg.video_fps`, at least 4 (fewer only if the video has fewer)."""
  if total_frames <= 0 or video_fps <= 0:
    raise MediaInputError(f"video has {total_frames} frames at {video_fps} fps")
  f = cfg.temporal_patch_size
  lo = math.ceil(cfg.min_frames / f) * f
  hi = math.floor(min(cfg.max_frames, total_frames) / f) * f
  n = total_frames / video_fps * cfg.video_fps
  n = math.floor(min(min(max(n, lo), hi), total_frames) / f) * f
  if n < f:
    raise MediaInputError(f"video with {total_frames} frames is too short (needs >= {f})")
  return np.round(torch_linspace(0, total_frames - 1, n)).astype(np.int64)


def video_frame_size(n_frames: int, height: int, width: int, cfg: ProcessorConfig = ProcessorConfig()
                     ) -> tuple[int, int]:
  """The resized frame size: per-frame pixel bounds, the max lowered so all frames fit the video budget."""
  budget = max(min(cfg.video_max_pixels, cfg.video_total_pixels / n_frames * cfg.temporal_patch_size),
               int(cfg.video_min_pixels * 1.05))
  return smart_resize(height, width, cfg.factor, cfg.video_min_pixels, min(cfg.video_max_pixels, budget))


def process_video(frames: np.ndarray, cfg: ProcessorConfig = ProcessorConfig(), fps: float | None = None
                  ) -> tuple[np.ndarray, np.ndarray, float]:
  """Already-sampled RGB uint8 frames [T, H, W, 3] -> (patches, grid_thw [3], second_per_grid).

  `fps`: the rate the frames were sampled at; None = `cfg.video_fps`, which is what the reference's processor
  assumes (it is never told the real rate), so second_per_grid = 2 / fps."""
  frames = np.asarray(frames)
  if frames.ndim != 4 or frames.shape[0] == 0:
    raise MediaInputError(f"expected video frames [T, H, W, 3], got shape {frames.shape}")
  _rgb_uint8(frames[0])
  fps = cfg.video_fps if fps is None else fps
  if fps <= 0:
    raise MediaInputError(f"video sampling rate must be positive, got {fps}")
  h, w = video_frame_size(len(frames), frames.shape[1], frames.shape[2], cfg)
  patches, grid = patchify(_normalize(resize_frames(frames, h, w)), cfg)
  return patches, np.asarray(grid, np.int64), cfg.temporal_patch_size / fps


def read_video(path: str, cfg: ProcessorConfig = ProcessorConfig()) -> tuple[np.ndarray, np.ndarray, float]:
  """The sampled frames of a clip file as the reference reads them (decord: every frame counted, the
  `sample_frame_indices` ones kept): (RGB uint8 [n, H, W, 3], frame indices, the sampling rate in fps)."""
  import av
  try:
    with av.open(str(path)) as c:
      if not c.streams.video:
        raise MediaInputError(f"{path} has no video stream")
      stream = c.streams.video[0]
      native = float(stream.average_rate or stream.guessed_rate or 0)
      total = sum(1 for p in c.demux(stream) if p.size)
    idx = sample_frame_indices(total, native, cfg)
    out: list[np.ndarray | None] = [None] * len(idx)
    with av.open(str(path)) as c:
      for i, frame in enumerate(c.decode(video=0)):
        picks = np.flatnonzero(idx == i)  # a short video can pick one frame twice
        if picks.size:
          rgb = frame.to_ndarray(format="rgb24")
          for k in picks:
            out[k] = rgb
        if i >= idx[-1]:
          break
  except av.error.FFmpegError as e:
    raise MediaInputError(f"{path}: cannot decode the video ({e})") from None
  if any(f is None for f in out):
    raise MediaInputError(f"{path}: fewer decodable frames than the {total} packets announce")
  return np.stack(out), idx, len(idx) / total * native


def read_audio(path: str, sample_rate: int = 16000) -> np.ndarray:
  """The audio track of a file as 16 kHz mono float32 (the s16 samples / 32768 for 16-bit 16 kHz input)."""
  import av
  chunks = []
  try:
    with av.open(str(path)) as c:
      if not c.streams.audio:
        raise MediaInputError(f"{path} has no audio stream")
      resampler = av.AudioResampler(format="flt", layout="mono", rate=sample_rate)
      for frame in c.decode(audio=0):
        chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
      chunks += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
  except av.error.FFmpegError as e:
    raise MediaInputError(f"{path}: cannot decode the audio ({e})") from None
  return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


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

