"""Memory writers: turn one clip's perception (`ClipObservation`) into episodic and semantic memories.

All writers share one batched interface, `write(clips) -> list[ClipMemories]`, plus a JSON state so a resumed
memorization continues exactly where it stopped:
  * `TemplateWriter` — deterministic memories straight from perception ("<face_3> is present.",
    "<voice_5> says: "..."", "<voice_5>'s name is Lily." for self-introductions) and face–voice equivalences,
    voted across clips so a single noisy clip cannot tie a voice to the wrong face. The votes come from the
    active-speaker cue's confident pairs when perception ran it (`PerceptionConfig.speaker_fps`), else from clips
    with exactly one visible face and one voice (the paper's meta-clip idea; wrong when the voice is off screen).
    Model-backed writers take their equivalences from the cue too when it ran: a text model cannot see who speaks.
  * `LLMWriter` — a text LLM writes both memory kinds from the structured perception under the reference prompt's
    JSON contract (either `video_description` or `video_descriptions`, plus `high_level_conclusions`), with bounded
    retries; a memory naming an entity the clip's perception does not hold (an invented id, any face tag in a clip
    where no face was detected) is dropped and counted (`dropped`), and a clip whose output never parses falls
    back to the template memories (the reference writes nothing for it). With an adapter (`trained_writer`) the
    LLM carries LoRA adapters trained by `train.py sft --config configs/sft_writer.py`.
"""

from __future__ import annotations

import json
import pathlib
import re
from collections import Counter
from typing import Any, Callable, Protocol, Sequence

from m3jax.memorize.observations import ClipMemories, ClipObservation
from m3jax.engine.constrained import TokenConstraint, compile_constraint, json_string_lists, token_bytes
from m3jax.memory.tags import is_equivalence, parse_entities

Message = dict[str, str]

# The reference memorization prompt (`prompt_generate_memory_with_ids_sft`): the output contract M3-Agent's
# memorization model was trained on, so an LLM writer's output is interchangeable with the released model's.
MEMORY_PROMPT = (
  "You will be given a video and a set of character features. Each feature is either a face (represented by a "
  "video frame with a bounding box) or a voice (represented by one or more speech segments, each with MM:SS start "
  "and end times, and transcript content). Each feature has a unique ID enclosed in angle brackets. Some features "
  "may belong to the same character.\n\n"
  "Your task consists of two parts:\n"
  "1.\tVideo Description:\n"
  "Generate a detailed and cohesive description of the current video clip. Use the provided feature IDs as "
  "references to characters (when applicable). Your description should cover all observable and inferable events. "
  "Each description should focus on a single atomic event or fact.\n"
  "2.\tHigh-Level Conclusions:\n"
  "Generate high-level reasoning-based conclusions that go beyond surface-level observations. Use logical inference "
  "to identify character intentions, relationships, and identities. If a face and a voice feature refer to the same "
  "character, indicate it using this exact format: Equivalence: <face_x>, <voice_y>\n\n"
  "Output Format:\n"
  "Your output must be a JSON object with the following structure:\n\n"
  "{\n"
  "\t\"video_description\": [\n"
  "\t\t\"...\",  // each string is one atomic event description\n"
  "\t\t\"...\"\n"
  "\t],\n"
  "\t\"high_level_conclusions\": [\n"
  "\t\t\"...\",  // each string is one high-level inference or identity resolution\n"
  "\t\t\"Equivalence: <face_1>, <voice_2>\"\n"
  "\t]\n"
  "}\n\n"
  "Please only return the valid JSON object, without any additional explanation or formatting."
)

_NAME_RE = re.compile(r"\b(?:my name is|my name's|call me|i am called)\s+([A-Z][a-z]+)", re.IGNORECASE)


class WriterOutputError(ValueError):
  """An LLM writer reply that is not the contract's JSON object."""


class MemoryWriter(Protocol):
  """Batched clip → memories. `state`/`load_state` carry anything accumulated across clips (JSON-able)."""
  name: str

  def write(self, clips: Sequence[ClipObservation]) -> list[ClipMemories]:
    ...

  def state(self) -> dict[str, Any]:
    ...

  def load_state(self, state: dict[str, Any]) -> None:
    ...


def _mmss(seconds: float) -> str:
  s = max(0, int(seconds))
  return f"{s // 60:02d}:{s % 60:02d}"


