"""M3-Bench annotation loading (reference §6) into flat, validated question records.

Both released formats (robot: `timestamp` + `before_clip`; web: neither) and the generated episodes (which add
`evidence_clips`) load into one `BenchQuestion`. Labels are normalised once here so per-type accuracy groups the
same type across files: robot.json still says "Multi-Detail Reasoning" where web.json says "Multi-Evidence
Reasoning" (commit 688a0ed renamed only web), and older copies say "Human Understanding".
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any, Mapping

LABEL_ALIASES = {
  "Multi-Detail Reasoning": "Multi-Evidence Reasoning",
  "Human Understanding": "Person Understanding",
}
QUESTION_TYPES = ("Multi-Evidence Reasoning", "Person Understanding", "Cross-Modal Reasoning",
                  "General Knowledge Extraction", "Multi-Hop Reasoning")
# the released annotation files ship as package data, so the eval config's default works from any checkout or install
BUNDLED_DIR = pathlib.Path(__file__).resolve().with_name("m3bench_annotations")
BUNDLED_SPLITS = ("robot", "web")


class AnnotationError(ValueError):
  """The annotation file is malformed; the message names the video / question and the field."""


def normalize_label(label: str) -> str:
  label = " ".join(label.split())
  return LABEL_ALIASES.get(label, label)


@dataclasses.dataclass(frozen=True)
class BenchQuestion:
  question_id: str
  video_id: str
  question: str
  answer: str
  mem_path: str
  types: tuple[str, ...] = ()
  before_clip: int | None = None
  timestamp: str | None = None
  evidence_clips: tuple[int, ...] = ()
  options: tuple[str, ...] = ()  # multiple-choice options, when the item has them

  @property
  def multiple_choice(self) -> bool:
    return bool(self.options)

  @property
  def evidence_distance(self) -> int | None:
    """Clips between the last evidence clip and the question (`before_clip - max(evidence)`); None if unknown."""
    if self.before_clip is None or not self.evidence_clips:
      return None
    return self.before_clip - max(self.evidence_clips)

  def prompt_text(self) -> str:
    """The question as the controller sees it; multiple-choice options are listed one per line as `A. text`."""
    if not self.options:
      return self.question
    letters = "ABCDEFGHIJ"
    return self.question + "\n" + "\n".join(f"{letters[i]}. {opt}" for i, opt in enumerate(self.options))


def timestamp_to_before_clip(timestamp: str, clip_seconds: int = 30) -> int:
  """`floor(seconds / 30) - 1`: the last clip fully observed before the question (robot annotations)."""
  parts = timestamp.strip().split(":")
  try:
    values = [int(p) for p in parts]
  except ValueError as err:
    raise AnnotationError(f"timestamp {timestamp!r} is not MM:SS or HH:MM:SS") from err
  if not 2 <= len(values) <= 3:
    raise AnnotationError(f"timestamp {timestamp!r} is not MM:SS or HH:MM:SS")
  seconds = 0
  for v in values:
    seconds = seconds * 60 + v
  return seconds // clip_seconds - 1


def parse_annotations(data: Mapping[str, Any], source: str = "<annotations>") -> list[BenchQuestion]:
  """Flattens `{video_id: {mem_path, qa_list: [...]}}` into questions, in file order."""
  if not isinstance(data, Mapping):
    raise AnnotationError(f"{source}: top level must be an object keyed by video id, got {type(data).__name__}")
  out: list[BenchQuestion] = []
  seen: set[str] = set()
  for video_id, video in data.items():
    where = f"{source}: video {video_id!r}"
    if not isinstance(video, Mapping) or "qa_list" not in video:
      raise AnnotationError(f"{where} has no qa_list")
    mem_path = str(video.get("mem_path", ""))
    for n, qa in enumerate(video["qa_list"]):
      qid = str(qa.get("question_id", f"{video_id}_Q{n + 1:02d}"))
      for key in ("question", "answer"):
        if not isinstance(qa.get(key), str):
          raise AnnotationError(f"{where} question {qid!r}: field {key!r} missing or not a string")
      if qid in seen:
        raise AnnotationError(f"{where}: duplicate question_id {qid!r}")
      seen.add(qid)
      types = qa.get("type", [])
      if isinstance(types, str):
        types = [types]
      before_clip = qa.get("before_clip")
      if before_clip is None and qa.get("timestamp"):
        before_clip = timestamp_to_before_clip(qa["timestamp"])
      if before_clip is not None and not isinstance(before_clip, int):
        raise AnnotationError(f"{where} question {qid!r}: before_clip must be an integer, got {before_clip!r}")
      out.append(BenchQuestion(
        question_id=qid, video_id=str(video_id), question=qa["question"], answer=qa["answer"], mem_path=mem_path,
        types=tuple(normalize_label(t) for t in types), before_clip=before_clip, timestamp=qa.get("timestamp"),
        evidence_clips=tuple(int(c) for c in qa.get("evidence_clips", ())),
        options=tuple(str(o) for o in qa.get("options", ()))))
  return out


def bundled_annotations(split: str) -> pathlib.Path:
  """Path of the shipped M3-Bench annotation file of `split` (robot: 1,276 questions, web: 3,214)."""
  if split not in BUNDLED_SPLITS:
    raise ValueError(f"M3-Bench split must be one of {BUNDLED_SPLITS}, got {split!r}")
  return BUNDLED_DIR / f"{split}.json"


def load_annotations(path: str | pathlib.Path) -> list[BenchQuestion]:
  path = pathlib.Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"annotation file not found: {path}")
  try:
    data = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as err:
    raise AnnotationError(f"{path}: not valid JSON ({err})") from err
  return parse_annotations(data, str(path))
