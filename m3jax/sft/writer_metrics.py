"""Scoring memory writers against an episode's gold memories (`bench/writer_eval.py`).

Matching a written memory to a gold one needs both:
  * the same people: every tag resolves to a character through the clip's perception (a face by its screen
    slot, a voice by the utterance it overlaps; `eval.scoring.face_person` / `speech_person`), gold placeholders name
    theirs; `<voice_5> likes tea.` and `<face_4> likes tea.` match when both nodes are Susan, because the graph
    ties them through equivalences. A tag the clip's perception does not hold resolves to nobody and matches
    nothing;
  * the same content: the content words (lowercase words minus a short stop list, tags removed) in the same
    order, up to a word-level edit distance of floor(n / 5) for a gold memory of n content words. Why not a
    character ratio or a text embedding: a fact differs from a wrong fact by one value word ("plans to go to the
    park" / "... market" is 0.94 by difflib's ratio, "likes tea" / "likes coffee" embed alike), so short facts
    (at most 4 content words, each of them a value) must agree exactly; a transcript of 5 or more content words
    tolerates one misheard word in five (Whisper's "common juice" for "orange juice"), which the writer could not
    have known. Order matters: "moved the keys from the table to the shelf" is not "... shelf to the table".
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Sequence

import numpy as np

from m3jax.eval.scoring import face_person, speech_person
from m3jax.memorize.observations import ClipMemories, ClipObservation
from m3jax.data.episodes import NAMES, Episode
from m3jax.memory.graph import MemoryGraph
from m3jax.memory.tags import parse_entities

STOP_WORDS = frozenset("a an the to of in on at is are was my i it this that and for with from s".split())
_PLACEHOLDER = re.compile(r"<(face|voice):([^<>]+)>")
_TAG = re.compile(r"<[^<>]*>")
_ALL_NAMES = frozenset(n for names in NAMES.values() for n in names)


def content_words(text: str) -> list[str]:
  """Lowercase words of `text` without tags, placeholders and stop words, in order."""
  return [w for w in re.findall(r"[a-z]+", _TAG.sub(" ", text.lower())) if w not in STOP_WORDS]


def _edit_distance(a: Sequence[str], b: Sequence[str]) -> int:
  row = list(range(len(b) + 1))
  for i, x in enumerate(a, 1):
    prev, row[0] = row[0], i
    for j, y in enumerate(b, 1):
      prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
  return row[-1]


def same_content(written: str, gold: str) -> bool:
  g = content_words(gold)
  return _edit_distance(content_words(written), g) <= len(g) // 5


@dataclasses.dataclass(frozen=True)
class ClipPeople:
  """Who each of a clip's face / voice nodes is (None: a node perception holds that shows nobody of the script)."""
  faces: dict[int, str | None]
  voices: dict[int, str | None]

  @classmethod
  def of(cls, ep: Episode, obs: ClipObservation, spans) -> "ClipPeople":
    voices: dict[int, Counter] = {}
    for s in obs.speech:
      voices.setdefault(s.node_id, Counter())[speech_person(spans, obs, s)] += 1
    return cls({f.node_id: face_person(ep, obs, f) for f in obs.faces},
               {v: c.most_common(1)[0][0] for v, c in voices.items()})

  def people(self, text: str) -> frozenset[str] | None:
    """The characters a written memory names; None when a tag names no one (unknown id, unlabelled node)."""
    out = set()
    for kind, i in parse_entities(text):
      who = {"face": self.faces, "voice": self.voices}.get(kind, {}).get(i)
      if who is None:
        return None
      out.add(who)
    return frozenset(out)

  def unknown_tags(self, text: str) -> set[tuple[str, int]]:
    """Entity tags of `text` that the clip's perception does not hold (invented ids, character tags)."""
    return {(k, i) for k, i in parse_entities(text) if i not in {"face": self.faces, "voice": self.voices}.get(k, {})}


def gold_people(gold: str) -> frozenset[str]:
  return frozenset(m.group(2) for m in _PLACEHOLDER.finditer(gold))


