"""Streaming, resumable memorization: a video file → a memory graph in a directory, 30-s clip by clip.

Per clip, in time order: decode (media.iter_clips) → perception resolved against the graph (perceive.py) →
memory writer → text embeddings → graph insertion → checkpoint. The memory directory holds
  manifest.json       what is done: sources (video files, their content hashes and first clip ids), the next
                      clip id, the writer's state, the settings that shape memories, cumulative timings;
  graph_NNNNN/        a snapshot: the graph after clip NNNNN-1 (m3jax.memory.store format);
  journal/clip_NNNNN.npz  the graph insertions of each clip after the snapshot (m3jax.memory.journal);
  clips/clip_NNNNN.json   the clip's observation and memories (for inspection, replay and writer training).
The graph is the snapshot with the manifest's journals replayed on it. A checkpoint writes the clip's journal
(O(clip)), or, once the journals hold at least `snapshot_every` clips and as many clips as the snapshot (so
snapshots cost O(1) amortised per clip), a fresh snapshot; then it atomically replaces the manifest that points
to them (files fsynced first), then removes what the manifest no longer names: an interruption at any point
leaves a consistent directory, and re-running the same command resumes at the first clip not yet memorized.
Another video can be appended after the first (`append=True`): its clips continue the clip ids. Nothing
memorized before is ever rewritten.

Resume is keyed on the video's content (SHA-256), not its path: a moved file resumes, a different file at the
same path is refused. The settings that shape memories (clip length, perception, graph, writer and its model) are
recorded at the first clip; a run with other settings is refused naming what differs, since its clips would
overlap or disagree with the stored ones.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import time
from typing import Any, Callable

from m3jax.perception import media
from m3jax.memorize.observations import ClipMemories, ClipObservation
from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels, perceive_clip
from m3jax.memorize.writers import LLMWriter, MemoryWriter, Message, TemplateWriter, trained_writer, writer_chat
from m3jax.distributed import DistributedConfig
from m3jax.memory import journal as journal_lib
from m3jax.memory.graph import GraphConfig, MemoryGraph
from m3jax.memory.store import fsync_tree
from m3jax.memory.store import load_graph, save_graph
from m3jax.perception.asr_models import DEFAULT_ASR, check_name

FORMAT = "m3jax.memory_dir"
VERSION = 1
STAGES = ("decode", "faces", "voices", "asr", "speakers", "write", "insert", "save")


class MemoryDirError(ValueError):
  """The memory directory cannot be used for this request (other video, damaged manifest, ...)."""


def default_graph_config() -> GraphConfig:
  """Graph settings calibrated for the embedded perception models (dlib 128-d faces, GE2E 256-d voices,
  MiniLM 384-d text): same-person dlib cosines are >= 0.98 and different people <= 0.91 on the generated
  episodes; same-voice GE2E means ~0.85-0.9 vs <= 0.67 across the episode voices (the reference's 0.3 / 0.6
  were for ArcFace / ERes2NetV2)."""
  return GraphConfig(text_dim=384, face_dim=128, voice_dim=256, face_threshold=0.95, voice_threshold=0.75)


@dataclasses.dataclass(frozen=True)
class MemorizeConfig:
  clip_seconds: float = 30.0
  perception: PerceptionConfig = PerceptionConfig()
  graph: GraphConfig = dataclasses.field(default_factory=default_graph_config)
  min_clip_seconds: float = 0.5
  # the Whisper model that hears the speech, by name: tiny.en | base | small (m3jax.perception.asr_models;
  # `--set asr=base`, in the demo config `--set memorize.asr=base`)
  asr: str = DEFAULT_ASR
  # the memory writer `Memorizer` builds (`config_writer`): template | llm (on the local LLM `writer_llm`) |
  # omni, which needs `omni_model`, a local HF Qwen2.5-Omni / M3-Agent-Memorization directory
  # (`--set writer=omni --set omni_model=DIR`)
  writer: str = "template"
  writer_llm: str = "smollm2-135m-instruct"  # a shipped name, an HF directory or a .gguf file
  # writer=llm only: a trained writer's adapter file (`train.py sft --config configs/sft_writer.py`); its
  # metadata names the base LLM, which then replaces `writer_llm`
  writer_adapter: str | None = None
  omni_model: str | None = None
  omni_attention_chunk: int = 1024  # query block of the thinker's attention (30-s clips are thousands of tokens)
  omni_max_new_tokens: int = 4096
  snapshot_every: int = 8  # journaled clips at least between graph snapshots (see the module docstring)
  # a pod's start-up for `m3jax memorize --videos` (each process memorizes its share of the videos); it does not
  # shape memories, so it is not among the recorded settings
  distributed: DistributedConfig = DistributedConfig()
  # `m3jax memorize --videos`: how many of a process's videos run in lock-step, their model calls batched
  # (m3jax.memorize.lockstep); more gives bigger batches and more memory (frames and audio of one clip per video).
  # It shapes no memory (rows agree to float rounding), so it is not a recorded setting either
  videos_in_flight: int = 8

  def __post_init__(self):
    if self.clip_seconds <= 0 or self.min_clip_seconds < 0:
      raise ValueError(f"clip_seconds must be > 0 and min_clip_seconds >= 0: {self}")
    if self.snapshot_every < 1:
      raise ValueError(f"snapshot_every must be >= 1, got {self.snapshot_every}")
    if self.videos_in_flight < 1:
      raise ValueError(f"videos_in_flight must be >= 1, got {self.videos_in_flight}")
    if self.writer not in ("template", "llm", "omni"):
      raise ValueError(f"writer must be template, llm or omni, got {self.writer!r}")
    if self.writer_adapter is not None and self.writer != "llm":
      raise ValueError(f"writer_adapter is for writer=llm, not writer={self.writer!r}")
    check_name(self.asr)
    if self.omni_attention_chunk < 1 or self.omni_max_new_tokens < 1:
      raise ValueError("omni_attention_chunk and omni_max_new_tokens must be >= 1")


def make_writer(kind: str, complete: Callable[[list[list[Message]]], list[str]] | None = None,
                omni_model: str | None = None, llm: str | None = None, adapter: str | None = None,
                **omni_options: Any) -> MemoryWriter:
  """Writer by name: "template", "llm" (on `complete`, or else on the local LLM `llm` through `writer_chat`; with
  `adapter`, a trained writer's adapter file: `trained_writer`) or "omni" (which needs `omni_model`, a local Hugging
  Face Qwen2.5-Omni / M3-Agent-Memorization directory; `omni_options` go to
  `m3jax.memorize.omni_writer.load_omni_writer`, e.g. processor, attention_chunk, max_new_tokens)."""
  if adapter is not None and kind != "llm":
    raise ValueError(f"a writer adapter is for the llm writer, not {kind!r}")
  if kind == "template":
    return TemplateWriter()
  if kind == "llm":
    if adapter is not None:
      return trained_writer(adapter, complete)
    if complete is None and not llm:
      raise ValueError("the llm writer needs a chat completion function or a local LLM (--llm)")
    return LLMWriter(complete or writer_chat(llm))
  if kind == "omni":
    if not omni_model:
      raise ValueError("the omni writer needs a local Hugging Face Qwen2.5-Omni / M3-Agent-Memorization directory "
                       "(--omni-model DIR, or omni_model=DIR in the memorize config)")
    from m3jax.memorize.omni_writer import load_omni_writer  # imports the thinker: only when asked for
    return load_omni_writer(omni_model, **omni_options)
  raise ValueError(f"unknown memory writer {kind!r} (known: template, llm, omni)")


def config_writer(config: MemorizeConfig) -> MemoryWriter:
  """The memory writer `config` names: the one place the CLI, the demo and the server get theirs from."""
  options = ({"attention_chunk": config.omni_attention_chunk, "max_new_tokens": config.omni_max_new_tokens}
             if config.writer == "omni" else {})
  return make_writer(config.writer, omni_model=config.omni_model, llm=config.writer_llm,
                     adapter=config.writer_adapter, **options)


def memory_settings(config: MemorizeConfig, writer: str) -> dict[str, Any]:
  """What shapes the memories of a directory written by the writer named `writer`; a resume must match it
  (JSON-normalised, so tuples are lists)."""
  model = {"llm": config.writer_llm, "omni": config.omni_model}.get(writer)
  if writer == "llm" and config.writer_adapter is not None:
    model = f"adapter:{config.writer_adapter}"
  settings = {"clip_seconds": config.clip_seconds, "min_clip_seconds": config.min_clip_seconds,
              "perception": config.perception.settings_dict(), "graph": dataclasses.asdict(config.graph),
              "writer": writer, "writer_model": model, "asr": config.asr}
  return json.loads(json.dumps(settings))


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
  out = {}
  for k, v in d.items():
    out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
  return out


def settings_mismatch(recorded: dict[str, Any], current: dict[str, Any]) -> list[str]:
  """`key: stored X, now Y` for every recorded setting that differs. Keys an older manifest lacks are skipped,
  except the active-speaker cue's: a record without them was memorized with the cue off."""
  now, then = _flat(current), _flat(recorded)
  out = [f"{k}: stored {v!r}, now {now.get(k)!r}" for k, v in then.items() if now.get(k) != v]
  if "perception.speaker_fps" in now and "perception.speaker_fps" not in then:
    out.append(f"perception.speaker_fps: stored off, now {now['perception.speaker_fps']!r}")
  return out


