"""A memory-QA task for RL: memory graphs with known answers, built from generated episodes' gold memories.

No video and no perception: each episode's characters become face/voice nodes with seeded random embeddings
(equal ids to an ideal memorizer's, so `render_gold` fills the placeholders), and the gold episodic/semantic
memories of every clip are inserted through the real graph code (consolidation, equivalences, edges). The
episode's questions then have answers the searcher can actually find, which makes the task learnable by a
policy that learns when and what to search. Records are the (question, answer, type, memory id) tuples that
`train.py rl` feeds through grain. `make_task(..., split=...)` refuses seeds of other splits
(`m3jax.data.questions.split_of`): training draws only train-split episodes, training curves only dev ones, the
final evaluation only test ones; even a mixed task (split=None) refuses test seeds.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from m3jax.data.episodes import EpisodeConfig, make_episode, render_gold
from m3jax.data.script import PHOTO_ORDER
from m3jax.data.questions import (FAMILIES, HELDOUT_SEED_START, TEST_FAMILY, TEST_SEED_START, check_split,
                                  refuse_test_seeds, split_of)
from m3jax.memory.designs import ClipPerception, make_design
from m3jax.memory.graph import GraphConfig, MemoryGraph


@dataclasses.dataclass(frozen=True)
class QARecord:
  question_id: str
  question: str
  answer: str
  types: tuple[str, ...]
  memory_id: int  # index of the graph in the task's graph list
  before_clip: int | None
  family: str = ""
  unanswerable: bool = False  # the gold answer is questions.NOT_IN_MEMORY
  distractors: tuple[str, ...] = ()  # the episode's other values of the answer's slot (for the strict judge)

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class EpisodeSizes:
  """Episode sizes drawn per seed: clips and people, each uniform over an inclusive range, from the seed alone.

  WHY: a policy trained on one episode shape (3 clips, 2 people) lost to the rules answerer on larger episodes, so
  training and evaluation draw several shapes. (0, 0) keeps the episode config's own value, so the default leaves
  every task, its seeds' episodes and their ids as they were. People stop at 3: the renderer has one real face
  photo per person and three ship (`script.PHOTO_ORDER`)."""

  clips: tuple[int, int] = (0, 0)
  people: tuple[int, int] = (0, 0)

  def __post_init__(self):
    for name, (lo, hi), top in (("clips", self.clips, 10_000), ("people", self.people, len(PHOTO_ORDER))):
      if (lo, hi) != (0, 0) and not 1 <= lo <= hi <= top:
        raise ValueError(f"episode sizes: {name}={lo, hi} is not a range within 1..{top} "
                         f"(or (0, 0): the episode's own)")

  def episode(self, episode: EpisodeConfig, seed: int) -> EpisodeConfig:
    """`episode` for `seed`, its clips and people drawn for that seed (the same on any machine)."""
    rng = np.random.default_rng([0x5123, int(seed)])  # a stream of its own: the script's draws are untouched
    clips = int(rng.integers(self.clips[0], self.clips[1] + 1)) if self.clips != (0, 0) else episode.num_clips
    people = int(rng.integers(self.people[0], self.people[1] + 1)) if self.people != (0, 0) else episode.num_characters
    return dataclasses.replace(episode, seed=int(seed), num_clips=clips, num_characters=people)


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
  x = rng.normal(size=(n, dim)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def episode_clips(seed: int, episode: EpisodeConfig = EpisodeConfig(), face_dim: int = 512,
                  voice_dim: int = 192) -> tuple[list[ClipPerception], list[dict]]:
  """(the clips of episode `seed` as a memory design sees them, the episode's qa_list): every character's face and
  voice (seeded random unit embeddings) are new entities of the first clip, face then voice per character, so a
  design that numbers nodes from 0 in creation order gives them the ids the gold memories' tags use."""
  ep = make_episode(dataclasses.replace(episode, seed=int(seed)))
  rng = np.random.default_rng(int(seed))
  entities, face_ids, voice_ids = [], {}, {}
  for c in ep.characters:
    face_ids[c.name], voice_ids[c.name] = len(entities), len(entities) + 1
    entities += [("face", _unit_rows(rng, 1, face_dim)), ("voice", _unit_rows(rng, 1, voice_dim))]
  clips = []
  for i, clip in enumerate(sorted(ep.gold_memories)):
    gold = ep.gold_memories[clip]
    clips.append(ClipPerception(clip, tuple(render_gold(s, face_ids, voice_ids) for s in gold["episodic"]),
                                tuple(render_gold(s, face_ids, voice_ids) for s in gold["semantic"]),
                                tuple(entities) if i == 0 else ()))
  return clips, [dict(q) for q in ep.qa_list]


def episode_graph(seed: int, embed_fn: Callable[[Sequence[str]], np.ndarray], text_dim: int,
                  episode: EpisodeConfig = EpisodeConfig(),
                  graph_config: GraphConfig | None = None) -> tuple[MemoryGraph, list[dict]]:
  """(graph of episode `seed` with its gold memories, the episode's qa_list); `graph_config` defaults to
  GraphConfig(text_dim=text_dim)."""
  config = graph_config or GraphConfig(text_dim=text_dim)
  clips, qa = episode_clips(seed, episode, config.face_dim, config.voice_dim)
  design = make_design("m3_graph", embed_fn, **dataclasses.asdict(config))
  for clip in clips:
    design.update(clip)
  return design.graph, qa


def episode_records(memory_id: int, qa: list[dict]) -> list[QARecord]:
  """The records of one episode's qa_list, asked over memory `memory_id`."""
  return [QARecord(q["question_id"], q["question"], q["answer"], tuple(q["type"]), memory_id, q.get("before_clip"),
                   q["family"], q["unanswerable"], tuple(q.get("distractors", ()))) for q in qa]


def make_task(seeds: Sequence[int], embed_fn: Callable[[Sequence[str]], np.ndarray], text_dim: int,
              episode: EpisodeConfig = EpisodeConfig(), split: str | None = "train",
              sizes: EpisodeSizes = EpisodeSizes()) -> tuple[list[MemoryGraph], list[QARecord]]:
  """Graphs for the episodes `seeds` (memory id = position in `seeds`) and all their questions. `split`
  ("train" | "dev" (or "heldout") | "test") refuses seeds of the other splits; None mixes train and dev (each
  episode keeps its own: the RL program's training and curve graphs) and refuses test seeds. Each seed's
  episode has the size `sizes` draws for it."""
  if split is not None:
    check_split(seeds, split)
  else:
    refuse_test_seeds(seeds, "make_task(split=None)")
  graphs, records = [], []
  for memory_id, seed in enumerate(seeds):
    graph, qa = episode_graph(seed, embed_fn, text_dim, sizes.episode(episode, seed))
    graphs.append(graph)
    records.extend(episode_records(memory_id, qa))
  return graphs, records


def spread_over_episodes(records: Sequence[QARecord], n: int) -> list[QARecord]:
  """The first `n` of `records` taken round-robin over their episodes (memory ids, in order of first appearance),
  each episode's in their own order: a curve over episodes of drawn sizes is not filled by its largest one."""
  by_memory: dict[int, list[QARecord]] = {}
  for r in records:
    by_memory.setdefault(r.memory_id, []).append(r)
  queues, picked = list(by_memory.values()), []
  while len(picked) < n and any(queues):
    for q in queues:
      if q and len(picked) < n:
        picked.append(q.pop(0))
  return picked


def heldout_questions(n: int, first_seed: int = HELDOUT_SEED_START,
                      episode: EpisodeConfig = EpisodeConfig()) -> tuple[list[int], list[QARecord]]:
  """`split_questions` of the dev split (its old name: held out)."""
  return split_questions(n, "dev", first_seed, episode)


def split_questions(n: int, split: str = "dev", first_seed: int | None = None,
                    episode: EpisodeConfig = EpisodeConfig(),
                    sizes: EpisodeSizes = EpisodeSizes()) -> tuple[list[int], list[QARecord]]:
  """(episode seeds, `n` questions balanced over families): round-robin in a fixed shuffled family order, in each
  family the script's order, from consecutive episodes of `split` from `first_seed` (default: the split's first
  seed; memory id = position in the seeds). WHY balanced: a plain prefix would be mostly single-fact questions, the
  two-fact families being rarer in 3-clip episodes. The order shuffles the families that existed before the test
  split (TEST_FAMILY comes last), so the dev questions stay the ones every dev number was measured on. With drawn
  `sizes`, the questions are also spread over episodes (at least n / 4 of them, each family's next question taken
  from the episode asked least so far), so a large episode's many questions do not fill the set alone."""
  spread = sizes != EpisodeSizes()
  if first_seed is None:
    first_seed = {"train": 0, "dev": HELDOUT_SEED_START, "heldout": HELDOUT_SEED_START,
                  "test": TEST_SEED_START}.get(split, -1)
  check_split([first_seed], split)
  seeds, records = [], []
  while len(records) < 4 * n or (spread and len(seeds) < -(-n // 4)):
    seeds.append(first_seed + len(seeds))
    if split_of(seeds[-1]) != split_of(first_seed):
      check_split(seeds, split)  # ran past the split's last seed
    records += episode_records(len(seeds) - 1, make_episode(sizes.episode(episode, seeds[-1])).qa_list)
  older = [f for f in FAMILIES if f != TEST_FAMILY]
  families = [older[i] for i in np.random.default_rng(0).permutation(len(older))] + [TEST_FAMILY]  # types mixed
  by_family = {f: [r for r in records if r.family == f] for f in families}
  picked: list[QARecord] = []
  asked = np.zeros(len(seeds), int)
  while len(picked) < n:
    for f in families:
      if by_family[f] and len(picked) < n:
        i = int(np.argmin([asked[r.memory_id] for r in by_family[f]])) if spread else 0
        picked.append(by_family[f].pop(i))
        asked[picked[-1].memory_id] += 1
  return seeds, picked
