"""The `omni` memory writer: M3-Agent-Memorization (a Qwen2.5-Omni thinker) watching the clip itself.

Same contract as the other writers (`write(clips) -> list[ClipMemories]`, JSON state): per clip the reference
message (§2.4: prompt, the clip with its audio, each face id with its best crop, the voices' transcripts as JSON)
is generated through the m3jax sampler, parsed tolerantly (code fences, prose, either description key), ids the
model invents are dropped, and a clip whose reply never parses gets the template writer's memories.
`ClipObservation` carries no pixels, so `media_for(clip)` supplies the sampled frames, audio and face crops.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np

from m3jax.agent.observations import ClipMemories, ClipObservation
from m3jax.agent.writers import MEMORY_PROMPT, FallbackState, TemplateWriter, WriterOutputError, parse_writer_output
from m3jax.memory.tags import parse_entities
from m3jax.models.omni.generate import generate
from m3jax.models.omni.processor import ProcessorConfig
from m3jax.models.omni.thinker import Thinker
from m3jax.models.sampling import SamplingConfig
from m3jax.sft.example import ChatTokens, MemoryExample, TextTokenizer, collate, encode_example


@dataclasses.dataclass(frozen=True)
class ClipMedia:
  frames: np.ndarray  # RGB uint8 [T, H, W, 3], already sampled (processor.sample_frame_indices)
  audio: np.ndarray  # 16 kHz mono float32
  face_crops: Mapping[int, np.ndarray]  # face node id -> best RGB crop


def _mmss(seconds: float) -> str:
  s = max(0, int(seconds))
  return f"{s // 60:02d}:{s % 60:02d}"


def clip_example(clip: ClipObservation, media: ClipMedia) -> MemoryExample:
  """The reference inputs of one clip: faces with a crop, voices as {"<voice_N>": [segments]}."""
  voices: dict[str, list[dict[str, str]]] = {}
  for s in clip.speech:
    voices.setdefault(f"<voice_{s.node_id}>", []).append(
        {"start_time": _mmss(s.start), "end_time": _mmss(s.end), "asr": s.text})
  faces = tuple((f.node_id, media.face_crops[f.node_id]) for f in clip.faces if f.node_id in media.face_crops)
  return MemoryExample(media.frames, media.audio, faces, voices)


class OmniWriter(FallbackState):
  """Memories from the Omni thinker; `tokenizer` needs encode(text) and decode(ids)."""
  name = "omni"

  def __init__(self, model: Thinker, tokenizer: TextTokenizer, chat: ChatTokens,
               media_for: Callable[[ClipObservation], ClipMedia], prompt: str = MEMORY_PROMPT,
               processor: ProcessorConfig = ProcessorConfig(), sampling: SamplingConfig | None = None,
               batch: int = 1, length_multiple: int = 256, fallback: TemplateWriter | None = None):
    self.model, self.tok, self.chat, self.media_for = model, tokenizer, chat, media_for
    self.prompt, self.proc, self.batch, self.multiple = prompt, processor, batch, length_multiple
    # the reference decodes with temperature 1e-6, i.e. greedily, up to 4096 tokens
    self.sampling = sampling or SamplingConfig(max_new_tokens=4096, greedy=True, stop_token_ids=(chat.im_end,),
                                               length_buckets=tuple(2 ** k for k in range(8, 17)))
    self.fallback = fallback or TemplateWriter()
    self.failures = 0

  def replies(self, clips: Sequence[ClipObservation]) -> list[str]:
    """Raw generated text per clip, `batch` clips per generation call."""
    out: list[str] = []
    for i in range(0, len(clips), self.batch):
      group = clips[i:i + self.batch]
      enc = [encode_example(clip_example(c, self.media_for(c)), self.prompt, self.tok, self.chat, self.proc,
                            with_target=False) for c in group]
      length = -(-max(len(e.ids) for e in enc) // self.multiple) * self.multiple
      rows = min(b for b in self.sampling.batch_buckets if b >= len(enc))
      batch = collate(self.model.cfg, enc, length, rows)
      res = generate(self.model, batch.inputs, self.sampling)
      stops = set(self.sampling.stop_token_ids)
      out += [self.tok.decode([t for t in res.tokens[b] if t not in stops]) for b in range(len(group))]
    return out

  def write(self, clips: Sequence[ClipObservation]) -> list[ClipMemories]:
    template = self.fallback.write(clips)  # keeps the equivalence votes current
    todo = [i for i, c in enumerate(clips) if c.faces or c.speech]
    out = [ClipMemories() for _ in clips]
    for i, reply in zip(todo, self.replies([clips[i] for i in todo])):
      try:
        epi, sem = parse_writer_output(reply)
      except WriterOutputError:
        self.failures += 1
        out[i] = template[i]
        continue
      known = {("face", f.node_id) for f in clips[i].faces} | {("voice", s.node_id) for s in clips[i].speech}
      keep = lambda xs: tuple(x for x in xs if all((t, n) in known for t, n in parse_entities(x)
                                                   if t in ("face", "voice")))
      out[i] = ClipMemories(keep(epi), keep(sem))
    return out
