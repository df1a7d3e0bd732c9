"""Streaming decode of a video file into 30-s clips, in time order: sampled RGB frames + 16 kHz mono audio.

WHY streaming: a long video cannot sit in memory as frames, and memorization must be resumable, so clips are
produced one at a time from two forward decoders (video and audio, each with its own container handle so neither
buffers the other), starting at the first clip still to do (a seek, then decode forward to the exact time —
`seek` lands on the previous keyframe). Frames are sampled at `fps` and downscaled so the longer side is at most
`max_side` (absurd resolutions cost detection time, not correctness). A decode error mid-file ends the stream
there (a truncated file still yields the clips before the damage); an unreadable file raises `MediaError`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import pathlib
from typing import Iterator

import av
import numpy as np
from jaxtyping import Float, UInt8

SAMPLE_RATE = 16000
log = logging.getLogger(__name__)


class MediaError(ValueError):
  """The file cannot be memorized (missing, empty, not a media file, or no audio and no video stream)."""


@dataclasses.dataclass(frozen=True)
class MediaInfo:
  path: str
  duration: float  # seconds (0 when the container does not say)
  has_video: bool
  has_audio: bool
  width: int
  height: int


@dataclasses.dataclass
class Clip:
  index: int
  start: float  # seconds from the video start
  duration: float  # seconds actually covered by decoded media (<= clip_seconds)
  frames: UInt8[np.ndarray, "F H W 3"]
  frame_times: Float[np.ndarray, "F"]  # clip-relative seconds
  audio: Float[np.ndarray, "T"]  # 16 kHz mono float32, clip-relative


def _open(path: pathlib.Path):
  if not path.is_file():
    raise MediaError(f"{path}: no such file")
  if path.stat().st_size == 0:
    raise MediaError(f"{path}: the file is empty")
  try:
    return av.open(str(path))
  except (av.error.FFmpegError, UnicodeDecodeError) as e:
    raise MediaError(f"{path}: not a readable audio/video file ({e})") from None


def probe(path: str | pathlib.Path) -> MediaInfo:
  path = pathlib.Path(path)
  with _open(path) as c:
    v = c.streams.video[0] if c.streams.video else None
    a = c.streams.audio[0] if c.streams.audio else None
    if v is None and a is None:
      raise MediaError(f"{path}: no video or audio stream")
    dur = float(c.duration / av.time_base) if c.duration else 0.0
    if v is not None and (v.codec_context.width <= 0 or v.codec_context.height <= 0):
      raise MediaError(f"{path}: video stream has no frame size")
    return MediaInfo(str(path), dur, v is not None, a is not None,
                     v.codec_context.width if v is not None else 0, v.codec_context.height if v is not None else 0)


def _target_size(w: int, h: int, max_side: int) -> tuple[int, int]:
  scale = min(1.0, max_side / max(w, h))
  return max(2, int(round(w * scale)) // 2 * 2), max(2, int(round(h * scale)) // 2 * 2)


def _video_frames(path: pathlib.Path, start: float, fps: float, max_side: int) -> Iterator[tuple[float, np.ndarray]]:
  """(time, RGB frame) sampled at `fps` from `start` on; stops quietly at a decode error (truncated file)."""
  with _open(path) as c:
    stream = c.streams.video[0]
    stream.thread_type = "AUTO"
    if start > 0:
      c.seek(int(start * av.time_base), backward=True)
    next_t = math.ceil(start * fps - 1e-6) / fps
    try:
      for frame in c.decode(stream):
        if frame.time is None or frame.time + 1e-6 < next_t:
          continue
        w, h = _target_size(frame.width, frame.height, max_side)
        rgb = frame.to_ndarray(format="rgb24", width=w, height=h) if (w, h) != (frame.width, frame.height) \
            else frame.to_ndarray(format="rgb24")
        yield float(frame.time), rgb
        next_t = (math.floor(frame.time * fps + 1e-6) + 1) / fps
    except av.error.FFmpegError as e:
      log.warning("%s: video decode stopped at a damaged packet (%s)", path, e)


def _audio_chunks(path: pathlib.Path, start: float) -> Iterator[tuple[float, np.ndarray]]:
  """(start time, 16 kHz mono float32 chunk) from `start` on; stops quietly at a decode error."""
  with _open(path) as c:
    stream = c.streams.audio[0]
    if start > 0:
      c.seek(int(start * av.time_base), backward=True)
    resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
    pos = None
    try:
      for frame in c.decode(stream):
        if frame.time is None:
          continue
        for out in resampler.resample(frame):
          pcm = out.to_ndarray().reshape(-1).astype(np.float32)
          if pos is None:
            pos = float(frame.time)
          yield pos, pcm
          pos += len(pcm) / SAMPLE_RATE
      for out in resampler.resample(None):
        pcm = out.to_ndarray().reshape(-1).astype(np.float32)
        yield (pos or 0.0), pcm
        pos = (pos or 0.0) + len(pcm) / SAMPLE_RATE
    except av.error.FFmpegError as e:
      log.warning("%s: audio decode stopped at a damaged packet (%s)", path, e)


def iter_clips(path: str | pathlib.Path, clip_seconds: float = 30.0, fps: float = 1.0, max_side: int = 1280,
               first_clip: int = 0, min_seconds: float = 0.5) -> Iterator[Clip]:
  """Yields the clips `first_clip, first_clip + 1, ...` of the file, in time order, until the media ends.

  A trailing stretch shorter than `min_seconds` (or a clip with nothing decodable) ends the stream.
  """
  path = pathlib.Path(path)
  info = probe(path)
  if clip_seconds <= 0 or fps <= 0:
    raise ValueError(f"clip_seconds and fps must be positive, got {clip_seconds}, {fps}")
  start = first_clip * clip_seconds
  frames = _video_frames(path, start, fps, max_side) if info.has_video else iter(())
  audio = _audio_chunks(path, start) if info.has_audio else iter(())
  pending_frame = next(frames, None)
  pending_audio = next(audio, None)
  index = first_clip
  while pending_frame is not None or pending_audio is not None:
    t0, t1 = index * clip_seconds, (index + 1) * clip_seconds
    imgs, times = [], []
    while pending_frame is not None and pending_frame[0] < t1:
      if pending_frame[0] >= t0:
        times.append(pending_frame[0] - t0)
        imgs.append(pending_frame[1])
      pending_frame = next(frames, None)
    n = int(round(clip_seconds * SAMPLE_RATE))
    buf = np.zeros(n, np.float32)
    filled = 0
    while pending_audio is not None and pending_audio[0] < t1:
      t, pcm = pending_audio
      a = int(round((t - t0) * SAMPLE_RATE))
      lo, hi = max(a, 0), min(a + len(pcm), n)
      if hi > lo:
        buf[lo:hi] = pcm[lo - a:hi - a]
        filled = max(filled, hi)
      if a + len(pcm) > n:  # chunk straddles the clip end: keep the rest for the next clip
        cut = n - a
        pending_audio = (t1, pcm[cut:])
        break
      pending_audio = next(audio, None)
    # Video coverage comes from the container's duration (a sampled frame says nothing about how long the
    # stream runs after it); without one, from the last sampled frame.
    video_end = (info.duration - t0) if info.duration > 0 else ((times[-1] + 1.0 / fps) if times else 0.0)
    covered = min(max(filled / SAMPLE_RATE, video_end if info.has_video else 0.0), clip_seconds)
    if covered < min_seconds:
      return
    frames_arr = np.stack(imgs) if imgs else np.zeros((0, 0, 0, 3), np.uint8)
    yield Clip(index, t0, covered, frames_arr, np.asarray(times, np.float32),
               buf[:int(round(covered * SAMPLE_RATE))] if info.has_audio else np.zeros(0, np.float32))
    index += 1
