"""Deterministic little test clips (lossless FFV1 video + PCM audio in Matroska), written identically by the
reference-output generator (make_reference.py, run in a torch+torchvision environment) and by the parity test.

Lossless: every decoder returns exactly the generated RGB frames, so the reference's reader (decord) and m3jax's
(PyAV) see the same pixels. Only numpy and av are needed here.
"""

from __future__ import annotations

import fractions

import av
import numpy as np

# name -> (width, height, fps, seconds): A is downscaled to the patch grid, B upscaled (min_pixels) and sampled at
# a rate that is not 2 fps (33 frames at 10 fps -> 6 frames)
CLIPS = {"a": (160, 90, 25, 4.0), "b": (40, 30, 10, 3.3)}
SAMPLE_RATE = 16000


def frames(name: str) -> np.ndarray:
  w, h, fps, sec = CLIPS[name]
  n = int(round(fps * sec))
  rng = np.random.default_rng(len(name) * 1000 + w)
  yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
  out = []
  for t in range(n):  # moving gradients + a bright square + noise: detail at every scale
    r = 128 + 100 * np.sin(xx / 7.0 + t * 0.3) * np.cos(yy / 5.0)
    g = 255 * (xx + 3 * t) % 256 / 255.0 * (yy / max(h - 1, 1)) * 255 / 255.0
    b = 64 + 0.5 * xx + 0.8 * yy
    img = np.stack([r, g, b], -1) + rng.normal(0, 12, (h, w, 3))
    x0 = (5 + 3 * t) % max(w - 8, 1)
    img[h // 3:h // 3 + 8, x0:x0 + 8] = 250
    out.append(np.clip(np.round(img), 0, 255).astype(np.uint8))
  return np.stack(out)


def audio(name: str) -> np.ndarray:
  _, _, _, sec = CLIPS[name]
  t = np.arange(int(SAMPLE_RATE * sec)) / SAMPLE_RATE
  x = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + np.sin(2 * np.pi * 0.5 * t)) / 2 + 0.05 * np.sin(2 * np.pi * 1800 * t)
  return (np.round(x * 32767) / 32768).astype(np.float32)  # exactly representable as s16


def write(name: str, path: str) -> None:
  w, h, fps, _ = CLIPS[name]
  video, wav = frames(name), audio(name)
  with av.open(path, "w", format="matroska") as c:
    vs = c.add_stream("ffv1", rate=fps)
    vs.width, vs.height, vs.pix_fmt = w, h, "bgr0"
    vs.time_base = fractions.Fraction(1, fps)
    as_ = c.add_stream("pcm_s16le", rate=SAMPLE_RATE)
    as_.layout = "mono"
    for i, img in enumerate(video):
      f = av.VideoFrame.from_ndarray(img, format="rgb24")
      f.pts = i
      for p in vs.encode(f):
        c.mux(p)
    for p in vs.encode():
      c.mux(p)
    pcm = np.round(wav * 32768).astype(np.int16)
    for start in range(0, len(pcm), 1600):
      chunk = pcm[start:start + 1600]
      af = av.AudioFrame.from_ndarray(chunk[None], format="s16", layout="mono")
      af.sample_rate = SAMPLE_RATE
      af.pts = start
      for p in as_.encode(af):
        c.mux(p)
    for p in as_.encode():
      c.mux(p)
