"""Faces in video frames: detection, quality filters, crops and 128-d identity embeddings.

The work is done by a `FaceBackend`; the default `DlibFaceBackend` calls dlib directly with the model files
shipped in `face-recognition-models` (HOG detector, 5-point landmarks, ResNet descriptor), so nothing is
downloaded and `face_recognition` itself is not needed. A Flax face model can replace it by implementing
`FaceBackend.analyze`.

Scores (dlib has no calibrated probability, unlike the reference's insightface):
  det_score  the HOG detector's SVM margin: > 0 for every detection, about 1 or more for clear frontal faces;
  quality    sharpness of the aligned 150x150 face chip (variance of its Laplacian, grey levels 0-255),
             low for blurred or tiny upscaled faces.
Embeddings are L2-normalised dlib descriptors (same-person cosine distance is small; dlib's own 0.6
Euclidean threshold applies to the raw descriptor, whose norm is kept in `raw_norm`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, Sequence

import numpy as np
from jaxtyping import Float, UInt8
from scipy import ndimage

CHIP_SIZE = 150
CHIP_PADDING = 0.25


class ImageInputError(ValueError):
  """A frame that is not an HxWx3 (or HxW) uint8 image."""


@dataclasses.dataclass
class FaceDetection:
  frame_index: int
  bbox: tuple[int, int, int, int]  # x1, y1, x2, y2 in frame pixels, clipped to the frame
  det_score: float
  quality: float
  embedding: Float[np.ndarray, "128"]  # unit norm
  crop: UInt8[np.ndarray, "h w 3"]  # the bbox region of the frame
  raw_norm: float = 0.0


@dataclasses.dataclass(frozen=True)
class FaceFilter:
  """Which detections are worth embedding: applied BEFORE the (expensive) descriptor network runs.

  min_det_score: drops weak detections (dlib false positives on textures sit around 0.1-0.3);
  min_face_size: minimum bbox side in pixels; min_quality: minimum chip sharpness.
  """
  min_det_score: float = 0.5
  min_face_size: int = 32
  min_quality: float = 20.0

  def accepts(self, det_score: float, bbox: tuple[int, int, int, int], quality: float) -> bool:
    size = min(bbox[2] - bbox[0], bbox[3] - bbox[1])
    return det_score >= self.min_det_score and size >= self.min_face_size and quality >= self.min_quality


class FaceBackend(Protocol):
  """Detects faces, keeps those `face_filter` accepts, and embeds them."""

  def analyze(self, frames: Sequence[np.ndarray], face_filter: FaceFilter = FaceFilter()) -> list[FaceDetection]:
    ...


def _models_dir() -> pathlib.Path:
  spec = importlib.util.find_spec("face_recognition_models")
  if spec is None or spec.origin is None:
    raise FileNotFoundError("package 'face-recognition-models' is not installed")
  return pathlib.Path(spec.origin).parent / "models"


def check_frame(frame: np.ndarray, index: int) -> UInt8[np.ndarray, "H W 3"]:
  """Validates a frame and returns it as a contiguous HxWx3 uint8 RGB array (grey frames are expanded)."""
  frame = np.asarray(frame)
  if frame.dtype != np.uint8:
    raise ImageInputError(f"frame {index} must be uint8, got {frame.dtype}")
  if frame.ndim == 2:
    frame = np.repeat(frame[..., None], 3, axis=-1)
  if frame.ndim != 3 or frame.shape[-1] not in (3, 4) or min(frame.shape[:2]) < 1:
    raise ImageInputError(f"frame {index} must be HxWx3 RGB, got shape {frame.shape}")
  return np.ascontiguousarray(frame[..., :3])


def sharpness(chip: UInt8[np.ndarray, "h w 3"]) -> float:
  """Variance of the Laplacian of the grey chip: a standard, cheap blur measure."""
  grey = chip.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
  return float(ndimage.laplace(grey).var())


class DlibFaceBackend:
  """dlib HOG detection + 5-point alignment + ResNet descriptors, frames spread over a thread pool.

  Detection runs per frame in `num_threads` threads (each with its own detector); the descriptor network then
  runs once over the chips of all frames (dlib batches them internally). Detections the filter rejects are
  never embedded. On the 2-core development machine threads gave no speed-up (dlib's HOG scan appears to
  hold the GIL), hence the default of one thread.
  """

  def __init__(self, upsample: int = 1, num_threads: int = 1, models_dir: str | pathlib.Path | None = None):
    import dlib

    root = pathlib.Path(models_dir) if models_dir is not None else _models_dir()
    for name in ("shape_predictor_5_face_landmarks.dat", "dlib_face_recognition_resnet_model_v1.dat"):
      if not (root / name).is_file():
        raise FileNotFoundError(f"dlib model file missing: {root / name}")
    self._dlib = dlib
    self.upsample = upsample
    self.num_threads = max(1, num_threads)
    self._local = threading.local()  # dlib detectors are not documented as thread-safe: one per thread
    self._shape_path = str(root / "shape_predictor_5_face_landmarks.dat")
    self._recognizer = dlib.face_recognition_model_v1(str(root / "dlib_face_recognition_resnet_model_v1.dat"))

  def _tools(self):
    if not hasattr(self._local, "detector"):
      self._local.detector = self._dlib.get_frontal_face_detector()
      self._local.shape = self._dlib.shape_predictor(self._shape_path)
    return self._local.detector, self._local.shape

  def _detect_one(self, item: tuple[int, np.ndarray], face_filter: FaceFilter) -> list[tuple]:
    index, frame = item
    detector, shape_predictor = self._tools()
    rects, scores, _ = detector.run(frame, self.upsample, 0.0)
    found = []
    h, w = frame.shape[:2]
    for rect, score in zip(rects, scores):
      x1, y1 = max(0, rect.left()), max(0, rect.top())
      x2, y2 = min(w, rect.right()), min(h, rect.bottom())
      if x2 <= x1 or y2 <= y1 or not face_filter.accepts(float(score), (x1, y1, x2, y2), np.inf):
        continue
      chip = self._dlib.get_face_chip(frame, shape_predictor(frame, rect), size=CHIP_SIZE, padding=CHIP_PADDING)
      quality = sharpness(chip)
      if face_filter.accepts(float(score), (x1, y1, x2, y2), quality):
        found.append((index, (x1, y1, x2, y2), float(score), chip, frame[y1:y2, x1:x2].copy(), quality))
    return found

  def analyze(self, frames: Sequence[np.ndarray], face_filter: FaceFilter = FaceFilter()) -> list[FaceDetection]:
    items = [(i, check_frame(f, i)) for i, f in enumerate(frames)]
    detect = lambda item: self._detect_one(item, face_filter)
    if self.num_threads > 1 and len(items) > 1:
      with ThreadPoolExecutor(self.num_threads) as pool:
        per_frame = list(pool.map(detect, items))
    else:
      per_frame = [detect(item) for item in items]
    found = [face for faces in per_frame for face in faces]
    if not found:
      return []
    raw = np.asarray(self._recognizer.compute_face_descriptor([f[3] for f in found]), np.float32)
    norms = np.linalg.norm(raw, axis=1)
    return [FaceDetection(frame_index=idx, bbox=bbox, det_score=score, quality=quality,
                          embedding=raw[k] / norms[k], crop=crop, raw_norm=float(norms[k]))
            for k, (idx, bbox, score, _chip, crop, quality) in enumerate(found)]


_DEFAULT_BACKEND: list[FaceBackend] = []


def default_backend() -> FaceBackend:
  """The process-wide dlib backend, built on first use (model files load once)."""
  if not _DEFAULT_BACKEND:
    _DEFAULT_BACKEND.append(DlibFaceBackend())
  return _DEFAULT_BACKEND[0]


def detect_faces(frames: Sequence[np.ndarray], min_det_score: float = 0.5, min_face_size: int = 32,
                 min_quality: float = 20.0, backend: FaceBackend | None = None) -> list[FaceDetection]:
  """All faces in `frames` passing the filters (see `FaceFilter`), in frame order."""
  if isinstance(frames, np.ndarray) and frames.ndim == 3 and frames.shape[-1] in (3, 4):
    raise ImageInputError("pass a sequence of frames, not a single HxWx3 frame")
  return (backend or default_backend()).analyze(frames, FaceFilter(min_det_score, min_face_size, min_quality))


def cluster_faces(embeddings: np.ndarray, threshold: float) -> np.ndarray:
  """Greedy online clustering of unit embeddings: join the most similar centroid if cosine >= threshold."""
  labels = np.full(len(embeddings), -1, np.int64)
  sums: list[np.ndarray] = []
  for i, e in enumerate(embeddings):
    if sums:
      cent = np.stack(sums)
      sims = cent @ e / np.linalg.norm(cent, axis=1)
      j = int(np.argmax(sims))
      if sims[j] >= threshold:
        labels[i] = j
        sums[j] = sums[j] + e
        continue
    labels[i] = len(sums)
    sums.append(e.astype(np.float64))
  return labels
