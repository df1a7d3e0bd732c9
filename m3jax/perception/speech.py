"""Speech turns: VAD spans, split where the speaker changes, joined across short same-speaker pauses.

The reference asks Gemini for turns and keeps those lasting >= 2 s. Here:
  1. Silero VAD gives speech spans (cut at every pause >= 100 ms);
  2. a span long enough to hold two speakers is scanned with GE2E windows (1.6 s, every 0.4 s): where the
     mean embedding before a point and the one after it are least similar, and below `change_threshold`,
     the span is cut there (recursively);
  3. pieces shorter than `short_piece_s` (too short for a reliable embedding) join the closer-sounding
     neighbour within `merge_gap_s`; then neighbouring groups within `merge_gap_s` whose embeddings agree
     (cosine >= `same_speaker_threshold`) are joined, so a speaker's pauses do not cut a turn;
  4. turns shorter than `min_duration_s` are dropped, as in the reference.
Each returned segment carries its GE2E embedding, so voice matching needs no second pass.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Float

from m3jax.perception import audio as A
from m3jax.perception.vad import SileroVAD
from m3jax.perception.voices import SpeakerEncoder

WINDOW_RATE = 2.5  # GE2E windows per second while looking for speaker changes (hop 0.4 s)
CONTEXT_WINDOWS = 3  # windows averaged on each side of a candidate change point
_WINDOW_SPAN = round(A.PARTIAL_FRAMES / (A.SAMPLE_RATE / WINDOW_RATE / A.HOP))  # hops per window (4)


@dataclasses.dataclass
class SpeechSegment:
  start_s: float
  end_s: float
  embedding: Float[np.ndarray, "256"] | None = None  # GE2E speaker embedding (unit norm)

  @property
  def duration_s(self) -> float:
    return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class SegmentConfig:
  min_duration_s: float = 2.0
  merge_gap_s: float = 0.6
  same_speaker_threshold: float = 0.8
  change_threshold: float = 0.7
  min_piece_s: float = 1.0  # no cut closer than this to a piece's ends
  short_piece_s: float = 1.2  # pieces shorter than this join their most similar neighbour

  def __post_init__(self):
    if self.min_duration_s < 0 or self.merge_gap_s < 0 or self.min_piece_s <= 0:
      raise ValueError(f"SegmentConfig durations must be non-negative (min_piece_s > 0): {self}")


_MODELS: dict[str, object] = {}


def _default(name: str):
  """Process-wide VAD / speaker encoder, loaded once."""
  if name not in _MODELS:
    _MODELS[name] = SileroVAD.load() if name == "vad" else SpeakerEncoder.load()
  return _MODELS[name]


def segment_speech(audio: np.ndarray, sr: int, config: SegmentConfig = SegmentConfig(),
                   vad: SileroVAD | None = None, encoder: SpeakerEncoder | None = None,
                   split_speakers: bool = True) -> list[SpeechSegment]:
  """Speech turns of a mono clip (any sample rate), in time order; [] for empty or speechless audio."""
  wav = A.resample(A.check_audio(audio), sr)
  if wav.size == 0:
    return []
  vad = vad or _default("vad")
  spans = vad.speech_spans(wav, A.SAMPLE_RATE)
  if not spans:
    return []
  encoder = encoder or _default("encoder")
  if split_speakers:
    pieces = _split_at_changes(wav, spans, encoder, config)
    pieces, embeds = _merge_same_speaker(wav, pieces, encoder, config)
  else:
    pieces = _merge_gaps(spans, config.merge_gap_s)
    embeds = [None] * len(pieces)
  keep = [i for i, (a, b) in enumerate(pieces) if (b - a) / A.SAMPLE_RATE >= config.min_duration_s]
  missing = [i for i in keep if embeds[i] is None]
  for i, e in zip(missing, encoder.embed([wav[slice(*pieces[i])] for i in missing])):
    embeds[i] = e
  return [SpeechSegment(pieces[i][0] / A.SAMPLE_RATE, pieces[i][1] / A.SAMPLE_RATE, embeds[i]) for i in keep]


def change_curve(embeds: Float[np.ndarray, "W E"]) -> tuple[np.ndarray, np.ndarray]:
  """(window indices j, cosine) between the mean embedding of the CONTEXT_WINDOWS windows that end before
  window j starts and that of the windows starting at j; a low cosine marks a likely speaker change."""
  k, span = CONTEXT_WINDOWS, _WINDOW_SPAN
  if len(embeds) < 2 * k + span - 1:
    return np.zeros((0,), np.int64), np.zeros((0,))
  csum = np.concatenate([np.zeros((1, embeds.shape[1])), np.cumsum(embeds, axis=0, dtype=np.float64)])
  j = np.arange(k + span - 1, len(embeds) - k + 1)
  left = csum[j - span + 1] - csum[j - span + 1 - k]  # windows j-span-k+1 .. j-span end before window j
  right = csum[j + k] - csum[j]  # windows j .. j+k-1
  return j, (left * right).sum(1) / (np.linalg.norm(left, axis=1) * np.linalg.norm(right, axis=1))


def _split_at_changes(wav: np.ndarray, spans: list[tuple[int, int]], encoder: SpeakerEncoder,
                      cfg: SegmentConfig) -> list[tuple[int, int]]:
  """Cuts every span at its speaker changes; the sliding windows of all spans go through GE2E in one batch."""
  min_windows = 2 * CONTEXT_WINDOWS + _WINDOW_SPAN - 1
  grids, mels = {}, []
  for i, (a, b) in enumerate(spans):
    slices = A.partial_slices(b - a, WINDOW_RATE, 1.0)
    if len(slices) >= min_windows:
      grids[i] = np.array([s for s, _ in slices]) * A.HOP + a
      mels.append(A.utterance_partials(A.normalize_volume(wav[a:b]), WINDOW_RATE, 1.0))
  if not grids:
    return list(spans)
  window_embeds = np.split(encoder.embed_partials(np.concatenate(mels)), np.cumsum([len(m) for m in mels])[:-1])
  min_piece = int(cfg.min_piece_s * A.SAMPLE_RATE)

  def split(e: np.ndarray, starts: np.ndarray, lo: int, hi: int, s0: int, s1: int) -> list[tuple[int, int]]:
    j, cos = change_curve(e[lo:hi])
    pos = starts[lo + j] if j.size else j
    ok = (pos - s0 >= min_piece) & (s1 - pos >= min_piece)
    if not ok.any() or cos[ok].min() >= cfg.change_threshold:
      return [(s0, s1)]
    jj = lo + int(j[ok][np.argmin(cos[ok])])
    cut = int(starts[jj])
    return split(e, starts, lo, jj - _WINDOW_SPAN + 1, s0, cut) + split(e, starts, jj, hi, cut, s1)

  out: list[tuple[int, int]] = []
  embeds_of = dict(zip(grids, window_embeds))
  for i, (a, b) in enumerate(spans):
    out += split(embeds_of[i], grids[i], 0, len(grids[i]), a, b) if i in grids else [(a, b)]
  return out


def _merge_gaps(spans: list[tuple[int, int]], gap_s: float) -> list[tuple[int, int]]:
  out: list[tuple[int, int]] = []
  for a, b in spans:
    if out and (a - out[-1][1]) <= gap_s * A.SAMPLE_RATE:
      out[-1] = (out[-1][0], b)
    else:
      out.append((a, b))
  return out


def _merge_same_speaker(wav: np.ndarray, pieces: list[tuple[int, int]], encoder: SpeakerEncoder,
                        cfg: SegmentConfig) -> tuple[list[tuple[int, int]], list[np.ndarray | None]]:
  """Joins neighbouring pieces across short pauses when they are the same speaker.

  Pieces shorter than `short_piece_s` have unreliable embeddings (a 0.5 s "Good morning." scores as low against
  its own speaker as other voices do), so they are not judged by a threshold: each joins whichever neighbour
  within `merge_gap_s` it resembles more. The remaining groups are then joined when their embeddings agree.
  Returns the turns and their embeddings (None where a join made the group's embedding stale).
  """
  sr = A.SAMPLE_RATE
  if len(pieces) < 2:
    return pieces, [None] * len(pieces)
  near = [pieces[i + 1][0] - pieces[i][1] <= cfg.merge_gap_s * sr for i in range(len(pieces) - 1)]
  short = [(b - a) < cfg.short_piece_s * sr for a, b in pieces]
  # Embeddings are needed for short pieces and their close neighbours (for the choice), and for every group
  # (for the threshold); all of them come from at most two batched calls.
  needed = sorted({j for i in np.flatnonzero(short) for j in (i - 1, i, i + 1)
                   if 0 <= j < len(pieces) and (j == i or near[min(i, j)])})
  emb = dict(zip(needed, encoder.embed([wav[slice(*pieces[j])] for j in needed])))
  join = [False] * (len(pieces) - 1)  # join[i]: pieces i and i+1 go in one group; long-long links decided later
  for i in np.flatnonzero(short):
    left = float(emb[i] @ emb[i - 1]) if i > 0 and near[i - 1] else -np.inf
    right = float(emb[i] @ emb[i + 1]) if i + 1 < len(pieces) and near[i] else -np.inf
    if max(left, right) > -np.inf:
      join[i - 1 if left >= right else i] = True
  groups, members = _groups(pieces, join)
  stale = [g for g, m in enumerate(members) if len(m) > 1 or m[0] not in emb]
  gemb = [emb.get(m[0]) if len(m) == 1 else None for m in members]
  for g, e in zip(stale, encoder.embed([wav[slice(*groups[g])] for g in stale])):
    gemb[g] = e
  out, out_emb, exact = [groups[0]], [gemb[0]], [True]
  for g, e in zip(groups[1:], gemb[1:]):
    close = g[0] - out[-1][1] <= cfg.merge_gap_s * sr
    if close and float(out_emb[-1] @ e) >= cfg.same_speaker_threshold:
      out[-1] = (out[-1][0], g[1])
      merged = out_emb[-1] + e  # running direction of the joined turn, used for the next comparison only
      out_emb[-1], exact[-1] = merged / np.linalg.norm(merged), False
    else:
      out.append(g)
      out_emb.append(e)
      exact.append(True)
  return out, [e if ok else None for e, ok in zip(out_emb, exact)]


def _groups(pieces: list[tuple[int, int]], join: list[bool]) -> tuple[list[tuple[int, int]], list[list[int]]]:
  """Spans of the runs of joined pieces, and the piece indices in each run."""
  out, members = [pieces[0]], [[0]]
  for i, joined in enumerate(join, start=1):
    if joined:
      out[-1] = (out[-1][0], pieces[i][1])
      members[-1].append(i)
    else:
      out.append(pieces[i])
      members.append([i])
  return out, members
