"""The `omni` memory writer: M3-Agent-Memorization (a Qwen2.5-Omni thinker) watching the clip itself.

Same contract as the other writers (`write(clips) -> list[ClipMemories]`, JSON state): per clip the reference
message (§2.4: prompt, the clip with its audio, "Face features:", each face id with its best crop, "Voice
features:", the voices' transcripts as JSON) is generated through the m3jax sampler (greedy, as the reference's
temperature 1e-6), parsed tolerantly (`parse_writer_output`: code fences, prose, either description key), ids the
model invents are dropped, and a clip whose reply never parses (or that has no frames) gets the template
writer's memories.

`ClipObservation` carries no pixels: inside the Memorizer the writer is handed each decoded clip and the graph
(`observe_clip`), and takes the frames, the audio and, for each face node, the crop perception stored for it in
this clip; elsewhere `media_for(clip)` supplies them. `pipeline.make_writer("omni", omni_model=DIR)` loads a local
Hugging Face Qwen2.5-Omni / M3-Agent-Memorization directory (`load_omni_writer`).
"""

from __future__ import annotations

import base64
import dataclasses
import io
import pathlib
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from m3jax.memorize.observations import ClipMemories, ClipObservation
from m3jax.memorize.writers import (MEMORY_PROMPT, FallbackState, TemplateWriter, WriterOutputError,
                                 _mmss, parse_writer_output)
from m3jax.engine.omni_generate import generate
from m3jax.models.omni.processor import MediaInputError, ProcessorConfig, sample_frame_indices
from m3jax.models.omni.thinker import Thinker
from m3jax.engine.sampling import SamplingConfig
from m3jax.models.omni.chat import ChatTokens, MemoryExample, TextTokenizer, collate, encode_example


@dataclasses.dataclass(frozen=True)
class ClipMedia:
  frames: np.ndarray  # RGB uint8 [T, H, W, 3], already sampled (processor.sample_frame_indices / read_video)
  audio: np.ndarray  # 16 kHz mono float32
  face_crops: Mapping[int, np.ndarray]  # face node id -> best RGB crop
  fps: float | None = None  # sampling rate of `frames` when it is not the processor's video_fps


def clip_example(clip: ClipObservation, media: ClipMedia) -> MemoryExample:
  """The reference inputs of one clip: faces with a crop, voices as {"<voice_N>": [segments]}."""
  voices: dict[str, list[dict[str, str]]] = {}
  for s in clip.speech:
    voices.setdefault(f"<voice_{s.node_id}>", []).append(
        {"start_time": _mmss(s.start), "end_time": _mmss(s.end), "asr": s.text})
  faces = tuple((f.node_id, media.face_crops[f.node_id]) for f in clip.faces if f.node_id in media.face_crops)
  return MemoryExample(media.frames, media.audio, faces, voices, fps=media.fps)


def _decode_crop(b64: str) -> np.ndarray:
  from PIL import Image
  with Image.open(io.BytesIO(base64.b64decode(b64))) as im:
    return np.asarray(im.convert("RGB"))


def media_from_clip(clip, obs: ClipObservation, graph, proc: ProcessorConfig = ProcessorConfig()) -> ClipMedia:
  """A memorizer clip (`perception.media.Clip`: frames at the perception fps, 16 kHz audio) as writer media.

  Frames are picked like the reference picks them from the clip file (an even count at `proc.video_fps`); when
  perception decoded fewer per second than that (1 fps by default; `--set perception.face_fps=2` gives the
  reference's 2), every frame is used and their real rate sets the video's time positions. Each face node's
  crop is the one perception stored in the graph for this clip (its best detection, JPEG, like the reference's
  `faces[0]`)."""
  frames = np.asarray(clip.frames)
  if len(frames) == 0:
    raise MediaInputError(f"clip {obs.clip} has no video frames")
  native = len(frames) / clip.duration if clip.duration > 0 else proc.video_fps
  if len(frames) < proc.temporal_patch_size:  # a very short tail clip: repeat its frame
    frames = np.repeat(frames[-1:], proc.temporal_patch_size, axis=0)
  idx = sample_frame_indices(len(frames), native, proc)
  rate = len(idx) / len(frames) * native
  crops = {}
  for f in obs.faces:
    stored = graph.contents[f.node_id] if f.node_id < len(graph.contents) else []
    if stored:
      crops[f.node_id] = _decode_crop(stored[-1])  # appended by this clip's perception
  fps = None if abs(rate - proc.video_fps) <= 0.25 * proc.video_fps else rate
  return ClipMedia(frames[idx], np.asarray(clip.audio, np.float32), crops, fps)


class HFTokenizer:
  """An HF tokenizer as the writer's text tokenizer: plain-text ids (special tokens are inserted by id, never
  parsed from text) and decoding without special tokens (the reference's batch_decode)."""

  def __init__(self, tok):
    self.tok = tok

  def encode(self, text: str) -> list[int]:
    return self.tok.encode(text, add_special_tokens=False)

  def decode(self, ids: Sequence[int]) -> str:
    return self.tok.decode(list(ids), skip_special_tokens=True)


Generate = Callable[[Thinker, Any, SamplingConfig], Any]  # (model, ThinkerInputs, config) -> SampleOutput


