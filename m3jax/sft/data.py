"""SFT data: (clip media, face crops, voice segments, target memory JSON) examples in a tensorflow-datasets
builder (array_record files, no TensorFlow needed), and a grain pipeline that turns them into thinker batches.

Sources: generated episodes (`episode_source`: render the mp4, decode it clip by clip like memorization does, and
take the script's gold memories as targets, with the node ids an ideal memorizer would assign: face 2i, voice
2i+1 for character i), or a user's own `MemoryExample`s. Batches are a pure function of (seed, index) through
grain's random-access MapDataset, which is what makes a resumed run see exactly the batches it would have seen,
on any number of processes: on a pod each process reads and encodes only its interleaved share of each batch's
rows (`ShardedBatches`).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Callable, Iterator, Mapping, Sequence

import grain
import numpy as np
import tensorflow_datasets as tfds
from etils import epath
from PIL import Image

from m3jax.data.episodes import EpisodeConfig, make_episode, render_gold
from m3jax.data.questions import refuse_test_seeds
from m3jax.distributed import gather_objects, interleave
from m3jax.models.omni.processor import ProcessorConfig, sample_frame_indices
from m3jax.models.omni.thinker import ThinkerConfig
from m3jax.models.omni.chat import Batch, ChatTokens, EncodedExample, MemoryExample, TextTokenizer, collate, encode_example

Source = Callable[[], Iterator[tuple[str, MemoryExample]]]


def _mmss(seconds: float) -> str:
  s = max(0, int(seconds))
  return f"{s // 60:02d}:{s % 60:02d}"


def _square(img: np.ndarray, size: int) -> np.ndarray:
  return np.asarray(Image.fromarray(img).resize((size, size), Image.Resampling.BICUBIC), np.uint8)


def episode_source(seeds: Sequence[int], work_dir: str | pathlib.Path, episode: EpisodeConfig,
                   fps: float = 2.0, crop_size: int = 64) -> Source:
  """Examples from generated episodes (one per clip), decoded from the rendered mp4 like real memorization. Refuses
  test seeds (`questions.refuse_test_seeds`): training data and its curve never see the test split."""
  refuse_test_seeds(seeds, "sft episode_source")
  from m3jax.perception.media import iter_clips
  from m3jax.data.episode_render import _portrait, render_episode

  def gen():
    for seed in seeds:
      ep = make_episode(dataclasses.replace(episode, seed=int(seed)))
      paths = render_episode(ep, pathlib.Path(work_dir) / ep.id)
      ann = json.loads(paths["annotations"].read_text())[ep.id]
      order = {c.name: i for i, c in enumerate(ep.characters)}
      face_ids = {n: 2 * i for n, i in order.items()}
      voice_ids = {n: 2 * i + 1 for n, i in order.items()}
      for clip in iter_clips(paths["video"], clip_seconds=episode.clip_seconds, fps=float(episode.fps)):
        script = ann["clips"][clip.index]
        keep = sample_frame_indices(len(clip.frames), float(episode.fps), ProcessorConfig(video_fps=fps))
        voices: dict[str, list[dict[str, str]]] = {}
        for u in script["utterances"]:
          voices.setdefault(f"<voice_{voice_ids[u['speaker']]}>", []).append(
              {"start_time": _mmss(u["start"] - clip.start), "end_time": _mmss(u["end"] - clip.start),
               "asr": u["text"]})
        gold = ep.gold_memories[clip.index]
        target = json.dumps({
            "video_descriptions": [render_gold(s, face_ids, voice_ids) for s in gold["episodic"]],
            "high_level_conclusions": [render_gold(s, face_ids, voice_ids) for s in gold["semantic"]]})
        faces = tuple((face_ids[n], _square(_portrait(ep.character(n).photo), crop_size)) for n in script["present"])
        yield f"{ep.id}/{clip.index}", MemoryExample(clip.frames[keep], clip.audio, faces, voices, target)
  return gen


class OmniMemorySft(tfds.core.GeneratorBasedBuilder):
  """Splits are given as sources; examples are stored as array_record (random access, no TensorFlow)."""
  VERSION = tfds.core.Version("1.0.0")
  # tfds' own lookup of the builder's source file needs the `importlib_resources` backport; we know the file
  code_path = epath.Path(__file__)

  def __init__(self, *, sources: Mapping[str, Source] | None = None, crop_size: int = 64, **kwargs):
    self._sources = dict(sources or {})
    self._crop = crop_size
    kwargs.setdefault("file_format", "array_record")
    super().__init__(**kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    S = self._crop
    return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
        "frames": tfds.features.Tensor(shape=(None, None, None, 3), dtype=np.uint8, encoding="zlib"),
        "audio": tfds.features.Tensor(shape=(None,), dtype=np.float32),
        "face_ids": tfds.features.Tensor(shape=(None,), dtype=np.int64),
        "face_crops": tfds.features.Tensor(shape=(None, S, S, 3), dtype=np.uint8),
        "voices": tfds.features.Text(), "target": tfds.features.Text()}))

  def _split_generators(self, dl_manager):
    if not self._sources:
      raise ValueError("OmniMemorySft needs `sources` (split -> example generator) to be prepared")
    return {split: self._generate_examples(src) for split, src in self._sources.items()}

  def _generate_examples(self, source: Source):
    for key, ex in source():
      crops = [c if c.shape[:2] == (self._crop, self._crop) else _square(c, self._crop) for _, c in ex.faces]
      yield key, {"frames": ex.frames, "audio": np.asarray(ex.audio, np.float32),
                  "face_ids": np.asarray([i for i, _ in ex.faces], np.int64),
                  "face_crops": np.stack(crops) if crops else np.zeros((0, self._crop, self._crop, 3), np.uint8),
                  "voices": json.dumps(ex.voices), "target": ex.target}


def prepare(data_dir: str | pathlib.Path, sources: Mapping[str, Source], crop_size: int = 64) -> dict:
  """Builds (once) and opens the dataset; returns split -> random-access data source."""
  builder = OmniMemorySft(sources=sources, crop_size=crop_size, data_dir=str(data_dir))
  builder.download_and_prepare()
  return builder.as_data_source()


def to_example(rec: Mapping) -> MemoryExample:
  text = lambda v: v.decode() if isinstance(v, bytes) else str(v)
  faces = tuple((int(i), np.asarray(c)) for i, c in zip(rec["face_ids"], rec["face_crops"]))
  return MemoryExample(np.asarray(rec["frames"]), np.asarray(rec["audio"]), faces, json.loads(text(rec["voices"])),
                       text(rec["target"]))


@dataclasses.dataclass(frozen=True)
class BatchSpec:
  batch: int
  length_buckets: tuple[int, ...]  # sequence lengths padded to (multiples of the loss chunk)


def length_bucket(n: int, buckets: Sequence[int]) -> int:
  """The smallest of the ascending `buckets` that holds `n` tokens (shared by the Omni and the text SFT data)."""
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"example of {n} tokens exceeds the largest length bucket {buckets[-1]}")


class ShardedBatches:
  """Batch k of a random-access row dataset (rows k·B .. k·B + B − 1 of its global order), read on a pod in
  interleaved shares: process p reads and encodes only rows k·B + p, k·B + p + P, ...; the encoded rows are
  gathered through the JAX runtime and every process collates the same global batch (the media of an Omni batch
  are packed across its rows), identical to the batch one process reading it whole would build. Each process
  then feeds its own rows of it to the mesh. Indexing is a collective on a pod: every process asks for the same
  k. `drop_remainder=False`: one pass, the last batch short."""

  def __init__(self, rows: grain.MapDataset, batch: int, collate_fn: Callable[[list], object],
               drop_remainder: bool):
    self.rows, self.batch, self.collate_fn, self.drop_remainder = rows, batch, collate_fn, drop_remainder

  def __len__(self) -> int:
    n = len(self.rows)
    return n // self.batch if self.drop_remainder else -(-n // self.batch)

  def __getitem__(self, k: int):
    import jax
    if not 0 <= k < len(self):
      raise IndexError(f"batch {k} of {len(self)}")
    stop = min((k + 1) * self.batch, len(self.rows))
    mine = [self.rows[j] for j in range(k * self.batch + jax.process_index(), stop, jax.process_count())]
    return self.collate_fn(interleave(gather_objects(mine)))


def batches(source, cfg: ThinkerConfig, prompt: str, tok: TextTokenizer, chat: ChatTokens, proc: ProcessorConfig,
            spec: BatchSpec, seed: int | None) -> ShardedBatches:
  """Random-access Batches: shuffled per epoch with `seed` (None = in order, one pass) and repeated."""
  ds = grain.MapDataset.source(source)
  if seed is not None:
    ds = ds.shuffle(seed=seed).repeat()
  ds = ds.map(lambda rec: encode_example(to_example(rec), prompt, tok, chat, proc))

  def build(rows: Sequence[EncodedExample]) -> Batch:
    return collate(cfg, rows, length_bucket(max(len(r.ids) for r in rows), spec.length_buckets), spec.batch)
  return ShardedBatches(ds, spec.batch, build, drop_remainder=seed is not None)
