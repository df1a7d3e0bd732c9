"""A memory-QA task for RL: memory graphs with known answers, built from generated episodes' gold memories.

No video and no perception: each episode's characters become face/voice nodes with seeded random embeddings
(equal ids to an ideal memorizer's, so `render_gold` fills the placeholders), and the gold episodic/semantic
memories of every clip are inserted through the real graph code (consolidation, equivalences, edges). The
episode's questions then have answers the searcher can actually find, which makes the task learnable by a
policy that learns when and what to search. Records are the (question, answer, type, memory id) tuples that
`train.py rl` feeds through grain. `make_task(..., split=...)` refuses seeds of the other split
(`m3jax.data.questions.split_of`): training draws only train-split episodes, evaluation only held-out ones.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from m3jax.data.episodes import EpisodeConfig, make_episode, render_gold
from m3jax.data.questions import check_split
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

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)


def _unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
  x = rng.normal(size=(n, dim)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def episode_graph(seed: int, embed_fn: Callable[[Sequence[str]], np.ndarray], text_dim: int,
                  episode: EpisodeConfig = EpisodeConfig(),
                  graph_config: GraphConfig | None = None) -> tuple[MemoryGraph, list[dict]]:
  """(graph of episode `seed` with its gold memories, the episode's qa_list); `graph_config` defaults to
  GraphConfig(text_dim=text_dim)."""
  ep = make_episode(dataclasses.replace(episode, seed=int(seed)))
  graph = MemoryGraph(graph_config or GraphConfig(text_dim=text_dim))
  rng = np.random.default_rng(int(seed))
  face_ids, voice_ids = {}, {}
  for c in ep.characters:
    face_ids[c.name] = graph.add_entity("face", _unit_rows(rng, 1, graph.config.face_dim))
    voice_ids[c.name] = graph.add_entity("voice", _unit_rows(rng, 1, graph.config.voice_dim))
  for clip in sorted(ep.gold_memories):
    gold = ep.gold_memories[clip]
    graph.add_clip(clip, [render_gold(s, face_ids, voice_ids) for s in gold["episodic"]],
                   [render_gold(s, face_ids, voice_ids) for s in gold["semantic"]], embed_fn)
  return graph, [dict(q) for q in ep.qa_list]


def make_task(seeds: Sequence[int], embed_fn: Callable[[Sequence[str]], np.ndarray], text_dim: int,
              episode: EpisodeConfig = EpisodeConfig(), split: str | None = "train"
              ) -> tuple[list[MemoryGraph], list[QARecord]]:
  """Graphs for the episodes `seeds` (memory id = position in `seeds`) and all their questions. `split`
  ("train" | "heldout") refuses seeds of the other split; None mixes them (each episode keeps its own)."""
  if split is not None:
    check_split(seeds, split)
  graphs, records = [], []
  for memory_id, seed in enumerate(seeds):
    graph, qa = episode_graph(seed, embed_fn, text_dim, episode)
    graphs.append(graph)
    records.extend(QARecord(q["question_id"], q["question"], q["answer"], tuple(q["type"]), memory_id,
                            q.get("before_clip"), q["family"], q["unanswerable"]) for q in qa)
  return graphs, records
