"""SFT data for the text memory writer: (clip perception as the writer sees it, memories it should write) pairs.

Inputs come from REAL perception on rendered episodes (faces, voices and Whisper transcripts resolved against a
memory graph, exactly what `m3jax memorize` gives a writer), not from the script: a writer trained on the script
would learn to see faces perception missed and to correct names Whisper misheard. Targets are the episode's gold
memories (`episodes.utterance_fact`) restricted to what the input supports, with the perceived node ids:
  * `<face_N> is present.` for each detected face, `<voice_N> says: "<transcript>"` for each speech segment,
    grouped by voice as the prompt lists them (`clip_target`);
  * `Equivalence: <face_N>, <voice_M>` only in a clip with one face and one voice of the same person (a text
    writer cannot tell which of several faces speaks); with the active-speaker cue, the cue's pairs the script
    confirms (the writers store the cue's equivalences, whatever a model wrote);
  * each fact an utterance tells, tagged with the voice that said it, only when the transcript holds the fact's
    values (`episodes.fact_values`): "likes to drink orange juice" is dropped when Whisper heard "common juice".
The contract reply (`writers.CONTRACT_KEYS`) is the target, so the `llm` writer's parser and constraint decode
a trained model's replies unchanged.

Perception is slow on CPU (about real time), so each episode is perceived once into
`<work_dir>/<episode id>/perception`, a memory directory whose journals keep the graph's entity decisions
(`perceive_episode`; re-running resumes or reuses it). Pairs are stored through tensorflow-datasets array_record
files (`prepare`, as the Omni SFT data) and batched for a text decoder by grain (`text_batches`). Each record is
ONE text feature, the pair as sorted-key JSON: tfds serializes a record's features as a protobuf map, whose
byte order varies from process to process, so a record of two features is not byte-for-byte reproducible.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
from typing import Callable, Iterator, Mapping, Sequence

import grain
import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from m3jax.eval.scoring import face_person, load_observations, speech_person, utterance_spans
from m3jax.memorize.pipeline import (MemorizeConfig, Memorizer, MemoryDirError, memory_settings, read_manifest,
                                    settings_mismatch)
from m3jax.memorize.observations import ClipObservation
from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
from m3jax.perception.asr_models import DEFAULT_ASR
from m3jax.control.prompts import END_OF_TURN, render_chatml
from m3jax.memorize.writers import CONTRACT_KEYS, TemplateWriter, clip_prompt
from m3jax.data.episode_render import render_episode
from m3jax.data.episodes import Episode, EpisodeConfig, fact_values, make_episode, utterance_fact
from m3jax.data.questions import refuse_test_seeds
from m3jax.memory import journal
from m3jax.sft.data import ShardedBatches, length_bucket
from m3jax.sft.loss import TextBatch

Source = Callable[[], Iterator[tuple[str, dict[str, str]]]]  # (key, {"observation": JSON, "target": reply})

# What heads a trained writer's prompt (recorded in its adapter card): short, because on CPU every prompt token is
# paid for in every training step, and the features the writer reads follow it (`writers.clip_prompt`).
WRITER_INSTRUCTION = ("Write the memories of this video clip as a JSON object. video_description: who is present and "
                      "what each voice says. high_level_conclusions: what the speakers tell about themselves, and "
                      "Equivalence: <face_x>, <voice_y> when a face and a voice are the same person. Name people only "
                      "by the feature IDs given.")


@dataclasses.dataclass(frozen=True)
class PerceivedEpisode:
  """An episode with its perception: per clip the observation and the graph's entity records (journal
  "entities" records, replayable on another graph: `writer_eval` rebuilds each writer's memory from them)."""
  episode: Episode
  observations: list[ClipObservation]
  entities: list[list]


