"""Active-speaker cue: how likely each face track of a clip is the one speaking each voice.

What public active-speaker work does, and why this is smaller:
  * SyncNet (Chung & Zisserman 2016) embeds 0.2-s mouth crops and MFCC windows with two CNNs trained so that
    in-sync pairs are close; the audio-visual offset with the lowest distance, and its margin over the others,
    say whether (and how well) a face speaks the audio.
  * TalkNet (ACM MM 2021) and Light-ASD / LR-ASD (CVPR 2023, IJCV 2025) classify each face-track frame as speaking
    or not from a 25-fps mouth-crop sequence and the audio's MFCCs, with temporal encoders and cross-attention
    (TalkNet ~15 M parameters) or split 2D/3D convolutions and a GRU (LR-ASD ~1 M parameters, 0.6 GFLOPs per
    clip step), trained on AVA-ActiveSpeaker.
  * The two PyPI packages the issue names ship no weights: `deeptalk-asd` 0.3.1 (an ONNX LR-ASD pipeline) fetches
    its ONNX files from GitHub releases at run time and pins numpy 1.26.4, InspireFace and sherpa-onnx;
    `whospoke` 0.4.0 has no model of its own (mouth opening from dlib's 68-point landmarks, not shipped here, or a
    "dark mouth gap" pixel heuristic) and fuses evidence without audio-visual timing.
All of them read the same signal: the mouth moves when, and only when, its voice sounds. On 2 CPU cores, with
episodes rendered at 5 fps and faces detected at 1 fps, a learned 25-fps model would cost more than the rest of
perception and need weights we do not have; the cue itself is cheap to measure directly. So:

  1. each face track's box is placed at every video frame by linear interpolation between its 1-fps detections;
  2. per frame pair, the face's head motion (sway) is removed by the integer shift (within +-`max_shift` px) that
     best aligns the upper face (eyes, forehead) of the previous frame onto the current one, found for all shifts
     at once (a sliding-window view, no loop per pixel); the mouth region's mean absolute change under that same
     shift, less the upper face's residual change (compression noise), is the track's mouth motion at that frame;
  3. a voice's activity is 1 at frames inside its speech segments; its score with a track is the Pearson
     correlation of the track's mouth motion with that activity over the frames where the voice speaks or nobody
     speaks (frames of the other voices are left out: the other speaker's mouth moves there, which says nothing
     about this voice). A speaking face scores high, a listener (still apart from its sway) about 0;
  4. a (face, voice) pair is confident when its score is >= `threshold` AND beats every other face's score for
     that voice by >= `margin`; otherwise the cue declines (a voice whose face is off screen, still photos, two
     faces that move alike).
Everything is numpy on grayscale crops of the faces only: a 30-s 640x360 clip at 5 fps with two face tracks costs
about 0.5 s on 2 cores under load (bench/active_speaker.py reports it per clip).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class ActiveSpeakerConfig:
  # The least correlation of a confident pair. Chosen on dev seeds (python -m bench.active_speaker --seed0 1000000
  # --still --sweep, 11 2-face + 6 3-face talking clips and their still renderings): speaking faces scored
  # 0.65-0.96, every other (face, voice) pair -0.33-0.17, talking or still. 0.5 sits 3x above the highest wrong
  # score and 0.15 below the lowest right one: precision first (a wrong equivalence merges two people), recall
  # still whole on dev.
  threshold: float = 0.5
  margin: float = 0.2  # by how much the best face must beat every other face for that voice (dev: right pairs >= 0.68)
  max_shift: int = 3  # px searched each way to cancel head motion between consecutive frames
  min_frames: int = 8  # fewer usable frames in a score's window: score 0 (no evidence)
  # regions in the face box (fractions of its width / height from its top-left corner); dlib HOG boxes end near
  # the lips, so the jaw region reaches below the box
  mouth: tuple[float, float, float, float] = (0.2, 0.6, 0.8, 1.15)  # x0, y0, x1, y1
  upper: tuple[float, float, float, float] = (0.15, 0.1, 0.85, 0.5)

  def __post_init__(self):
    if not -1.0 <= self.threshold <= 1.0 or self.margin < 0 or self.max_shift < 0 or self.min_frames < 2:
      raise ValueError(f"invalid ActiveSpeakerConfig: {self}")


@dataclasses.dataclass(frozen=True)
class FaceTrack:
  """One face in a clip: its detections' times (clip-relative seconds) and boxes (x1, y1, x2, y2, frame px)."""
  track_id: int
  times: np.ndarray  # (K,)
  boxes: np.ndarray  # (K, 4)