class OmniWriter(FallbackState):
  """Memories from the Omni thinker; `tokenizer` needs encode(text) and decode(ids). `generate_fn` is the
  completion step (m3jax.engine.omni_generate.generate: thinker prefill + sampler decode)."""
  name = "omni"

  def __init__(self, model: Thinker, tokenizer: TextTokenizer, chat: ChatTokens,
               media_for: Callable[[ClipObservation], ClipMedia] | None = None, prompt: str = MEMORY_PROMPT,
               processor: ProcessorConfig = ProcessorConfig(), sampling: SamplingConfig | None = None,
               batch: int = 1, length_multiple: int = 256, fallback: TemplateWriter | None = None,
               generate_fn: Generate = generate):
    self.model, self.tok, self.chat, self.media_for = model, tokenizer, chat, media_for
    self.prompt, self.proc, self.batch, self.multiple = prompt, processor, batch, length_multiple
    # the reference decodes with temperature 1e-6, i.e. greedily, up to 4096 tokens
    self.sampling = sampling or SamplingConfig(max_new_tokens=4096, greedy=True, stop_token_ids=(chat.im_end,),
                                               length_buckets=tuple(2 ** k for k in range(8, 17)))
    self.fallback = fallback or TemplateWriter()
    self.generate_fn = generate_fn
    self.failures = 0
    self._observed: dict[int, ClipMedia | MediaInputError] = {}

  def observe_clip(self, clip, obs: ClipObservation, graph) -> None:
    """Memorizer hook, called after perception and before `write`: keeps this clip's media."""
    try:
      self._observed[obs.clip] = media_from_clip(clip, obs, graph, self.proc)
    except MediaInputError as e:
      self._observed[obs.clip] = e

  def _media(self, clip: ClipObservation) -> ClipMedia:
    if self.media_for is not None:
      return self.media_for(clip)
    if clip.clip not in self._observed:
      raise ValueError(f"the omni writer has no media for clip {clip.clip}: pass media_for, or run it inside the "
                       "Memorizer (which calls observe_clip)")
    got = self._observed.pop(clip.clip)
    if isinstance(got, MediaInputError):
      raise got
    return got

  def replies(self, clips: Sequence[ClipObservation], media: Sequence[ClipMedia] | None = None) -> list[str]:
    """Raw generated text per clip, `batch` clips per generation call."""
    media = [self._media(c) for c in clips] if media is None else list(media)
    out: list[str] = []
    stops = set(self.sampling.stop_token_ids)
    for i in range(0, len(clips), self.batch):
      enc = [encode_example(clip_example(c, m), self.prompt, self.tok, self.chat, self.proc, with_target=False)
             for c, m in zip(clips[i:i + self.batch], media[i:i + self.batch])]
      length = -(-max(len(e.ids) for e in enc) // self.multiple) * self.multiple
      rows = min(b for b in self.sampling.batch_buckets if b >= len(enc))
      res = self.generate_fn(self.model, collate(self.model.cfg, enc, length, rows).inputs, self.sampling)
      out += [self.tok.decode([t for t in res.tokens[b] if t not in stops]) for b in range(len(enc))]
    return out

  def write(self, clips: Sequence[ClipObservation]) -> list[ClipMemories]:
    template = self.fallback.write(clips)  # keeps the equivalence votes current
    out = [ClipMemories() for _ in clips]
    todo, media = [], []
    for i, c in enumerate(clips):
      if not (c.faces or c.speech):
        self._observed.pop(c.clip, None)
        continue
      try:
        media.append(self._media(c))
        todo.append(i)
      except MediaInputError:  # e.g. an audio-only clip: nothing for the model to watch
        self.failures += 1
        out[i] = template[i]
    for i, reply in zip(todo, self.replies([clips[i] for i in todo], media) if todo else []):
      try:
        epi, sem = parse_writer_output(reply)
      except WriterOutputError:
        self.failures += 1
        out[i] = template[i]
        continue
      out[i] = self.validated(epi, sem, clips[i], template[i])
    return out


def load_omni_writer(model_dir: str | pathlib.Path, processor: ProcessorConfig | None = None,
                     attention_chunk: int = 1024, max_new_tokens: int = 4096, param_dtype: str = "bfloat16",
                     compute_dtype: str = "bfloat16", mesh=None, batch: int = 1) -> OmniWriter:
  """The omni writer on a local HF Qwen2.5-Omni / M3-Agent-Memorization directory (thinker weights + tokenizer).

  The patch/merge sizes and mel bins of the processor follow the checkpoint; `attention_chunk` bounds attention
  memory on the thousands of tokens a 30-s clip becomes."""
  from m3jax.models.omni.weights import load_thinker
  from m3jax.models.tokenizer import load_tokenizer

  model = load_thinker(str(model_dir), mesh, param_dtype, compute_dtype, attention_chunk)
  hf = load_tokenizer(model_dir)
  chat = ChatTokens(hf.convert_tokens_to_ids("<|im_start|>"), hf.convert_tokens_to_ids("<|im_end|>"),
                    model.cfg.tokens)
  v = model.cfg.vision
  proc = dataclasses.replace(processor or ProcessorConfig(), patch_size=v.patch_size,
                             temporal_patch_size=v.temporal_patch_size, merge_size=v.spatial_merge_size,
                             n_mels=model.cfg.audio.num_mel_bins)
  sampling = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=(chat.im_end,),
                            length_buckets=tuple(2 ** k for k in range(8, 18)))
  return OmniWriter(model, HFTokenizer(hf), chat, processor=proc, sampling=sampling, batch=batch)