def perceive_episode(ep: Episode, work_dir: str | pathlib.Path, perception: PerceptionConfig = PerceptionConfig(),
                     models: Callable[[], PerceptionModels] = PerceptionModels.load,
                     asr: str = DEFAULT_ASR) -> PerceivedEpisode:
  """Renders and perceives `ep` once (cached under work_dir/<id>; `models` is only called when perception runs and
  must hold the Whisper model named `asr`, which the memory's manifest records: a cache heard by another refuses)."""
  d = pathlib.Path(work_dir) / ep.id
  if not (d / f"{ep.id}.json").exists():  # the annotations are written last: their presence marks a full render
    render_episode(ep, d)
  mem = d / "perception"
  manifest = read_manifest(mem)
  # never snapshot: every clip's journal stays, holding its entity decisions
  config = MemorizeConfig(clip_seconds=ep.config.clip_seconds, perception=perception, asr=asr, snapshot_every=2 ** 31)
  differ = manifest and settings_mismatch(manifest.get("settings", {}), memory_settings(config, TemplateWriter.name))
  if differ:  # a finished cache would otherwise be returned as is, whatever perceived it
    raise MemoryDirError(f"{mem} was perceived with other settings ({'; '.join(differ)}): use another work directory")
  if manifest is None or manifest["next_clip"] < ep.config.num_clips:
    Memorizer(mem, config, writer=TemplateWriter(), models=models()).memorize(d / f"{ep.id}.mp4", progress=False)
    manifest = read_manifest(mem)
  entities = [[r for r in journal.load(mem / name) if r[0] == "entities"] for name in manifest["journal"]]
  return PerceivedEpisode(ep, load_observations(mem), entities)


def _letters(text: str) -> str:
  """Lowercase letters only: "book shelf" and "bookshelf" compare equal, punctuation never matters."""
  return re.sub(r"[^a-z]", "", text.lower())


def clip_target(ep: Episode, obs: ClipObservation, spans=None) -> dict[str, list[str]]:
  """The memories the writer should produce from `obs` (see the module docstring), as the contract's lists."""
  spans = spans or utterance_spans(ep)
  episodic = [f"<face_{f.node_id}> is present." for f in obs.faces]
  # quotes in the order the prompt lists them (`clip_prompt` groups segments by voice, in order of first
  # appearance): in time order, a clip where voices take turns (A, B, A) asks the model to interleave its input,
  # and the writer trained so dropped or mis-tagged the last quote in 3 of 4 such held-out clips (0 of 8 others)
  first = {v: i for i, v in reversed(list(enumerate(s.node_id for s in obs.speech)))}
  episodic += [f"<voice_{s.node_id}> says: \"{s.text.strip()}\""
               for s in sorted(obs.speech, key=lambda s: first[s.node_id]) if s.text.strip()]
  speakers = [speech_person(spans, obs, s) for s in obs.speech]
  semantic = []
  voices = obs.voice_ids
  if obs.speakers is not None:  # the active-speaker cue's pairs, where the script agrees: it sees who speaks
    shows = {f.node_id: face_person(ep, obs, f) for f in obs.faces}
    heard: dict[int, set] = {}
    for s, who in zip(obs.speech, speakers):
      heard.setdefault(s.node_id, set()).add(who)
    semantic += [f"Equivalence: <face_{f}>, <voice_{v}>" for f, v, _ in obs.speakers if heard.get(v) == {shows.get(f)}]
  elif len(obs.faces) == 1 and len(voices) == 1 and {face_person(ep, obs, obs.faces[0])} == set(speakers):
    semantic.append(f"Equivalence: <face_{obs.faces[0].node_id}>, <voice_{voices[0]}>")
  for u, (start, end, _) in zip(ep.clips[obs.clip].utterances, spans[obs.clip]):
    c = ep.character(u.speaker)
    fact = utterance_fact(u, c)
    if fact is None:
      continue
    overlap = [(min(end, obs.start + s.end) - max(start, obs.start + s.start), i) for i, s in enumerate(obs.speech)]
    best = max(overlap, default=(0.0, -1))
    if best[0] <= 0 or speakers[best[1]] != u.speaker:
      continue  # not heard, or heard as someone else's voice
    heard = _letters(obs.speech[best[1]].text)
    if all(_letters(v) in heard for v in fact_values(u, c)):
      semantic.append(fact.replace(f"<face:{u.speaker}>", f"<voice_{obs.speech[best[1]].node_id}>"))
  return {CONTRACT_KEYS[0]: episodic, CONTRACT_KEYS[1]: list(dict.fromkeys(semantic))}


def target_text(target: dict[str, list[str]]) -> str:
  """The reply a writer is trained to give: compact JSON in the contract's key order."""
  return json.dumps({k: target[k] for k in CONTRACT_KEYS}, ensure_ascii=False)


