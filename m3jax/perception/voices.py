"""Voice identities: batched GE2E embeddings of many speech segments.

Every segment is cut into Resemblyzer's 1.6 s partials; the partials of ALL segments go through the jitted
encoder together, padded to a power-of-two batch bucket (so only a handful of shapes ever compile), and each
segment's embedding is the L2-normalised mean of its partials, as in `VoiceEncoder.embed_utterance`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np
from flax import nnx
from jaxtyping import Float

from m3jax.models.ge2e import GE2E
from m3jax.perception import audio as A

MIN_BUCKET = 8


class SilentSegmentError(A.AudioInputError):
  """A segment with no signal energy has no speaker."""


class SpeakerEncoder:
  """Speaker embeddings (256-d, unit norm) for 16 kHz float32 speech segments."""

  def __init__(self, model: GE2E, max_batch: int = 256):
    self.graphdef, self.state = nnx.split(model)
    self.max_batch = max_batch
    self._forward = jax.jit(lambda state, mels: nnx.merge(self.graphdef, state)(mels))

  @classmethod
  def load(cls, path: str | None = None, max_batch: int = 256) -> "SpeakerEncoder":
    """The GE2E model with Resemblyzer's shipped weights (or a `pretrained.pt` at `path`)."""
    return cls(GE2E.from_resemblyzer(path), max_batch=max_batch)

  def embed_partials(self, mels: Float[np.ndarray, "P 160 40"]) -> Float[np.ndarray, "P 256"]:
    """Runs the encoder over partial mel windows in bucketed chunks of at most `max_batch`."""
    out = []
    for start in range(0, len(mels), self.max_batch):
      chunk = mels[start:start + self.max_batch]
      bucket = max(MIN_BUCKET, 1 << (len(chunk) - 1).bit_length())
      padded = np.zeros((bucket,) + chunk.shape[1:], np.float32)
      padded[:len(chunk)] = chunk
      padded[len(chunk):] = 1.0  # keeps padded rows finite (all-zero mels give a 0/0 norm)
      out.append(np.asarray(self._forward(self.state, padded))[:len(chunk)])
    return np.concatenate(out) if out else np.zeros((0, 256), np.float32)

  def embed(self, segments: Sequence[np.ndarray], rate: float = 1.3,
            min_coverage: float = 0.75, normalize: bool = True) -> Float[np.ndarray, "N 256"]:
    """One embedding per 16 kHz segment; `normalize` raises quiet audio to -30 dBFS like Resemblyzer."""
    partials, owners = [], []
    for i, seg in enumerate(segments):
      wav = A.check_audio(seg, f"segment {i}")
      if wav.size == 0:
        raise A.AudioInputError(f"segment {i} is empty")
      if not np.any(wav):
        raise SilentSegmentError(f"segment {i} is silent (all zeros); it has no speaker")
      mels = A.utterance_partials(A.normalize_volume(wav) if normalize else wav, rate, min_coverage)
      partials.append(mels)
      owners.append(np.full(len(mels), i))
    if not partials:
      return np.zeros((0, 256), np.float32)
    embeds = self.embed_partials(np.concatenate(partials))
    owner = np.concatenate(owners)
    sums = np.zeros((len(partials), embeds.shape[1]), np.float64)
    np.add.at(sums, owner, embeds)
    means = sums / np.bincount(owner)[:, None]
    return (means / np.linalg.norm(means, axis=1, keepdims=True)).astype(np.float32)
