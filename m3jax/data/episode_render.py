"""Renders an `Episode` script to an mp4 (h264 + AAC) with PyAV: real faces composited into frames, espeak-ng
speech mixed into the audio track at its timestamps.

Faces come from photos that ship inside installed packages (scikit-image `astronaut`, `camera`, matplotlib
`grace_hopper.jpg`), cropped to head-and-shoulders around the face; each appearance varies the crop, mirror and
lighting (seeded per clip) so a face recogniser sees the same person under different conditions, as in a real
video. Speech is synthesised once per (voice, text) with espeak-ng and resampled to the episode's rate.
"""

from __future__ import annotations

import functools
import json
import pathlib
import shutil
import subprocess
import tempfile

import av
import numpy as np
import soundfile
from scipy.signal import resample_poly

from m3jax.data.episodes import Episode

# Square head-and-shoulders crops (y0, x0, size) around the face each photo shows (found with dlib HOG).
_CROPS = {"astronaut": (40, 130, 180), "hopper": (80, 110, 330), "camera": (100, 190, 100)}
# Mouths in those crops (x centre, y of the lips' line, half width, jaw height), in crop pixels: from dlib's 5-point
# landmarks on the crops (nose tip N, eye-corner midpoint E, L = N.y - E.y: lips' line at N.y + 0.55 L, jaw height
# 0.65 L), checked by eye on the images; `camera` is a profile, its mouth sits left of the nose tip.
_MOUTHS = {"astronaut": (94.0, 112.0, 24.0, 21.0), "hopper": (160.0, 207.0, 45.0, 40.0),
           "camera": (49.0, 80.0, 14.0, 14.0)}
MOUTH_DROP = 0.45  # the widest jaw drop, as a share of the jaw height (talking_faces)
ENVELOPE_WINDOW_S = 0.05  # a frame's instant of speech envelope (talking_faces)


def load_photo(name: str) -> np.ndarray:
  """RGB uint8 photo; raises if the package that ships it is missing (nothing is downloaded)."""
  if name == "astronaut":
    from skimage import data
    return data.astronaut()
  if name == "camera":
    from skimage import data
    return np.repeat(data.camera()[:, :, None], 3, axis=2)
  if name == "hopper":
    from matplotlib import cbook, image
    with cbook.get_sample_data("grace_hopper.jpg") as f:
      return np.asarray(image.imread(f, format="jpg"))[:, :, :3]
  raise ValueError(f"unknown photo {name!r}")


@functools.lru_cache(maxsize=8)
def _portrait(name: str) -> np.ndarray:
  img = load_photo(name)
  y0, x0, size = _CROPS[name]
  return np.ascontiguousarray(img[y0:y0 + size, x0:x0 + size])


def _resize(img: np.ndarray, size: int) -> np.ndarray:
  """Bilinear resize of a square uint8 image to size x size (numpy only, no extra dependency)."""
  n = img.shape[0]
  pos = (np.arange(size) + 0.5) * n / size - 0.5
  i0 = np.clip(np.floor(pos).astype(int), 0, n - 1)
  i1 = np.clip(i0 + 1, 0, n - 1)
  w = np.clip(pos - i0, 0, 1)
  f = img.astype(np.float32)
  rows = f[i0] * (1 - w)[:, None, None] + f[i1] * w[:, None, None]
  out = rows[:, i0] * (1 - w)[None, :, None] + rows[:, i1] * w[None, :, None]
  return out


def _appearance(name: str, tile: int, rng: np.random.Generator) -> np.ndarray:
  """One appearance of a character: random crop jitter, mirror and lighting on the real photo."""
  return _appearance_and_mouth(name, tile, rng)[0]