@dataclasses.dataclass(frozen=True)
class VoiceSegment:
  voice_id: int
  start: float  # clip-relative seconds
  end: float


@dataclasses.dataclass(frozen=True)
class SpeakerScores:
  """`pair[track_id][voice_id]`: correlation of the track's mouth motion with the voice's activity (all its
  segments); `segment[track_id][i]`: the same for segment i alone; `motion[track_id]`: per-frame mouth motion."""
  pair: dict[int, dict[int, float]]
  segment: dict[int, list[float]]
  motion: dict[int, np.ndarray]


def tracks_from_detections(detections, labels: Sequence[int], frame_times: np.ndarray) -> list[FaceTrack]:
  """Face tracks from `perception.faces.FaceDetection`s (their `frame_index` into `frame_times`) grouped by
  cluster label (`faces.cluster_faces`)."""
  out = []
  for label in sorted(set(int(l) for l in labels)):
    dets = sorted((d for d, l in zip(detections, labels) if int(l) == label), key=lambda d: d.frame_index)
    times = np.array([float(frame_times[d.frame_index]) for d in dets])
    boxes = np.array([d.bbox for d in dets], np.float64).reshape(-1, 4)
    _, first = np.unique(times, return_index=True)  # one box per time (two faces of one frame in one cluster)
    out.append(FaceTrack(label, times[first], boxes[first]))
  return out


def _boxes_at(track: FaceTrack, times: np.ndarray) -> np.ndarray:
  """(F, 4) box per frame: centre interpolated linearly between detections (held beyond the ends), size the
  track's median (detector jitter in size would read as motion)."""
  centre = (track.boxes[:, :2] + track.boxes[:, 2:]) / 2
  size = np.median(track.boxes[:, 2:] - track.boxes[:, :2], axis=0)
  cx = np.interp(times, track.times, centre[:, 0])
  cy = np.interp(times, track.times, centre[:, 1])
  return np.stack([cx - size[0] / 2, cy - size[1] / 2, cx + size[0] / 2, cy + size[1] / 2], axis=1)


def _region(box: np.ndarray, frac: tuple[float, float, float, float]) -> tuple[int, int, int, int]:
  x1, y1, x2, y2 = box
  w, h = x2 - x1, y2 - y1
  return (int(round(x1 + frac[0] * w)), int(round(y1 + frac[1] * h)),
          int(round(x1 + frac[2] * w)), int(round(y1 + frac[3] * h)))


def _shift_errors(prev: np.ndarray, cur: np.ndarray, x0: int, y0: int, x1: int, y1: int, s: int) -> np.ndarray:
  """(2s+1, 2s+1) mean |cur[region] - prev[region shifted by (dy, dx)]| for every shift, at once; `prev` and `cur`
  are grayscale windows whose (0, 0) is frame pixel (-s, -s) relative to the region coordinates given."""
  window = prev[y0:y1 + 2 * s, x0:x1 + 2 * s]
  views = np.lib.stride_tricks.sliding_window_view(window, (y1 - y0, x1 - x0))
  return np.abs(views - cur[y0 + s:y1 + s, x0 + s:x1 + s]).mean(axis=(2, 3))


def mouth_motion(frames: np.ndarray, times: np.ndarray, track: FaceTrack,
                 cfg: ActiveSpeakerConfig = ActiveSpeakerConfig()) -> np.ndarray:
  """(F,) head-motion-compensated mouth change of `track` between frame t-1 and t (NaN at t=0 and where a region
  leaves the frame or the track is not on screen, i.e. outside its first..last detection +- one frame). `frames`:
  (F, H, W, 3) RGB or (F, H, W) grayscale; only the face's window of each frame is converted."""
  num, height, width = frames.shape[:3]
  out = np.full(num, np.nan)
  if len(track.times) == 0 or num < 2:
    return out
  boxes = _boxes_at(track, times)
  step = float(np.median(np.diff(times))) if num > 1 else 0.0
  seen = (times >= track.times.min() - step) & (times <= track.times.max() + step)
  s = cfg.max_shift
  for t in range(1, num):
    if not (seen[t] and seen[t - 1]):
      continue
    up, mo = _region(boxes[t], cfg.upper), _region(boxes[t], cfg.mouth)
    x0, y0 = min(up[0], mo[0]) - s, min(up[1], mo[1]) - s
    x1, y1 = max(up[2], mo[2]) + s, max(up[3], mo[3]) + s
    if x0 < 0 or y0 < 0 or x1 > width or y1 > height or up[2] <= up[0] or mo[3] <= mo[1] or mo[2] <= mo[0]:
      continue
    prev, cur = (_gray(frames[i, y0:y1, x0:x1]) for i in (t - 1, t))
    rel = lambda r: (r[0] - x0 - s, r[1] - y0 - s, r[2] - x0 - s, r[3] - y0 - s)  # noqa: E731
    err_up = _shift_errors(prev, cur, *rel(up), s)
    dy, dx = np.unravel_index(int(np.argmin(err_up)), err_up.shape)
    err_mo = _shift_errors(prev, cur, *rel(mo), s)
    out[t] = float(err_mo[dy, dx] - err_up[dy, dx])
  return out