def episode_pairs(seeds: Sequence[int], work_dir: str | pathlib.Path, episode: EpisodeConfig,
                  perception: PerceptionConfig = PerceptionConfig(), asr: str = DEFAULT_ASR) -> Source:
  """(key, {"observation", "target"}) per clip with any face or speech (an empty clip needs no writer), heard by
  the Whisper model `asr`. Refuses test seeds (`questions.refuse_test_seeds`): the writer's training data and
  curve never see the test split."""
  refuse_test_seeds(seeds, "writer episode_pairs")
  loaded: list[PerceptionModels] = []

  def models() -> PerceptionModels:  # loaded once, and only when an episode is not perceived yet
    if not loaded:
      loaded.append(PerceptionModels.load(asr=asr))
    return loaded[0]

  def gen():
    for seed in seeds:
      ep = make_episode(dataclasses.replace(episode, seed=int(seed)))
      seen = perceive_episode(ep, work_dir, perception, models, asr)
      spans = utterance_spans(ep)
      for obs in seen.observations:
        if obs.faces or obs.speech:
          yield f"{ep.id}/{obs.clip:04d}", {"observation": json.dumps(obs.to_json(), sort_keys=True),
                                             "target": target_text(clip_target(ep, obs, spans))}
  return gen


class WriterMemorySft(tfds.core.GeneratorBasedBuilder):
  """Splits are given as sources; examples are stored as array_record (random access, no TensorFlow)."""
  VERSION = tfds.core.Version("1.0.0")
  code_path = epath.Path(__file__)  # as OmniMemorySft: spares tfds its importlib_resources lookup

  def __init__(self, *, sources: Mapping[str, Source] | None = None, **kwargs):
    self._sources = dict(sources or {})
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"pair": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    if not self._sources:
      raise ValueError("WriterMemorySft needs `sources` (split -> example generator) to be prepared")
    return {split: self._generate_examples(src) for split, src in self._sources.items()}

  def _generate_examples(self, source: Source):
    for key, pair in source():
      yield key, {"pair": json.dumps(pair, sort_keys=True, ensure_ascii=False)}


def prepare(data_dir: str | pathlib.Path, sources: Mapping[str, Source]) -> dict:
  """Builds (once) and opens the dataset; returns split -> random-access data source."""
  builder = WriterMemorySft(sources=sources, data_dir=str(data_dir))
  builder.download_and_prepare()
  return builder.as_data_source()


def record_pair(rec: Mapping) -> tuple[ClipObservation, str]:
  """(observation, target reply) of a stored record."""
  v = rec["pair"]
  pair = json.loads(v.decode() if isinstance(v, bytes) else str(v))
  return ClipObservation.from_json(json.loads(pair["observation"])), pair["target"]


def encode_pair(rec: Mapping, tokenizer, instruction: str) -> tuple[np.ndarray, np.ndarray]:
  """(ids, loss mask) of the chat the writer sees at inference (`clip_prompt` under the ChatML template, prompt
  encoded alone as the sampler does) followed by the target reply and its end of turn, the only loss tokens."""
  obs, target = record_pair(rec)
  prompt = tokenizer.encode(render_chatml(clip_prompt(obs, instruction)), add_special_tokens=False)
  reply = tokenizer.encode(target + END_OF_TURN, add_special_tokens=False)
  return (np.asarray(prompt + reply, np.int32),
          np.asarray([False] * len(prompt) + [True] * len(reply), bool))


def collate_text(rows: Sequence[tuple[np.ndarray, np.ndarray]], batch: int, buckets: Sequence[int]) -> TextBatch:
  """Right-padded [batch, bucket] arrays; labels[b, t] = ids[b, t + 1], weighted where that token is a target."""
  length = length_bucket(max(len(ids) for ids, _ in rows), buckets)
  ids = np.zeros((batch, length), np.int32)
  lengths = np.ones(batch, np.int32)  # a pad row keeps one (unweighted) token for the attention softmax
  labels = np.zeros((batch, length), np.int32)
  weights = np.zeros((batch, length), np.float32)
  for b, (x, mask) in enumerate(rows):
    n = len(x)
    ids[b, :n], lengths[b] = x, n
    labels[b, :n - 1], weights[b, :n - 1] = x[1:], mask[1:]
  return TextBatch(ids, lengths, labels, weights)


def text_batches(source, tokenizer, instruction: str, batch: int, buckets: Sequence[int],
                 seed: int | None) -> ShardedBatches:
  """Random-access TextBatches: shuffled per epoch with `seed` and repeated (None = in order, one pass); on a pod
  each process encodes only its share of each batch's rows (`ShardedBatches`)."""
  ds = grain.MapDataset.source(source)
  if seed is not None:
    ds = ds.shuffle(seed=seed).repeat()
  ds = ds.map(lambda rec: encode_pair(rec, tokenizer, instruction))
  return ShardedBatches(ds, batch, lambda rows: collate_text(rows, batch, buckets), drop_remainder=seed is not None)