def _appearance_and_mouth(name: str, tile: int, rng: np.random.Generator) -> tuple[np.ndarray, tuple[float, ...]]:
  """`_appearance` (the same draws from `rng`) and where its mouth is: (x centre, y of the lips' line, half width,
  jaw height) in tile pixels, `_MOUTHS` mapped through the crop jitter, resize and mirror."""
  base = _portrait(name)
  n = base.shape[0]
  cut = int(rng.integers(0, max(1, n // 12)))
  dy, dx = (int(v) for v in rng.integers(0, cut + 1, size=2))
  crop = base[dy:n - cut + dy, dx:n - cut + dx]
  img = _resize(crop, tile)
  scale = tile / (n - cut)
  cx, my, half, jaw = _MOUTHS[name]
  mouth = [(cx - dx + 0.5) * scale - 0.5, (my - dy + 0.5) * scale - 0.5, half * scale, jaw * scale]
  if rng.random() < 0.5:
    img = img[:, ::-1]
    mouth[0] = tile - 1 - mouth[0]
  gain, bias = float(rng.uniform(0.8, 1.15)), float(rng.uniform(-15, 15))
  return np.clip(img * gain + bias, 0, 255).astype(np.uint8), tuple(mouth)


def _talk(face: np.ndarray, mouth: tuple[float, ...], opening: float) -> np.ndarray:
  """`face` with its mouth open by `opening` in [0, 1]: the rows below the lips' line (lower lip, jaw, chin) pushed
  down by up to `MOUTH_DROP` of the jaw height, tapering to nothing at the jaw's bottom and at the mouth's sides,
  and the gap opened at the lips' line darkened like a mouth's inside. Rows are resampled (linear), all at once."""
  if opening <= 0:
    return face
  size = face.shape[0]
  cx, my, half, jaw = mouth
  drop = MOUTH_DROP * jaw * float(min(opening, 1.0))
  y = np.arange(size, dtype=np.float32)
  # vertical displacement: 0 above the lips, rising to `drop` within 15% of the jaw, held to 60%, 0 at 130%
  g = np.interp(y - my, [0.0, 0.15 * jaw, 0.6 * jaw, 1.3 * jaw], [0.0, 1.0, 1.0, 0.0], left=0.0, right=0.0)
  src = np.clip(y - drop * g, 0, size - 1)
  i0 = np.floor(src).astype(int)
  i1 = np.minimum(i0 + 1, size - 1)
  w = (src - i0)[:, None, None]
  f = face.astype(np.float32)
  warped = f[i0] * (1 - w) + f[i1] * w
  x = np.arange(size, dtype=np.float32)
  side = np.clip(1.3 - np.abs(x - cx) / (1.3 * half) * 1.3, 0, 1)  # columns: 1 near the centre, 0 beyond the sides
  rows = (g > 0)[:, None]
  mixed = np.where(rows[..., None], f * (1 - side[None, :, None]) + warped * side[None, :, None], f)
  # the opened gap (lips' line to lips' line + drop), darkest in the middle of the mouth's width
  inside = ((y >= my) & (y <= my + drop))[:, None] * np.clip(1 - np.abs(x - cx) / (0.8 * half), 0, 1)[None, :]
  mixed *= 1 - 0.7 * inside[..., None]
  return np.clip(mixed, 0, 255).astype(np.uint8)


def _openings(ep: Episode, clip: int, num: int) -> np.ndarray:
  """[present, frame] mouth opening in [0, 1]: the speaker's speech envelope at each frame's instant (RMS over
  `ENVELOPE_WINDOW_S` around it, over the utterance's 95th-percentile level), 0 while they are silent."""
  cfg = ep.config
  script = ep.clips[clip]
  out = np.zeros((len(script.present), num), np.float32)
  times = clip * cfg.clip_seconds + np.arange(num) / cfg.fps
  half = max(1, int(ENVELOPE_WINDOW_S * cfg.sample_rate / 2))
  for u in script.utterances:
    if u.speaker not in script.present:
      continue
    c = ep.character(u.speaker)
    wav = synthesize_speech(u.text, c.voice, c.pitch, cfg.sample_rate)
    power = np.concatenate([[0.0], np.cumsum(wav.astype(np.float64) ** 2)])
    centres = np.arange(half, len(wav) - half, half)
    level = np.sqrt((power[centres + half] - power[centres - half]) / (2 * half))
    ref = float(np.percentile(level, 95)) if level.size else 0.0
    at = np.round((times - u.start) * cfg.sample_rate).astype(int)
    live = (at >= 0) & (at < len(wav))
    if ref <= 0 or not live.any():
      continue
    a, b = np.clip(at[live] - half, 0, len(wav)), np.clip(at[live] + half, 0, len(wav))
    rms = np.sqrt((power[b] - power[a]) / np.maximum(b - a, 1))
    i = script.present.index(u.speaker)
    out[i, live] = np.maximum(out[i, live], np.clip(rms / ref, 0, 1))
  return out


@functools.lru_cache(maxsize=256)
def synthesize_speech(text: str, voice: str, pitch: int, rate: int) -> np.ndarray:
  """espeak-ng speech as float32 mono at `rate` Hz."""
  if shutil.which("espeak-ng") is None:
    raise RuntimeError("espeak-ng is not installed (the set-up command installs it)")
  with tempfile.TemporaryDirectory() as d:
    path = pathlib.Path(d) / "u.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-p", str(pitch), "-s", "150", "-w", str(path), text],
                   check=True, capture_output=True)
    wav, sr = soundfile.read(str(path), dtype="float32")
  if wav.ndim == 2:
    wav = wav.mean(axis=1)
  g = np.gcd(rate, sr)
  return resample_poly(wav, rate // g, sr // g).astype(np.float32) * 0.8


def episode_audio(ep: Episode) -> tuple[np.ndarray, list[tuple[float, float]]]:
  """The whole soundtrack (float32 mono) and each utterance's (start, end) in seconds, in script order."""
  cfg = ep.config
  total = int(round(cfg.num_clips * cfg.clip_seconds * cfg.sample_rate))
  audio = np.zeros(total, np.float32)
  spans = []
  for clip in ep.clips:
    clip_end = (clip.clip + 1) * cfg.clip_seconds
    for u in clip.utterances:
      c = ep.character(u.speaker)
      wav = synthesize_speech(u.text, c.voice, c.pitch, cfg.sample_rate)
      end = u.start + len(wav) / cfg.sample_rate
      if end > clip_end:
        raise ValueError(f"utterance {u.text!r} ({len(wav) / cfg.sample_rate:.1f} s) runs past clip {clip.clip}")
      a = int(round(u.start * cfg.sample_rate))
      audio[a:a + len(wav)] += wav
      spans.append((u.start, round(end, 3)))
  return audio, spans


def _background(cfg, clip: int) -> np.ndarray:
  """A plain room: wall colour per clip, a darker floor band."""
  rng = np.random.default_rng((cfg.seed, clip, 7))
  wall = rng.integers(120, 200, size=3)
  img = np.empty((cfg.height, cfg.width, 3), np.uint8)
  img[:] = wall
  img[int(cfg.height * 0.8):] = (wall * 0.5).astype(np.uint8)
  return img


def _clip_frames(ep: Episode, clip: int):
  """Yields the clip's frames: present characters side by side, swaying a little over time; with
  `config.talking_faces` the speaker's mouth also opens with their speech (`_talk`). The draws from the clip's
  generator are the same either way, so a talking episode shows the same faces in the same places."""
  cfg = ep.config
  script = ep.clips[clip]
  rng = np.random.default_rng((cfg.seed, clip, 11))
  n = len(script.present)
  tile = int(min(cfg.height * 0.62, cfg.width / (n + 0.5)))
  looks = [_appearance_and_mouth(ep.character(name).photo, tile, rng) for name in script.present]
  faces = [face for face, _ in looks]
  bg = _background(cfg, clip)
  gap = (cfg.width - n * tile) / (n + 1)
  top = int((cfg.height - tile) * 0.4)
  phases = rng.uniform(0, 2 * np.pi, size=n)
  num = int(round(cfg.clip_seconds * cfg.fps))
  openings = _openings(ep, clip, num) if cfg.talking_faces else None
  for f in range(num):
    frame = bg.copy()
    for i, face in enumerate(faces):
      x = int(gap + i * (tile + gap) + 4 * np.sin(2 * np.pi * f / (cfg.fps * 5) + phases[i]))
      y = top + int(3 * np.cos(2 * np.pi * f / (cfg.fps * 4) + phases[i]))
      x, y = max(0, min(cfg.width - tile, x)), max(0, min(cfg.height - tile, y))
      if openings is not None:
        face = _talk(face, looks[i][1], float(openings[i, f]))
      frame[y:y + tile, x:x + tile] = face
    yield frame


def render_episode(ep: Episode, out_dir: str | pathlib.Path) -> dict[str, pathlib.Path]:
  """Writes `<id>.mp4` and `<id>.json` (annotations with utterance end times) into out_dir."""
  cfg = ep.config
  out = pathlib.Path(out_dir)
  out.mkdir(parents=True, exist_ok=True)
  video_path, ann_path = out / f"{ep.id}.mp4", out / f"{ep.id}.json"
  audio, spans = episode_audio(ep)
  with av.open(str(video_path), mode="w") as container:
    vs = container.add_stream("libx264", rate=cfg.fps)
    vs.width, vs.height, vs.pix_fmt = cfg.width, cfg.height, "yuv420p"
    vs.options = {"preset": "veryfast", "crf": "23"}
    aus = container.add_stream("aac", rate=cfg.sample_rate, layout="mono")
    for clip in range(cfg.num_clips):
      for frame in _clip_frames(ep, clip):
        for packet in vs.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")):
          container.mux(packet)
    for packet in vs.encode():
      container.mux(packet)
    chunk = 1024
    pcm = (np.clip(audio, -1, 1) * 32767).astype(np.int16)
    for i in range(0, len(pcm), chunk):
      af = av.AudioFrame.from_ndarray(pcm[None, i:i + chunk], format="s16", layout="mono")
      af.sample_rate, af.pts = cfg.sample_rate, i
      for packet in aus.encode(af):
        container.mux(packet)
    for packet in aus.encode():
      container.mux(packet)
  ann = ep.annotations(video_path=str(video_path), mem_path=str(out / f"{ep.id}_memory"))
  k = 0
  for clip in ann[ep.id]["clips"]:
    for u in clip["utterances"]:
      u["end"] = spans[k][1]
      k += 1
  ann_path.write_text(json.dumps(ann, indent=1))
  return {"video": video_path, "annotations": ann_path}
