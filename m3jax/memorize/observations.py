"""What perception saw in one clip, in graph terms: the structured input every memory writer receives.

WHY a separate record: perception (faces, speech, voices, ASR) resolves identities against the graph before any
memory is written, so writers only ever see global node ids (`<face_N>`, `<voice_N>`) — the reference's protocol
(§2.4) — and a writer can be swapped (template / llm / omni) without touching perception. The record is plain
JSON so it can be cached on disk and replayed to train or compare writers.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class FaceObservation:
  """A face node seen in the clip: how many good detections, when (clip-relative seconds) and where (mean
  horizontal position of the face centre, as a fraction of the frame width: left 0 .. right 1)."""
  node_id: int
  detections: int
  first_seen: float
  last_seen: float
  x_center: float = 0.5


@dataclasses.dataclass(frozen=True)
class SpeechObservation:
  """One speech segment (clip-relative seconds) attributed to a voice node, with its transcript."""
  node_id: int
  start: float
  end: float
  text: str


@dataclasses.dataclass(frozen=True)
class ClipObservation:
  clip: int
  start: float  # seconds from the start of the video
  duration: float
  faces: tuple[FaceObservation, ...] = ()
  speech: tuple[SpeechObservation, ...] = ()
  # the active-speaker cue's confident (face node, voice node, score) pairs; None when the cue did not run
  # (`PerceptionConfig.speaker_fps` 0), () when it ran and was sure of no pair
  speakers: tuple[tuple[int, int, float], ...] | None = None

  @property
  def voice_ids(self) -> list[int]:
    """Distinct voice node ids in order of first speech."""
    out: list[int] = []
    for s in self.speech:
      if s.node_id not in out:
        out.append(s.node_id)
    return out

  def to_json(self) -> dict[str, Any]:
    out = dataclasses.asdict(self)
    if self.speakers is None:  # a record without the cue reads as before it existed
      del out["speakers"]
    return out

  @classmethod
  def from_json(cls, d: dict[str, Any]) -> "ClipObservation":
    speakers = d.get("speakers")
    return cls(clip=int(d["clip"]), start=float(d["start"]), duration=float(d["duration"]),
               faces=tuple(FaceObservation(**f) for f in d.get("faces", ())),
               speech=tuple(SpeechObservation(**s) for s in d.get("speech", ())),
               speakers=None if speakers is None else tuple((int(f), int(v), float(x)) for f, v, x in speakers))


@dataclasses.dataclass(frozen=True)
class ClipMemories:
  """What a writer produced for one clip: episodic events and semantic conclusions (reference order)."""
  episodic: tuple[str, ...] = ()
  semantic: tuple[str, ...] = ()