def _activity(times: np.ndarray, segments: Sequence[VoiceSegment], step: float) -> np.ndarray:
  """(F,) 1 where the frame pair (t-1, t) ends inside a segment (its mid-time is inside), else 0."""
  mid = times - step / 2
  act = np.zeros(len(times))
  for seg in segments:
    act[(mid >= seg.start) & (mid < seg.end)] = 1.0
  return act


def _correlation(x: np.ndarray, a: np.ndarray, window: np.ndarray, min_frames: int) -> float:
  ok = window & np.isfinite(x)
  if ok.sum() < min_frames:
    return 0.0
  xs, as_ = x[ok] - x[ok].mean(), a[ok] - a[ok].mean()
  den = float(np.sqrt((xs ** 2).sum() * (as_ ** 2).sum()))
  return float((xs * as_).sum() / den) if den > 0 else 0.0


def _gray(img: np.ndarray) -> np.ndarray:
  """float32 luma of an RGB uint8 image (a grayscale one is only cast)."""
  if img.ndim == 2:
    return img.astype(np.float32)
  return img.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)


def speaking_scores(frames: np.ndarray, times: np.ndarray, tracks: Sequence[FaceTrack],
                    segments: Sequence[VoiceSegment],
                    cfg: ActiveSpeakerConfig = ActiveSpeakerConfig()) -> SpeakerScores:
  """Scores of every (track, voice) and (track, segment) of a clip. `frames`: (F, H, W, 3) RGB at the video's
  frame rate (or grayscale (F, H, W)), `times` their clip-relative seconds; `segments` in any order."""
  times = np.asarray(times, np.float64)
  step = float(np.median(np.diff(times))) if len(times) > 1 else 1.0
  anyone = _activity(times, segments, step) > 0
  voices = sorted({s.voice_id for s in segments})
  motion = {tr.track_id: mouth_motion(frames, times, tr, cfg) for tr in tracks}
  pair: dict[int, dict[int, float]] = {}
  per_segment: dict[int, list[float]] = {}
  acts = {v: _activity(times, [s for s in segments if s.voice_id == v], step) for v in voices}
  seg_acts = [_activity(times, [s], step) for s in segments]
  for tr in tracks:
    m = motion[tr.track_id]
    pair[tr.track_id] = {v: _correlation(m, acts[v], (acts[v] > 0) | ~anyone, cfg.min_frames) for v in voices}
    per_segment[tr.track_id] = [_correlation(m, a, (a > 0) | ~anyone, cfg.min_frames) for a in seg_acts]
  return SpeakerScores(pair, per_segment, motion)


def confident_pairs(scores: SpeakerScores, cfg: ActiveSpeakerConfig = ActiveSpeakerConfig()
                    ) -> list[tuple[int, int, float]]:
  """(track_id, voice_id, score) for each voice whose best face clears `threshold` and beats every other face by
  `margin`; a voice without such a face gets nothing (the cue declines)."""
  out = []
  voices = sorted({v for per in scores.pair.values() for v in per})
  for v in voices:
    ranked = sorted(((per[v], tid) for tid, per in scores.pair.items() if v in per), reverse=True)
    if not ranked:
      continue
    best, tid = ranked[0]
    second = ranked[1][0] if len(ranked) > 1 else -np.inf
    if best >= cfg.threshold and best - second >= cfg.margin:
      out.append((tid, v, round(float(best), 4)))
  return out
