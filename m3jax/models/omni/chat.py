"""One memorization example -> thinker token ids + media + loss mask, in the reference prompt layout (§2.4).

The user turn is: the memory prompt, the clip (video with its audio interleaved, `use_audio_in_video`), "Face
features:", then per face "<face_N>:" and its best crop, "Voice features:", and the voices' transcripts as JSON.
Text items are concatenated without separators, as the Qwen2.5-Omni chat template does. For training the
assistant turn is the target memory JSON + <|im_end|>, and only those tokens carry loss.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Protocol, Sequence

import flax.struct
import numpy as np

from m3jax.models.omni.audio import audio_output_lengths
from m3jax.models.omni.placeholders import SpecialTokens, image_ids, video_ids
from m3jax.models.omni.processor import ProcessorConfig, process_audio, process_image, process_video
from m3jax.models.omni.thinker import ThinkerConfig, ThinkerInputs

# Qwen2.5-Omni's default system prompt (what its chat template inserts when none is given).
DEFAULT_SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
                  "auditory and visual inputs, as well as generating text and speech.")


class TextTokenizer(Protocol):
  def encode(self, text: str) -> list[int]:
    ...


@dataclasses.dataclass(frozen=True)
class ChatTokens:
  """Ids of the chat markers (Qwen: 151644/151645) and of the media markers."""
  im_start: int = 151644
  im_end: int = 151645
  media: SpecialTokens = SpecialTokens()


@dataclasses.dataclass(frozen=True)
class MemoryExample:
  """A clip and its expected memories. frames: sampled RGB uint8 [T, H, W, 3]; audio: 16 kHz mono (may be empty);
  faces: (node id, RGB crop); voices: {"<voice_N>": [{"start_time", "end_time", "asr"}]}; target: reply JSON;
  fps: the frames' sampling rate when it is not the processor's `video_fps` (None: it is, as for the reference)."""
  frames: np.ndarray
  audio: np.ndarray
  faces: tuple[tuple[int, np.ndarray], ...]
  voices: dict
  target: str = ""
  fps: float | None = None


@dataclasses.dataclass(frozen=True)
class EncodedExample:
  ids: np.ndarray  # int32 [T]
  loss_mask: np.ndarray  # bool [T]: token t is a target (predicted from position t-1)
  image_patches: np.ndarray | None
  image_grids: np.ndarray | None
  video_patches: np.ndarray
  video_grid: np.ndarray
  second_per_grid: float
  audio_features: np.ndarray | None
  audio_lengths: np.ndarray | None


def encode_example(ex: MemoryExample, prompt: str, tok: TextTokenizer, chat: ChatTokens = ChatTokens(),
                   proc: ProcessorConfig = ProcessorConfig(), with_target: bool = True,
                   system: str = DEFAULT_SYSTEM) -> EncodedExample:
  """Token ids of the reference chat (+ target when `with_target`, else ending in the generation prompt)."""
  m = proc.merge_size
  vp, vgrid, spg = process_video(ex.frames, proc, ex.fps)
  audio = ex.audio
  if audio is None or not len(audio):  # a silent clip still gets its (silent) audio stream, as for the reference
    audio = np.zeros(int(len(ex.frames) / (ex.fps or proc.video_fps) * 16000), np.float32)
  feats, lens = process_audio([audio], proc)
  n_audio = int(audio_output_lengths(lens)[0])
  ids: list[int] = [chat.im_start] + tok.encode("system\n" + system) + [chat.im_end] + tok.encode("\n")
  ids += [chat.im_start] + tok.encode("user\n" + prompt)
  ids += video_ids(chat.media, vgrid, m, n_audio, spg)
  ids += tok.encode("Face features:")
  patches, grids = [], []
  for node, crop in ex.faces:
    p, g = process_image(crop, proc)
    patches.append(p)
    grids.append(g)
    ids += tok.encode(f"<face_{node}>:") + image_ids(chat.media, g, m)
  ids += tok.encode("Voice features:" + json.dumps(ex.voices)) + [chat.im_end] + tok.encode("\n")
  ids += [chat.im_start] + tok.encode("assistant\n")
  mask = [False] * len(ids)
  if with_target:
    target = tok.encode(ex.target) + [chat.im_end]
    ids += target
    mask += [True] * len(target)
  return EncodedExample(np.asarray(ids, np.int32), np.asarray(mask, bool),
                        np.concatenate(patches) if patches else None, np.stack(grids) if grids else None,
                        vp, vgrid[None], spg, feats, lens)


@flax.struct.dataclass
class Batch:
  inputs: ThinkerInputs
  labels: np.ndarray  # int32 [B, T]: labels[b, t] = ids[b, t + 1] (0 past the end)
  weights: np.ndarray  # float32 [B, T]: 1 where labels[b, t] is a target token


def collate(cfg: ThinkerConfig, rows: Sequence[EncodedExample], length: int, batch: int | None = None) -> Batch:
  """Right-pads `rows` to [batch, length] (pad rows are empty) and packs their media in row order."""
  batch = batch or len(rows)
  if len(rows) > batch or any(len(r.ids) > length for r in rows):
    raise ValueError(f"{len(rows)} rows / longest {max(len(r.ids) for r in rows)} tokens do not fit "
                     f"[{batch}, {length}]")
  ids = np.zeros((batch, length), np.int32)
  lengths = np.zeros(batch, np.int32)
  labels = np.zeros((batch, length), np.int32)
  weights = np.zeros((batch, length), np.float32)
  for b, r in enumerate(rows):
    n = len(r.ids)
    ids[b, :n], lengths[b] = r.ids, n
    labels[b, :n - 1] = r.ids[1:]
    weights[b, :n - 1] = r.loss_mask[1:]
  lengths[len(rows):] = 1  # an empty pad row still needs one (masked) token for the attention softmax

  def cat(xs):
    xs = [x for x in xs if x is not None]
    return np.concatenate(xs) if xs else None

  def cat_cols(xs):
    xs = [x for x in xs if x is not None]
    return np.concatenate(xs, axis=1) if xs else None

  inputs = ThinkerInputs.build(
      cfg, ids, lengths, cat(r.image_patches for r in rows), cat(r.image_grids for r in rows),
      cat(r.video_patches for r in rows), cat(r.video_grid for r in rows),
      np.asarray([r.second_per_grid for r in rows], np.float32), cat_cols(r.audio_features for r in rows),
      cat(r.audio_lengths for r in rows), use_audio_in_video=True)
  return Batch(inputs, labels, weights)


class ByteTokenizer:
  """Bytes as ids 0..255 (+ `offset`): a vocabulary for tiny from-scratch thinkers (tests, benchmarks), whose
  special and media ids then live above 255."""

  def __init__(self, offset: int = 0):
    self.offset = offset

  def encode(self, text: str) -> list[int]:
    return [b + self.offset for b in text.encode("utf-8")]

  def decode(self, ids: Sequence[int]) -> str:
    return bytes(i - self.offset for i in ids if self.offset <= i < self.offset + 256).decode("utf-8", "replace")