class TemplateWriter:
  """Deterministic memories from perception alone. `min_votes`: solo clips needed before an equivalence."""
  name = "template"

  def __init__(self, min_votes: int = 1):
    if min_votes < 1:
      raise ValueError(f"min_votes must be >= 1, got {min_votes}")
    self.min_votes = min_votes
    self.votes: Counter[tuple[int, int]] = Counter()  # (face node, voice node) -> solo clips together

  def state(self) -> dict[str, Any]:
    return {"votes": [[f, v, n] for (f, v), n in sorted(self.votes.items())]}

  def load_state(self, state: dict[str, Any]) -> None:
    self.votes = Counter({(int(f), int(v)): int(n) for f, v, n in state.get("votes", [])})

  def _winner(self, face: int, voice: int) -> bool:
    """True when (face, voice) is both the voice's and the face's most-voted partner (ties: lowest id)."""
    n = self.votes[(face, voice)]
    if n < self.min_votes:
      return False
    for (f, v), m in self.votes.items():
      if (v == voice and f != face) or (f == face and v != voice):
        if m > n or (m == n and (f, v) < (face, voice)):
          return False
    return True

  def write(self, clips: Sequence[ClipObservation]) -> list[ClipMemories]:
    return [self._one(c) for c in clips]

  def _one(self, clip: ClipObservation) -> ClipMemories:
    faces = sorted(clip.faces, key=lambda f: (f.first_seen, f.node_id))
    episodic = [f"<face_{f.node_id}> is present." for f in faces]
    semantic: list[str] = []
    for s in clip.speech:
      text = s.text.strip()
      episodic.append(f"<voice_{s.node_id}> says: \"{text}\"" if text else f"<voice_{s.node_id}> speaks.")
      m = _NAME_RE.search(text)
      if m:
        fact = f"<voice_{s.node_id}>'s name is {m.group(1).capitalize()}."
        if fact not in semantic:
          semantic.append(fact)
    semantic[:0] = self._equivalences(clip)
    return ClipMemories(tuple(episodic), tuple(semantic))

  def _equivalences(self, clip: ClipObservation) -> list[str]:
    """This clip's votes, and the equivalences that win. With the active-speaker cue, its confident pairs vote
    (a clip where it is sure of nobody votes for nothing, whatever it shows); without it, a clip with one face and
    one voice votes for that pair (wrong when the voice belongs to someone off screen)."""
    if clip.speakers is not None:
      pairs = [(f, v) for f, v, _ in clip.speakers]
    else:
      voices = clip.voice_ids
      pairs = [(clip.faces[0].node_id, voices[0])] if len(clip.faces) == 1 and len(voices) == 1 else []
    self.votes.update(pairs)
    return [f"Equivalence: <face_{f}>, <voice_{v}>" for f, v in pairs if self._winner(f, v)]


def clip_prompt(clip: ClipObservation, instruction: str = MEMORY_PROMPT) -> list[Message]:
  """The reference message for one clip (`instruction` first: the reference prompt unless a trained writer was
  trained on another), with faces described in text (a text LLM cannot see the crops)."""
  faces = "\n".join(f"<face_{f.node_id}>: visible from {_mmss(f.first_seen)} to {_mmss(f.last_seen)}"
                    for f in clip.faces)
  voices: dict[str, list[dict[str, str]]] = {}
  for s in clip.speech:
    voices.setdefault(f"<voice_{s.node_id}>", []).append(
        {"start_time": _mmss(s.start), "end_time": _mmss(s.end), "asr": s.text})
  content = f"{instruction}\n\nFace features:\n{faces}\n\nVoice features:\n{json.dumps(voices)}"
  return [{"role": "user", "content": content}]


CONTRACT_KEYS = ("video_description", "high_level_conclusions")


def writer_constraint(tokenizer, vocab_size: int, stop_token_ids: Sequence[int] = ()) -> TokenConstraint:
  """Token masks that keep a reply inside the contract (`CONTRACT_KEYS` in order, lists of strings), for
  constrained decoding of the text writer: every reply of a small LLM then parses."""
  return compile_constraint(json_string_lists(CONTRACT_KEYS), token_bytes(tokenizer), vocab_size, stop_token_ids)


def _repair(text: str) -> str | None:
  """`text` closed by the shortest suffix the contract allows, when it is a valid but unfinished contract reply
  (a constrained reply cut by the token budget); None otherwise."""
  tail = json_string_lists(CONTRACT_KEYS).closing(text.encode())
  return None if tail is None else text + tail.decode()


