"""Placeholder token runs that stand for media in the thinker's input ids (the processor's text expansion).

Each medium is <start> + N placeholder ids + <end>, N being the number of encoder output tokens; a video with its
own audio (`use_audio_in_video`) becomes <vision_bos><audio_bos> + per-`seconds_per_chunk` chunks of video then
audio placeholders + <audio_eos><vision_eos>, matching `Qwen2_5OmniProcessor.replace_video_with_audio_token`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np


@dataclass(frozen=True)
class SpecialTokens:
  image: int = 151655
  video: int = 151656
  audio: int = 151646
  vision_bos: int = 151652
  vision_eos: int = 151653
  audio_bos: int = 151647
  audio_eos: int = 151648

  @staticmethod
  def from_hf(thinker: Mapping[str, Any]) -> "SpecialTokens":
    return SpecialTokens(
        image=thinker.get("image_token_index", 151655), video=thinker.get("video_token_index", 151656),
        audio=thinker.get("audio_token_index", 151646), vision_bos=thinker.get("vision_start_token_id", 151652),
        vision_eos=thinker.get("vision_end_token_id", 151653), audio_bos=thinker.get("audio_start_token_id", 151647),
        audio_eos=thinker.get("audio_end_token_id", 151648))


def chunk_bounds(values: np.ndarray, per_chunk: int) -> list[tuple[int, int]]:
  """[start, end) runs of non-decreasing `values` in successive `per_chunk`-wide ranges (empty runs kept)."""
  out, start, chunk = [], 0, 1
  for i, v in enumerate(np.asarray(values).tolist()):
    if v >= chunk * per_chunk:
      out.append((start, i))
      start, chunk = i, chunk + 1
  out.append((start, len(values)))
  return out


def image_ids(tok: SpecialTokens, grid_thw, merge: int) -> list[int]:
  return [tok.vision_bos] + [tok.image] * (int(np.prod(grid_thw)) // merge ** 2) + [tok.vision_eos]


def audio_ids(tok: SpecialTokens, n_tokens: int) -> list[int]:
  return [tok.audio_bos] + [tok.audio] * int(n_tokens) + [tok.audio_eos]


def video_ids(tok: SpecialTokens, grid_thw, merge: int, n_audio_tokens: int | None = None,
              second_per_grid: float = 1.0, position_id_per_seconds: float = 25, seconds_per_chunk: float = 2.0
              ) -> list[int]:
  """Video placeholders; with `n_audio_tokens` the video's audio is interleaved chunk by chunk."""
  t, h, w = (int(x) for x in grid_thw)
  n_frame = (h // merge) * (w // merge)
  if n_audio_tokens is None:
    return [tok.vision_bos] + [tok.video] * (t * n_frame) + [tok.vision_eos]
  v_time = np.repeat(np.arange(t), n_frame) * second_per_grid * position_id_per_seconds
  per_chunk = int(position_id_per_seconds * seconds_per_chunk)
  v_chunks = chunk_bounds(v_time, per_chunk)
  a_chunks = chunk_bounds(np.arange(int(n_audio_tokens)), per_chunk)
  out = [tok.vision_bos, tok.audio_bos]
  for j in range(max(len(v_chunks), len(a_chunks))):
    if j < len(v_chunks):
      out += [tok.video] * (v_chunks[j][1] - v_chunks[j][0])
    if j < len(a_chunks):
      out += [tok.audio] * (a_chunks[j][1] - a_chunks[j][0])
  return out + [tok.audio_eos, tok.vision_eos]
