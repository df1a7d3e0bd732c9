"""Episodes rendered and memorized end to end (faces, voices, Whisper, the memory writer), cached on disk.

Why: the product answers over memories perception built (misheard names and values, split or merged characters,
transcript lines instead of facts); a controller trained and scored on gold graphs alone never sees them. An
episode costs a render plus a memorization (tens of seconds to minutes on CPU), so each is built once and kept
under `root/<episode id>_<key>/`, where the key hashes what decides the memory: the episode's config (its seed
decides the script) and the memorize settings. A later call with the same settings reuses the entry (the
render when its annotations exist, the memory by the memorizer's own resume); asking for more seeds grows the
pool; changed settings hash to other directories, never to a stale memory. Each entry's `pool.json` records its
settings and build cost, and an entry whose recorded settings are not the ones asked for is refused
(`PoolError`, naming the fields that differ). bench/controller_eval.py's perception table and `train.py rl`'s
perception pool (`RLConfig.pool_*`) both read episodes through here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import Sequence

from m3jax.control.answer import episode_questions
from m3jax.data.episodes import EpisodeConfig, make_episode
from m3jax.data.memory_qa import QARecord
from m3jax.data.questions import TEST_SEED_START
from m3jax.memorize.pipeline import MemorizeConfig

ENTRY_FILE = "pool.json"
# the demo's episode (`eval.demo.DemoConfig.episode` is this one): a test-split episode, 4 clips, 2 people
DEMO_EPISODE = EpisodeConfig(seed=TEST_SEED_START, num_clips=4, num_characters=2)


class PoolError(ValueError):
  """A cached entry built with other settings than the ones asked for."""


def _settings(episode: EpisodeConfig, memorize: MemorizeConfig) -> dict:
  """What decides a memorized episode, JSON-normalised (fields that are off and newer than the pool left out, so
  older entries keep their keys)."""
  settings = {**dataclasses.asdict(memorize), "perception": memorize.perception.settings_dict()}
  return json.loads(json.dumps({"episode": episode.settings_dict(), "memorize": settings}, sort_keys=True,
                               default=str))


def entry_key(episode: EpisodeConfig, memorize: MemorizeConfig) -> str:
  """A short hash of what decides a memorized episode (the episode config and the memorize settings)."""
  blob = json.dumps(_settings(episode, memorize), sort_keys=True)
  return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _differences(a, b, prefix: str = "") -> list[str]:
  if isinstance(a, dict) and isinstance(b, dict):
    return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{prefix}{k}.")]
  return [] if a == b else [f"{prefix[:-1]}: cached {a!r}, asked {b!r}"]


def _check(work: pathlib.Path, settings: dict) -> dict | None:
  """The entry's record when it has one, after refusing one built with other settings."""
  path = work / ENTRY_FILE
  if not path.exists():
    return None
  record = json.loads(path.read_text())
  diff = _differences(record.get("settings"), settings)
  if diff:
    raise PoolError(f"perception pool entry {work} was built with other settings: {'; '.join(diff[:6])}")
  return record


def perceived_episodes(root: str | pathlib.Path, seeds: Sequence[int], episode: EpisodeConfig | None = None,
                       memorize: MemorizeConfig | None = None, models=None, progress: bool = True):
  """Episodes `seeds` (in `episode`'s shape, default the demo's: 4 clips, 2 people), each rendered and memorized
  with `memorize` (default the demo's) in its cached entry under `root`, asked their own questions.

  Returns (graphs, records, embedder, stats): records[i].memory_id indexes graphs; the embedder is the text
  embedder the memories were written with (a searcher over them must embed queries with it); stats has one dict
  per episode (id, questions, seconds to build it, cached)."""
  from m3jax.memorize.pipeline import Memorizer, load_memory
  from m3jax.memorize.perceive import PerceptionModels
  from m3jax.data.episode_render import render_episode
  from m3jax.chunks import write_atomic

  episode = DEMO_EPISODE if episode is None else episode
  memorize = MemorizeConfig() if memorize is None else memorize
  root = pathlib.Path(root)
  graphs, records, stats = [], [], []
  for i, seed in enumerate(seeds):
    t0 = time.perf_counter()
    ep_cfg = dataclasses.replace(episode, seed=seed)
    settings = _settings(ep_cfg, memorize)
    ep = make_episode(ep_cfg)
    work = root / f"{ep.id}_{entry_key(ep_cfg, memorize)}"
    record = _check(work, settings)
    video = work / f"{ep.id}.mp4"
    if record is None:
      if models is None:  # loaded only when an entry is built: a pool read from its cache needs none of them
        models = PerceptionModels.load(memorize.perception.face_upsample)
      if not (video.exists() and (work / f"{ep.id}.json").exists()):  # the annotations are written last
        render_episode(ep, work)
      Memorizer(work / "memory", memorize, models=models).memorize(video, progress=False)
      record = {"settings": settings, "episode": ep.id, "questions": len(ep.qa_list),
                "build_seconds": round(time.perf_counter() - t0, 2)}
      write_atomic(work / ENTRY_FILE, json.dumps(record, indent=1) + "\n")  # written last: the entry is whole
      cached = False
    else:
      cached = True
    graphs.append(load_memory(work / "memory"))
    qa = {q["question_id"]: q for q in ep.qa_list}
    records += [QARecord(question_id=q.question_id, question=q.question, answer=q.answer, memory_id=i,
                         before_clip=q.before_clip, types=q.question_types, family=qa[q.question_id]["family"],
                         unanswerable=qa[q.question_id]["unanswerable"],
                         distractors=tuple(qa[q.question_id]["distractors"])) for q in episode_questions(ep)]
    stats.append({"episode": ep.id, "questions": len(ep.qa_list), "cached": cached,
                  "build_seconds": record["build_seconds"], "seconds": round(time.perf_counter() - t0, 2)})
    if progress:
      print(f"perception episode {ep.id}: {len(ep.qa_list)} questions, "
            f"{'reused' if cached else 'memorized'} in {work} ({time.perf_counter() - t0:.1f} s)", flush=True)
  if models is None:
    from m3jax.memory.embedders import make_embedder
    return graphs, records, make_embedder("minilm"), stats  # the embedder the memorizer writes with
  return graphs, records, models.text, stats