def parse_writer_output(reply: str) -> tuple[list[str], list[str]]:
  """(episodic, semantic) from a reply; accepts code fences, surrounding prose, both key spellings, and a reply
  in the contract's key order cut off before its end (closed with the shortest valid suffix)."""
  start, end = reply.find("{"), reply.rfind("}")
  if start < 0:
    raise WriterOutputError("no JSON object in the reply")
  try:
    obj = json.loads(reply[start:end + 1]) if end > start else None
  except json.JSONDecodeError as e:
    obj, error = None, e
  else:
    error = None
  if obj is None:
    repaired = _repair(reply[start:].rstrip())
    if repaired is None:
      raise WriterOutputError(f"reply is not valid JSON: {error or 'unterminated object'}")
    obj = json.loads(repaired)
  if not isinstance(obj, dict):
    raise WriterOutputError("reply JSON is not an object")
  key = "video_descriptions" if "video_descriptions" in obj else "video_description"
  lists = []
  for k in (key, "high_level_conclusions"):
    v = obj.get(k)
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
      raise WriterOutputError(f"key {k!r} is missing or not a list of strings")
    lists.append(list(dict.fromkeys(x.strip() for x in v if x.strip())))  # a small model repeats itself
  return lists[0], lists[1]


def _known_ids_only(sentences: list[str], clip: ClipObservation) -> list[str]:
  """Drops sentences naming an entity that is not in this clip's perception: a face/voice id it does not hold
  (so no face tag at all where no face was detected) or a character tag (a writer never sees character ids). An
  LLM inventing ids makes bogus edges, and one that sees a face perception missed makes a false memory. A tag
  without a number (the instruction's own `<face_x>`, which a small model copies) names nobody: dropped too.
  Drops an equivalence that is not the prompt's "Equivalence: <face_x>, <voice_y>" (one face, one voice): the
  graph unions every tag of a statement into one character, so "Equivalence: <face_0>, <face_7>" (two faces seen
  at once: two people) would merge two people's facts and names (a trained writer wrote it on held-out clips)."""
  known = {("face", f.node_id) for f in clip.faces} | {("voice", s.node_id) for s in clip.speech}

  def valid(sentence: str) -> bool:
    tags = parse_entities(sentence)
    if _PLACEHOLDER_TAG_RE.search(sentence):
      return False
    if is_equivalence(sentence) and sorted(k for k, _ in tags) != ["face", "voice"]:
      return False
    return all(tag in known for tag in tags)
  return [s for s in sentences if valid(s)]


_PLACEHOLDER_TAG_RE = re.compile(r"<(?:face|voice|character)_(?!\d+>)[^<>]*>")


class FallbackState:
  """Resumable state of a model-backed writer: its template fallback (equivalence votes), the clips that fell
  back to it (`failures`) and the memories dropped for naming entities the clip does not hold (`dropped`)."""

  fallback: TemplateWriter
  failures: int
  dropped: int = 0

  def state(self) -> dict[str, Any]:
    return {"fallback": self.fallback.state(), "failures": self.failures, "dropped": self.dropped}

  def load_state(self, state: dict[str, Any]) -> None:
    self.fallback.load_state(state.get("fallback", {}))
    self.failures = int(state.get("failures", 0))
    self.dropped = int(state.get("dropped", 0))

  def validated(self, episodic: list[str], semantic: list[str], clip: ClipObservation,
                template: ClipMemories) -> ClipMemories:
    """The parsed memories minus those naming entities not in `clip` (`_known_ids_only`), counted in `dropped`.
    With the active-speaker cue, the clip's equivalences are the cue's (the template's for this clip) and the
    model's own are dropped: a text model does not see who speaks."""
    epi, sem = _known_ids_only(episodic, clip), _known_ids_only(semantic, clip)
    self.dropped += len(episodic) + len(semantic) - len(epi) - len(sem)
    if clip.speakers is not None:
      sem = [x for x in template.semantic if is_equivalence(x)] + [x for x in sem if not is_equivalence(x)]
    return ClipMemories(tuple(epi), tuple(sem))