def matches(written: str, gold: str, people: ClipPeople) -> bool:
  """Whether `written` (node-id tags) states the gold memory `gold` (name placeholders): see the module docstring."""
  who = people.people(written)
  return who is not None and who == gold_people(gold) and same_content(written, gold)


def _ratio(part: float, whole: float) -> float:
  return part / whole if whole else 0.0


@dataclasses.dataclass
class WriterScore:
  """Sums over clips; the properties are the reported rates."""
  gold: int = 0
  recalled: int = 0
  written: int = 0
  correct: int = 0
  raw: int = 0  # memories in the writer's replies before validation
  raw_valid_tags: int = 0
  hallucinated: int = 0  # distinct unknown tags + names not heard, per clip, summed
  clips: int = 0
  seconds: float = 0.0

  @property
  def recall(self) -> float:
    return _ratio(self.recalled, self.gold)

  @property
  def precision(self) -> float:
    return _ratio(self.correct, self.written)

  @property
  def valid_tag_share(self) -> float:
    return _ratio(self.raw_valid_tags, self.raw)

  @property
  def hallucinated_per_clip(self) -> float:
    return _ratio(self.hallucinated, self.clips)

  @property
  def seconds_per_clip(self) -> float:
    return _ratio(self.seconds, self.clips)


def score_clip(score: WriterScore, gold: dict[str, list[str]], memories: ClipMemories, raw: Sequence[str],
               obs: ClipObservation, people: ClipPeople) -> None:
  """Adds one clip: `memories` as stored (after validation), `raw` the writer's memories before validation.

  A hallucinated entity is a tag the clip's perception does not hold or a person's name (of the generator's
  cast pool) that no transcript of the clip says; a memory has valid tags when it has at least one and all are
  the clip's."""
  golds = gold["episodic"] + gold["semantic"]
  written = list(memories.episodic) + list(memories.semantic)
  score.gold += len(golds)
  score.recalled += sum(any(matches(w, g, people) for w in written) for g in golds)
  score.written += len(written)
  score.correct += sum(any(matches(w, g, people) for g in golds) for w in written)
  score.raw += len(raw)
  score.raw_valid_tags += sum(bool(parse_entities(m)) and not people.unknown_tags(m) for m in raw)
  heard = set(re.findall(r"[a-z]+", " ".join(s.text for s in obs.speech).lower()))
  names = {n for m in raw for n in re.findall(r"[A-Z][a-z]+", _TAG.sub(" ", m)) if n in _ALL_NAMES}
  score.hallucinated += len(set().union(*(people.unknown_tags(m) for m in raw))) + \
      sum(n.lower() not in heard for n in names)
  score.clips += 1


_ID_TAG = re.compile(r"<(face|voice)_(\d+)>")


def replay_graph(graph: MemoryGraph, entities: Sequence[Sequence], memories: Sequence[ClipMemories],
                 clip_ids: Sequence[int], embed_fn) -> MemoryGraph:
  """Rebuilds a memory from cached perception with another writer's memories: per clip, the perception run's
  entity decisions (journal "entities" records) are replayed, with node ids renumbered because text nodes share
  the id space (a writer writing more memories shifts every later id), then the clip's memories (tags renumbered
  the same way) are inserted as memorization would."""
  remap: dict[int, int] = {}
  for records, mem, clip in zip(entities, memories, clip_ids):
    for _, kind, outcomes in records:
      for node, created, emb, items in outcomes:
        if created:
          remap[int(node)] = graph.next_node_id
        graph.replay_entities(int(kind), [(remap[int(node)], bool(created), np.asarray(emb, np.float32), items)])

    def renumber(text: str) -> str:
      return _ID_TAG.sub(lambda m: f"<{m.group(1)}_{remap.get(int(m.group(2)), int(m.group(2)))}>", text)
    graph.add_clip(int(clip), [renumber(s) for s in mem.episodic], [renumber(s) for s in mem.semantic],
                   embed_fn=embed_fn)
  return graph
