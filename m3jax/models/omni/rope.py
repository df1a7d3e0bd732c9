"""TMRoPE: the thinker's 3-stream (time, height, width) rotary position ids (HF `get_rope_index` equivalent).

Text advances all three streams together. An image/video occupies a (t, h, w) block starting at the next free
position, with time in units of `position_id_per_seconds` (25/s, i.e. 40 ms). Audio advances like text, one id per
40 ms token, so audio and video share a clock. With `use_audio_in_video`, a video's frames and its audio are
interleaved in `seconds_per_chunk` chunks (video chunk, then audio chunk) sharing one start id — the
"time-aligned" part of TMRoPE. Computed on the host in numpy (it depends on token ids and media shapes only, and
HF's quirks — e.g. the next start is 1 + the max of the *last* block, not of everything — are kept exactly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from m3jax.models.omni.placeholders import chunk_bounds


@dataclass(frozen=True)
class RopeIndexConfig:
  image_token_id: int = 151655
  video_token_id: int = 151656
  audio_token_id: int = 151646
  vision_start_token_id: int = 151652
  audio_start_token_id: int = 151647
  position_id_per_seconds: int = 25
  seconds_per_chunk: int = 2
  spatial_merge_size: int = 2

  @staticmethod
  def from_hf(thinker: Mapping[str, Any]) -> "RopeIndexConfig":
    return RopeIndexConfig(
        image_token_id=thinker.get("image_token_index", thinker.get("image_token_id", 151655)),
        video_token_id=thinker.get("video_token_index", thinker.get("video_token_id", 151656)),
        audio_token_id=thinker.get("audio_token_index", thinker.get("audio_token_id", 151646)),
        vision_start_token_id=thinker.get("vision_start_token_id", 151652),
        audio_start_token_id=thinker.get("audio_start_token_id", 151647),
        position_id_per_seconds=thinker.get("position_id_per_seconds", 25),
        seconds_per_chunk=thinker.get("seconds_per_chunk", 2),
        spatial_merge_size=thinker["vision_config"]["spatial_merge_size"])


class RopeIndexError(ValueError):
  """Media placeholders in the token ids do not match the media given."""


def _vision_ids(start: int, grid: Sequence[int], t_index: np.ndarray, m: int) -> np.ndarray:
  lh, lw = int(grid[1]) // m, int(grid[2]) // m
  t = np.repeat(t_index, lh * lw)
  h = np.tile(np.repeat(np.arange(lh), lw), len(t_index))
  w = np.tile(np.arange(lw), len(t_index) * lh)
  return np.stack([t, h, w]).astype(np.int64) + start


def _seq(n: int, start: int) -> np.ndarray:
  return np.broadcast_to(np.arange(n, dtype=np.int64) + start, (3, n))


def _audio_len(n_frames: int) -> int:
  return ((int(n_frames) - 1) // 2 + 1 - 2) // 2 + 1


def _one_sequence(ids: list[int], cfg: RopeIndexConfig, image_grid, video_grid, audio_lens, second_per_grids,
                  use_audio_in_video: bool, counters: list[int]) -> np.ndarray:
  arr = np.asarray(ids)
  vs = np.flatnonzero(arr == cfg.vision_start_token_id)
  after_vs = arr[np.minimum(vs + 1, len(arr) - 1)]
  n_audio = int((arr == cfg.audio_start_token_id).sum())
  n_image = int((after_vs == cfg.image_token_id).sum())
  n_video = int((after_vs == (cfg.audio_start_token_id if use_audio_in_video else cfg.video_token_id)).sum())
  parts: list[np.ndarray] = []
  nxt = lambda: int(parts[-1].max()) + 1 if parts else 0
  st = 0
  m = cfg.spatial_merge_size
  remain = {"image": n_image, "video": n_video, "audio": n_audio}
  never = len(ids) + 1

  def find(tok, kind):
    if remain[kind] <= 0:
      return never
    try:
      return ids.index(tok, st)
    except ValueError:
      return never

  for _ in range(n_image + n_audio + (0 if use_audio_in_video else n_video)):
    ed_i, ed_v = find(cfg.image_token_id, "image"), find(cfg.video_token_id, "video")
    ed_a = find(cfg.audio_token_id, "audio")
    ed = min(ed_i, ed_v, ed_a)
    if ed == never:
      raise RopeIndexError("fewer media placeholder tokens than media start tokens")
    in_video = ed == ed_v and use_audio_in_video
    text_len = ed - st - (2 if in_video else 1)
    if text_len:
      parts.append(_seq(text_len, nxt()))
    parts.append(_seq(1, nxt()))
    if ed == ed_a:
      a_len = _audio_len(audio_lens[counters[2]])
      parts.append(_seq(a_len, nxt()))
      parts.append(_seq(1, nxt()))
      st += text_len + 2 + a_len
      counters[2] += 1
      remain["audio"] -= 1
    elif ed == ed_i:
      grid = image_grid[counters[0]]
      t_index = np.arange(int(grid[0]), dtype=np.int64) * cfg.position_id_per_seconds
      parts.append(_vision_ids(nxt(), grid, t_index, m))
      parts.append(_seq(1, nxt()))
      st += text_len + 2 + int(np.prod(grid)) // m ** 2
      counters[0] += 1
      remain["image"] -= 1
    else:
      grid = video_grid[counters[1]]
      spg = np.float32(second_per_grids[counters[1]])
      t_index = (np.arange(int(grid[0]), dtype=np.float32) * spg * np.float32(cfg.position_id_per_seconds)
                 ).astype(np.int64)
      v_len = int(np.prod(grid)) // m ** 2
      if not in_video:
        parts.append(_vision_ids(nxt(), grid, t_index, m))
        parts.append(_seq(1, nxt()))
        st += text_len + 2 + v_len
      else:
        parts.append(_seq(1, int(parts[-1].max())))  # audio bos shares the vision bos id
        start = nxt()
        a_len = _audio_len(audio_lens[counters[2]])
        audio_ids = _seq(a_len, start)
        video_ids = _vision_ids(start, grid, t_index, m)
        per_chunk = int(cfg.position_id_per_seconds * cfg.seconds_per_chunk)
        v_chunks = chunk_bounds(video_ids[0] - start, per_chunk)
        a_chunks = chunk_bounds(audio_ids[0] - start, per_chunk)
        for j in range(max(len(v_chunks), len(a_chunks))):
          if j < len(v_chunks):
            parts.append(video_ids[:, v_chunks[j][0]:v_chunks[j][1]])
          if j < len(a_chunks):
            parts.append(audio_ids[:, a_chunks[j][0]:a_chunks[j][1]])
        eos = nxt()
        parts.extend([_seq(1, eos), _seq(1, eos)])
        st += text_len + 4 + a_len + v_len
        counters[2] += 1
        remain["audio"] -= 1
      counters[1] += 1
      remain["video"] -= 1
  if st < len(ids):
    parts.append(_seq(len(ids) - st, nxt()))
  out = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)
  if out.shape[1] != len(ids):
    raise RopeIndexError(f"placeholder tokens give {out.shape[1]} positions for {len(ids)} tokens; "
                         "media token counts do not match the media shapes")
  return out


def get_rope_index(input_ids: np.ndarray, cfg: RopeIndexConfig, image_grid_thw: np.ndarray | None = None,
                   video_grid_thw: np.ndarray | None = None, attention_mask: np.ndarray | None = None,
                   use_audio_in_video: bool = False, audio_seqlens: np.ndarray | None = None,
                   second_per_grids: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Returns (positions int64 [3, B, T], rope deltas int64 [B, 1]); padded slots (mask 0) get position 1."""
  input_ids = np.asarray(input_ids)
  B, T = input_ids.shape
  mask = np.ones((B, T), bool) if attention_mask is None else np.asarray(attention_mask) == 1
  if image_grid_thw is None and video_grid_thw is None:
    pos = np.where(mask, np.cumsum(mask, -1) - 1, 1)
    pos = np.broadcast_to(pos, (3, B, T)).copy()
    deltas = pos.max(0).max(-1, keepdims=True) + 1 - mask.sum(-1, keepdims=True)
    return pos.astype(np.int64), deltas.astype(np.int64)
  pos = np.ones((3, B, T), np.int64)
  deltas = np.zeros((B, 1), np.int64)
  counters = [0, 0, 0]  # image, video, audio consumed so far (media are numbered across the batch)
  for b in range(B):
    ids = input_ids[b][mask[b]].tolist()
    seq = _one_sequence(ids, cfg, image_grid_thw, video_grid_thw, audio_seqlens, second_per_grids,
                        use_audio_in_video, counters)
    pos[:, b, mask[b]] = seq
    deltas[b, 0] = seq.max() + 1 - len(ids)
  return pos, deltas