class LLMWriter(FallbackState):
  """Text-LLM writer. `complete` maps a batch of conversations to replies (e.g. the m3jax Sampler behind a chat
  template); failed rows are re-asked up to `max_retries` times, then get the template memories. `instruction`
  heads each clip's prompt (`clip_prompt`)."""
  name = "llm"

  def __init__(self, complete: Callable[[list[list[Message]]], list[str]], max_retries: int = 2,
               fallback: TemplateWriter | None = None, instruction: str = MEMORY_PROMPT):
    if max_retries < 0:
      raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    self.complete = complete
    self.instruction = instruction
    self.max_retries = max_retries
    self.fallback = fallback or TemplateWriter()
    self.failures = 0

  def write(self, clips: Sequence[ClipObservation]) -> list[ClipMemories]:
    template = self.fallback.write(clips)  # keeps the equivalence votes current
    out: list[ClipMemories | None] = [None] * len(clips)
    todo = [i for i, c in enumerate(clips) if c.faces or c.speech]
    for i, c in enumerate(clips):
      if i not in todo:
        out[i] = ClipMemories()
    for _ in range(self.max_retries + 1):
      if not todo:
        break
      replies = self.complete([clip_prompt(clips[i], self.instruction) for i in todo])
      if len(replies) != len(todo):
        raise ValueError(f"completion backend returned {len(replies)} replies for {len(todo)} prompts")
      failed = []
      for i, reply in zip(todo, replies):
        try:
          epi, sem = parse_writer_output(reply)
        except WriterOutputError:
          failed.append(i)
          continue
        out[i] = self.validated(epi, sem, clips[i], template[i])
      todo = failed
    for i in todo:
      self.failures += 1
      out[i] = template[i]
    return [m if m is not None else ClipMemories() for m in out]


SHIPPED_WRITER = pathlib.Path(__file__).resolve().parents[1] / "data" / "writer" / "writer.npz"  # + MODEL_CARD.md


def read_adapter_card(adapter: str | pathlib.Path) -> dict[str, Any]:
  """The metadata of a trained writer's adapter file (`train.py sft --config configs/sft_writer.py` writes
  OUT_DIR/writer.npz): the base LLM and the instruction it was trained with, and its LoRA settings."""
  from m3jax.models.lora import read_adapter_meta
  path = pathlib.Path(adapter)
  if not path.is_file():
    raise FileNotFoundError(f"{adapter} is not a trained writer adapter file (train one with "
                            "`train.py sft --config configs/sft_writer.py`: OUT_DIR/writer.npz)")
  card = read_adapter_meta(path, kind="writer")
  missing = [k for k in ("base_llm", "instruction") if k not in card]
  if missing:
    raise ValueError(f"{path} lacks {missing}")
  return card


def writer_chat(llm: str, max_new_tokens: int = 512, adapter: str | pathlib.Path | None = None,
                frequency_penalty: float = 0.5) -> Callable[[list[list[Message]]], list[str]]:
  """The `llm` memory writer's backend: batch chat completion on a local LLM through the m3jax sampler (greedy with
  a frequency penalty, stops at <|im_end|>), constrained to the writer's JSON contract so every reply parses.
  `adapter`: a trained writer's adapter file; its LoRA adapters are folded into the LLM's weights (`lora.merged`)."""
  from m3jax.control.policy import ChatCompleter
  from m3jax.models.llm import load_llm
  from m3jax.engine.sampling import Sampler, SamplingConfig

  model, tokenizer = load_llm(llm)
  if adapter is not None:
    from m3jax.models.lora import load_adapter_file, merged
    model = merged(load_adapter_file(adapter, model, kind="writer")[0])
  stop = tuple(tokenizer.encode("<|im_end|>", add_special_tokens=False)[:1])
  config = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=stop,
                          frequency_penalty=frequency_penalty)
  return ChatCompleter(Sampler(model, config), tokenizer, config,
                       writer_constraint(tokenizer, model.cfg.vocab_size, stop))


def trained_writer(adapter: str | pathlib.Path, complete: Callable[[list[list[Message]]], list[str]] | None = None
                   ) -> LLMWriter:
  """The `llm` writer on a trained adapter: its base LLM with the adapters, prompted with the instruction it was
  trained on, greedy without a frequency penalty (trained replies repeat tags and phrasing by design)."""
  card = read_adapter_card(adapter)
  complete = complete or writer_chat(card["base_llm"], adapter=adapter, frequency_penalty=0.0)
  return LLMWriter(complete, instruction=card["instruction"])
