"""One clip's perception, resolved against the memory graph: faces → identities, speech → voices + transcripts.

Order per clip (reference §2.2–2.3, with its known faults fixed):
  faces: detect at the sampled frames, quality filter, cluster within the clip by cosine to running centroids
         (any cluster size: a clip showing one person yields that person's face node — the reference's HDBSCAN
         with `allow_single_cluster=False` drops it), best `faces_per_cluster` detections → graph face match;
  voices: speech turns (VAD + speaker-change split) with GE2E embeddings → Whisper transcripts → graph voice
         match, segment by segment in time order.
The graph assigns node ids; the returned `ClipObservation` is what memory writers see.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import io
import time
from typing import Callable

import numpy as np

from m3jax.perception.media import SAMPLE_RATE, Clip
from m3jax.memorize.observations import ClipObservation, FaceObservation, SpeechObservation
from m3jax.memory.graph import MemoryGraph
from m3jax.perception.active_speaker import (ActiveSpeakerConfig, VoiceSegment, confident_pairs, speaking_scores,
                                             tracks_from_detections)
from m3jax.perception.asr_models import DEFAULT_ASR, check_name
from m3jax.perception.faces import DlibFaceBackend, FaceDetection, cluster_faces, detect_faces
from m3jax.perception.speech import SegmentConfig, segment_speech


@dataclasses.dataclass(frozen=True)
class PerceptionConfig:
  """Perception settings; thresholds are cosines of unit embeddings (dlib faces 128-d, GE2E voices 256-d)."""
  face_fps: float = 1.0
  face_upsample: int = 0
  max_side: int = 1280
  min_det_score: float = 0.5
  min_face_size: int = 40
  min_face_quality: float = 20.0
  face_cluster_threshold: float = 0.94
  min_cluster_size: int = 1
  faces_per_cluster: int = 3
  min_speech_seconds: float = 1.0
  split_speakers: bool = True
  # frames per second read for the active-speaker cue (which face speaks each voice; face–voice equivalences come
  # from it instead of from clips with one face and one voice); 0 = off. Faces are still detected at `face_fps`
  speaker_fps: float = 0.0
  speaker: ActiveSpeakerConfig = ActiveSpeakerConfig()

  def __post_init__(self):
    if self.face_fps <= 0 or self.max_side < 32 or self.faces_per_cluster < 1 or self.min_cluster_size < 1:
      raise ValueError(f"invalid PerceptionConfig: {self}")
    if not -1.0 <= self.face_cluster_threshold <= 1.0:
      raise ValueError(f"face_cluster_threshold must be a cosine in [-1, 1], got {self.face_cluster_threshold}")
    if self.speaker_fps < 0 or 0 < self.speaker_fps < self.face_fps:
      raise ValueError(f"speaker_fps must be 0 (off) or >= face_fps ({self.face_fps}), got {self.speaker_fps}")

  @property
  def decode_fps(self) -> float:
    """The rate clips are decoded at: the cue's when it runs, else the face detector's."""
    return max(self.face_fps, self.speaker_fps)

  def settings_dict(self) -> dict:
    """The fields for records and cache keys, less the cue's when it is off: memories and keys made before the
    cue existed stay valid, and a run with the cue gets its own."""
    out = dataclasses.asdict(self)
    if not self.speaker_fps:
      for k in SPEAKER_FIELDS:
        del out[k]
    return out


SPEAKER_FIELDS = ("speaker_fps", "speaker")  # absent from a record = the cue was off


@dataclasses.dataclass
class PerceptionModels:
  """The embedded default models, loaded once per process (see `load`)."""
  faces: object
  vad: object
  encoder: object
  asr: object
  text: object

  @classmethod
  def load(cls, face_upsample: int = 0, asr: str = DEFAULT_ASR) -> "PerceptionModels":
    """`asr`: the Whisper model by name (`asr_models.ASR_MODELS`, the `memorize.asr` setting)."""
    return _load_models(int(face_upsample), check_name(asr))


@functools.lru_cache(maxsize=4)
def _load_models(face_upsample: int, asr: str) -> PerceptionModels:
  from m3jax.memory.embedders import make_embedder
  from m3jax.perception.asr import Transcriber
  from m3jax.perception.vad import SileroVAD
  from m3jax.perception.voices import SpeakerEncoder
  return PerceptionModels(DlibFaceBackend(upsample=face_upsample), SileroVAD.load(), SpeakerEncoder.load(),
                          Transcriber.load(asr), make_embedder("minilm"))


def _jpeg_b64(crop: np.ndarray) -> str:
  from PIL import Image
  buf = io.BytesIO()
  Image.fromarray(crop).save(buf, format="JPEG", quality=80)
  return base64.b64encode(buf.getvalue()).decode("ascii")


def detection_frames(times: np.ndarray, fps: float) -> np.ndarray:
  """Indices of the frames a decode at `fps` would have kept from these denser ones: the first at or after each
  multiple of 1/fps (`media._video_frames`' rule), so faces detected on a clip decoded for the cue are those of a
  plain decode."""
  bins = np.floor(np.asarray(times, np.float64) * fps + 1e-6)
  return np.flatnonzero(np.r_[True, bins[1:] > bins[:-1]]) if len(bins) else np.zeros(0, np.int64)


def perceive_faces(clip: Clip, graph: MemoryGraph, models: PerceptionModels,
                   cfg: PerceptionConfig) -> tuple[list[FaceObservation], list]:
  """The clip's face observations, and its face tracks (`active_speaker.FaceTrack`, track id = face node) for
  the cue."""
  if len(clip.frames) == 0 or min(clip.frames.shape[1:3]) < cfg.min_face_size:
    return [], []
  idx = detection_frames(clip.frame_times, cfg.face_fps) if cfg.speaker_fps else np.arange(len(clip.frames))
  found: list[FaceDetection] = detect_faces([clip.frames[i] for i in idx], min_det_score=cfg.min_det_score,
                                            min_face_size=cfg.min_face_size, min_quality=cfg.min_face_quality,
                                            backend=models.faces)
  if not found:
    return [], []
  times_at = np.asarray(clip.frame_times, np.float64)[idx]
  labels = cluster_faces(np.stack([f.embedding for f in found]), cfg.face_cluster_threshold)
  clusters = [[f for f, l in zip(found, labels) if l == k] for k in range(labels.max() + 1)]
  clusters = [c for c in clusters if len(c) >= cfg.min_cluster_size]
  if not clusters:
    return [], []
  best = [sorted(c, key=lambda f: (-f.det_score, -f.quality))[:cfg.faces_per_cluster] for c in clusters]
  ids = graph.add_faces([np.stack([f.embedding for f in b]) for b in best],
                        crops=[[_jpeg_b64(b[0].crop)] for b in best])
  width = clip.frames.shape[2]
  obs: dict[int, FaceObservation] = {}
  for node, c in zip(ids, clusters):
    times = [float(times_at[f.frame_index]) for f in c]
    xs = [(f.bbox[0] + f.bbox[2]) / 2 / width for f in c]
    prev = obs.get(node)
    if prev is not None:  # two clusters of one clip matched the same node
      times += [prev.first_seen, prev.last_seen]
      xs += [prev.x_center] * prev.detections
    obs[node] = FaceObservation(node, len(xs), min(times), max(times), round(float(np.mean(xs)), 3))
  tracks = tracks_from_detections([f for c in clusters for f in c],
                                  [node for node, c in zip(ids, clusters) for _ in c], times_at)
  return sorted(obs.values(), key=lambda o: (o.first_seen, o.node_id)), tracks


def speaking_pairs(clip: Clip, tracks: list, speech: list[SpeechObservation],
                   cfg: PerceptionConfig) -> tuple[tuple[int, int, float], ...]:
  """The cue's confident (face node, voice node, score) pairs: each voice whose mouth-motion correlation with
  one face clears the threshold and beats every other face by the margin (`active_speaker.confident_pairs`)."""
  if not tracks or not speech:
    return ()
  segments = [VoiceSegment(s.node_id, s.start, s.end) for s in speech]
  scores = speaking_scores(clip.frames, np.asarray(clip.frame_times, np.float64), tracks, segments, cfg.speaker)
  return tuple(confident_pairs(scores, cfg.speaker))


def perceive_speech(clip: Clip, graph: MemoryGraph, models: PerceptionModels, cfg: PerceptionConfig,
                    timer: Callable[[str, float], None] = lambda name, dt: None) -> list[SpeechObservation]:
  if clip.audio.size < SAMPLE_RATE * cfg.min_speech_seconds:
    return []
  t = time.perf_counter()
  segs = segment_speech(clip.audio, SAMPLE_RATE, SegmentConfig(min_duration_s=cfg.min_speech_seconds),
                        vad=models.vad, encoder=models.encoder, split_speakers=cfg.split_speakers)
  timer("voices", time.perf_counter() - t)
  if not segs:
    return []
  t = time.perf_counter()
  texts = models.asr.transcribe([clip.audio[int(s.start_s * SAMPLE_RATE):int(s.end_s * SAMPLE_RATE)]
                                 for s in segs])
  timer("asr", time.perf_counter() - t)
  ids = graph.add_voices(np.stack([s.embedding for s in segs]), asr=texts)
  return [SpeechObservation(node, round(s.start_s, 2), round(s.end_s, 2), text)
          for node, s, text in zip(ids, segs, texts)]


def perceive_clip(clip: Clip, graph: MemoryGraph, models: PerceptionModels, cfg: PerceptionConfig,
                  timer: Callable[[str, float], None] = lambda name, dt: None) -> ClipObservation:
  """Faces then voices (both inserted into `graph`), then the active-speaker cue when it is on, timed per stage
  (faces, voices, asr, speakers) through `timer`."""
  t = time.perf_counter()
  faces, tracks = perceive_faces(clip, graph, models, cfg)
  timer("faces", time.perf_counter() - t)
  speech = perceive_speech(clip, graph, models, cfg, timer)
  speakers = None
  if cfg.speaker_fps:
    t = time.perf_counter()
    speakers = speaking_pairs(clip, tracks, speech, cfg)
    timer("speakers", time.perf_counter() - t)
  return ClipObservation(clip.index, clip.start, clip.duration, tuple(faces), tuple(speech), speakers)