def video_digest(path: pathlib.Path) -> str:
  """SHA-256 of the file's bytes: what resume is keyed on."""
  with path.open("rb") as f:
    return "sha256:" + hashlib.file_digest(f, "sha256").hexdigest()


@dataclasses.dataclass
class MemorizeReport:
  memory_dir: pathlib.Path
  clips_done: list[int]  # clip ids memorized by this call
  clips_skipped: int  # clips of this video already in memory
  next_clip: int
  media_seconds: float  # seconds of media memorized by this call
  wall_seconds: float
  timings: dict[str, float]  # this call, per stage

  @property
  def realtime_factor(self) -> float:
    return self.media_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def _write_json_atomic(path: pathlib.Path, obj: Any) -> None:
  tmp = path.with_name(path.name + ".tmp")
  with open(tmp, "w") as f:
    f.write(json.dumps(obj, indent=1, ensure_ascii=False))
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_manifest(memory_dir: str | pathlib.Path) -> dict[str, Any] | None:
  if pathlib.Path(memory_dir).exists() and not pathlib.Path(memory_dir).is_dir():
    raise MemoryDirError(f"{memory_dir} is a file, not a memory directory")
  path = pathlib.Path(memory_dir) / "manifest.json"
  if not path.exists():
    return None
  try:
    manifest = json.loads(path.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise MemoryDirError(f"{path} is damaged: {e}") from None
  if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
    raise MemoryDirError(f"{path.parent} is not an m3jax memory directory")
  if manifest.get("version", 0) > VERSION:
    raise MemoryDirError(f"{path.parent} was written by a newer m3jax (version {manifest['version']})")
  return manifest


def load_memory(memory_dir: str | pathlib.Path) -> MemoryGraph:
  """The memory graph of a memory directory (an empty graph before the first clip)."""
  manifest = read_manifest(memory_dir)
  if manifest is None:
    raise MemoryDirError(f"{memory_dir} holds no memory (run `m3jax memorize VIDEO --memory {memory_dir}`)")
  if manifest.get("graph") is None:
    graph = MemoryGraph(GraphConfig(**manifest["graph_config"]))
  else:
    graph = load_graph(pathlib.Path(memory_dir) / manifest["graph"])
  for name in manifest.get("journal", []):
    journal_lib.replay(graph, journal_lib.load(pathlib.Path(memory_dir) / name))
  return graph


class Memorizer:
  """Memorizes videos into one memory directory. Models load once (`PerceptionModels.load`)."""

  def __init__(self, memory_dir: str | pathlib.Path, config: MemorizeConfig = MemorizeConfig(),
               writer: MemoryWriter | None = None, models: PerceptionModels | None = None):
    self.dir = pathlib.Path(memory_dir)
    self.config = config
    self.last_journal: list[tuple] = []  # the graph insertions of the last clip memorized (m3jax.memory.journal)
    self.manifest = read_manifest(self.dir)
    self.settings = memory_settings(config, writer.name if writer is not None else config.writer)
    self.models = models
    if self.manifest is not None:
      recorded = self.manifest.get("settings") or {  # a manifest from before settings were recorded
          **self.manifest.get("memorize_config", {}), "writer": self.manifest["writer"]}
      differ = settings_mismatch(recorded, self.settings)
      if differ:
        raise MemoryDirError(f"{self.dir} was memorized with other settings ({'; '.join(differ)}): re-run with the "
                             "stored settings, or memorize into another directory")
    self.writer = writer or config_writer(config)  # after the check: refusing must not wait for a model to load
    if self.manifest is not None:
      self.writer.load_state(self.manifest.get("writer_state", {}))
      self.graph = load_memory(self.dir)
      self._remove_unnamed()  # left by an interrupted checkpoint
    else:
      self.graph = MemoryGraph(config.graph)

  # ----------------------------------------------------------------------------------------------- public
  def memorize(self, video: str | pathlib.Path, append: bool = False, max_clips: int | None = None,
               progress: bool = True) -> MemorizeReport:
    """Memorizes the clips of `video` not yet in memory (at most `max_clips` of them); returns a report."""
    if max_clips is not None and max_clips < 1:
      raise ValueError(f"max_clips must be >= 1 (or None for all clips), got {max_clips}")
    video = pathlib.Path(video).resolve()
    info = media.probe(video)  # raises MediaError before anything is touched
    source, first_in_video = self._source_for(video, video_digest(video), append)
    _write_json_atomic(self.dir / "manifest.json", self.manifest)  # a valid (maybe empty) memory from now on
    models = self.models or PerceptionModels.load(self.config.perception.face_upsample, self.config.asr)
    self.models = models
    timings = {k: 0.0 for k in STAGES}
    done: list[int] = []
    media_s = 0.0
    start = time.perf_counter()
    total = int(-(-info.duration // self.config.clip_seconds)) if info.duration else None
    bar = _progress(total, first_in_video, progress)
    clips = media.iter_clips(video, self.config.clip_seconds, self.config.perception.decode_fps,
                             self.config.perception.max_side, first_clip=first_in_video,
                             min_seconds=self.config.min_clip_seconds)
    try:  # the bar ends its line even on Ctrl-C, so the CLI's message starts on a fresh one
      while max_clips is None or len(done) < max_clips:
        t = time.perf_counter()
        clip = next(clips, None)
        timings["decode"] += time.perf_counter() - t
        if clip is None:
          break
        clip_id = source["first_clip"] + clip.index
        clip.index = clip_id
        clip.start = clip.start + source["first_clip"] * self.config.clip_seconds
        self.graph.journal = []
        try:
          obs = perceive_clip(clip, self.graph, models, self.config.perception,
                              timer=lambda k, dt: timings.__setitem__(k, timings[k] + dt))
          observe = getattr(self.writer, "observe_clip", None)
          if observe is not None:  # a writer that watches the clip itself (omni) gets its frames, audio, crops
            observe(clip, obs, self.graph)
          mem = self._write_and_insert(obs, timings)
          t = time.perf_counter()
          self._checkpoint(source, clip_id, obs, mem)
          timings["save"] += time.perf_counter() - t
        except BaseException:  # a half-processed clip must not linger in this object: back to the checkpoint
          self._rollback()
          raise
        finally:
          self.last_journal, self.graph.journal = self.graph.journal or [], None
        done.append(clip_id)
        media_s += clip.duration
        if bar is not None:
          bar.set_postfix({k: f"{v:.1f}s" for k, v in timings.items() if v >= 0.05}, refresh=False)
          bar.update(1)
    finally:
      if bar is not None:
        bar.close()
    wall = time.perf_counter() - start
    if done:
      total_t = self.manifest.setdefault("timings", {})
      for k, v in timings.items():
        total_t[k] = round(total_t.get(k, 0.0) + v, 3)
      _write_json_atomic(self.dir / "manifest.json", self.manifest)
    return MemorizeReport(self.dir, done, first_in_video, self.manifest["next_clip"] if self.manifest else 0,
                          media_s, wall, timings)

  # ------------------------------------------------------------------------------------------- internals
  def _source_for(self, video: pathlib.Path, digest: str, append: bool) -> tuple[dict[str, Any], int]:
    """The manifest source entry for `video` (content `digest`) and the first clip index (within the video)
    still to do."""
    if self.manifest is None:
      self.dir.mkdir(parents=True, exist_ok=True)
      self.manifest = {"format": FORMAT, "version": VERSION, "sources": [], "next_clip": 0, "graph": None,
                       "writer": self.writer.name, "writer_state": self.writer.state(),
                       "graph_config": dataclasses.asdict(self.config.graph), "settings": self.settings,
                       "timings": {k: 0.0 for k in STAGES}}
    sources = self.manifest["sources"]
    def same(s):  # a source recorded before content hashes is matched by its path
      return s["sha256"] == digest if "sha256" in s else s["path"] == str(video)

    last = sources[-1] if sources else None
    if last is not None and same(last):
      return last, self.manifest["next_clip"] - last["first_clip"]
    if last is not None and not append:
      if last["path"] == str(video):
        raise MemoryDirError(f"{video} is not the file memorized into {self.dir} (its content changed): memorize "
                             "it into another directory, or add it as another video with --append")
      raise MemoryDirError(f"{self.dir} holds the memory of {last['path']}; pass append=True "
                           f"(--append) to add {video} after it, or use another directory")
    if any(same(s) for s in sources):
      raise MemoryDirError(f"{video} is already memorized in {self.dir} (not as its last video)")
    source = {"path": str(video), "sha256": digest, "first_clip": self.manifest["next_clip"]}
    sources.append(source)
    return source, 0

  def _rollback(self) -> None:
    self.graph = load_memory(self.dir)
    self.writer.load_state(self.manifest.get("writer_state", {}))

  def _write_and_insert(self, obs: ClipObservation, timings: dict[str, float]) -> ClipMemories:
    t = time.perf_counter()
    mem = self.writer.write([obs])[0]
    timings["write"] += time.perf_counter() - t
    t = time.perf_counter()
    self.graph.add_clip(obs.clip, list(mem.episodic), list(mem.semantic), embed_fn=self.models.text)
    timings["insert"] += time.perf_counter() - t
    return mem

  def _checkpoint(self, source: dict[str, Any], clip_id: int, obs: ClipObservation, mem: ClipMemories) -> None:
    clips_dir = self.dir / "clips"
    clips_dir.mkdir(exist_ok=True)
    _write_json_atomic(clips_dir / f"clip_{clip_id:05d}.json",
                       {"observation": obs.to_json(), "episodic": list(mem.episodic), "semantic": list(mem.semantic)})
    journals = self.manifest.get("journal", [])
    in_snapshot = int(self.manifest["graph"].split("_")[1]) if self.manifest.get("graph") else 0
    if len(journals) + 1 >= max(self.config.snapshot_every, in_snapshot):
      name = f"graph_{clip_id + 1:05d}"
      save_graph(self.graph, self.dir / name)
      fsync_tree(self.dir / name)
      self.manifest.update(graph=name, journal=[])
    else:
      (self.dir / "journal").mkdir(exist_ok=True)
      name = f"journal/clip_{clip_id:05d}.npz"
      journal_lib.save(self.graph.journal, self.dir / name)
      self.manifest["journal"] = journals + [name]
    self.manifest.update(next_clip=clip_id + 1, writer_state=self.writer.state())
    _write_json_atomic(self.dir / "manifest.json", self.manifest)
    self._remove_unnamed()

  def _remove_unnamed(self) -> None:
    """Removes snapshots and journals the manifest does not name (superseded, or left by an interruption)."""
    keep = {self.manifest.get("graph"), *self.manifest.get("journal", [])}
    for stale in self.dir.glob("graph_*"):
      if stale.name not in keep:
        shutil.rmtree(stale, ignore_errors=True)
    for stale in self.dir.glob("journal/*"):
      if f"journal/{stale.name}" not in keep:
        stale.unlink(missing_ok=True)


def _progress(total: int | None, initial: int, enabled: bool):
  if not enabled:
    return None
  from tqdm import tqdm
  return tqdm(total=total, initial=initial, unit="clip", desc="memorize", dynamic_ncols=True)
