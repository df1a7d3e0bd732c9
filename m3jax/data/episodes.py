"""Deterministic generator of multi-speaker episodes: the test data no model has seen.

An episode is a cast of characters (real face photos shipped in packages, each with a distinct espeak-ng voice
and a name said aloud) and a script over N 30-s clips: who is present, who says what (names, preferences, plans,
objects, places, household rules). From the script we derive M3-Bench-format annotations (questions of the five
types, answers, `before_clip`, evidence clip ids) and the gold memories an ideal memorizer would write per clip.
Everything here is pure Python on a seeded `numpy.random.Generator`, so the same seed gives the same episode
whatever PYTHONHASHSEED is; `m3jax.data.episode_render` turns it into an mp4.

Gold memories name people with placeholders `<face:NAME>` / `<voice:NAME>`: the node ids an ideal memorizer would
use are only known once perception has run, so `render_gold` substitutes them.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

QUESTION_TYPES = ("Person Understanding", "Cross-Modal Reasoning", "Multi-Detail Reasoning",
                  "Multi-Hop Reasoning", "General Knowledge Extraction")

# Real photos (see episode_render.load_photo), a voice per photo chosen to be far apart for a speaker encoder
# (GE2E mean cosines between these three are 0.56-0.67, within a voice ~0.85) while staying intelligible to
# Whisper tiny.en, and names that fit the person in the photo.
# The `camera` photo is a profile, which frontal face detectors often miss: it is the third character only.
PHOTO_ORDER = ("astronaut", "hopper", "camera")
VOICES = {"astronaut": ("en-gb+f4", 40), "hopper": ("en-us+f5", 45), "camera": ("en-us+klatt", 40)}
# Names, jobs and sentences were kept only where Whisper tiny.en transcribes these voices correctly.
NAMES = {"astronaut": ("Victoria", "Jennifer", "Sophie", "Emily", "Rachel"),
         "hopper": ("Margaret", "Grace", "Susan", "Olivia"),
         "camera": ("Michael", "Robert", "Thomas", "Peter", "George")}
DRINKS = ("coffee", "tea", "orange juice", "milk", "lemonade", "hot chocolate")
FOODS = ("pizza", "mango", "soup", "pasta", "apples", "cheese")
PLACES = ("library", "museum", "beach", "market", "park", "station", "cinema", "hospital")
CITIES = ("London", "Paris", "Boston", "Madrid", "Chicago", "Berlin")
JOBS = ("doctor", "pilot", "lawyer", "nurse", "chef", "painter", "engineer", "musician")
OBJECTS = ("keys", "glasses", "wallet", "phone", "notebook", "camera")
FURNITURE = ("kitchen table", "sofa", "bookshelf", "desk", "window sill")
RULE_ITEMS = (("winter coats", "hallway closet"), ("milk", "fridge door"), ("dog food", "garage"),
              ("spare key", "blue flower pot"), ("first aid kit", "bathroom cabinet"))
SMALL_TALK = ("It is a sunny day today.", "Let us open the window.", "This room is very quiet.",
              "I think it will rain later.", "The music next door is loud.", "We should clean up soon.")


@dataclasses.dataclass(frozen=True)
class EpisodeConfig:
  """What to generate. `seed` alone decides the script; the rest decides its size and media format."""
  seed: int = 0
  num_clips: int = 3
  num_characters: int = 2
  clip_seconds: float = 30.0
  utterances_per_clip: tuple[int, int] = (3, 4)
  fps: int = 5
  width: int = 640
  height: int = 360
  sample_rate: int = 16000

  def __post_init__(self):
    if not 1 <= self.num_characters <= len(PHOTO_ORDER):
      raise ValueError(f"num_characters must be in 1..{len(PHOTO_ORDER)} (one real photo each), "
                       f"got {self.num_characters}")
    if self.num_clips < 1:
      raise ValueError(f"num_clips must be >= 1, got {self.num_clips}")
    lo, hi = self.utterances_per_clip
    if not 1 <= lo <= hi or self.clip_seconds / hi < 6.0:
      raise ValueError(f"utterances_per_clip={self.utterances_per_clip} leaves under 6 s per utterance "
                       f"in a {self.clip_seconds}-s clip")
    if self.fps < 1 or self.width < 64 or self.height < 64:
      raise ValueError(f"fps/width/height too small: {self.fps}/{self.width}/{self.height}")


@dataclasses.dataclass(frozen=True)
class Character:
  name: str
  photo: str  # one of PHOTO_ORDER (see episode_render.load_photo)
  voice: str  # espeak-ng voice, e.g. "en-us+f3"
  pitch: int  # espeak-ng -p (0..99)
  facts: dict[str, str]  # drink, food, plan, city, job, object, furniture


@dataclasses.dataclass(frozen=True)
class Utterance:
  clip: int
  start: float  # seconds from the start of the video
  speaker: str  # character name
  text: str
  kind: str  # intro | drink | food | plan | city | job | object | rule | small_talk


@dataclasses.dataclass(frozen=True)
class ClipScript:
  clip: int
  present: tuple[str, ...]  # names, in left-to-right screen order
  utterances: tuple[Utterance, ...]


@dataclasses.dataclass(frozen=True)
class Episode:
  id: str
  config: EpisodeConfig
  characters: tuple[Character, ...]
  clips: tuple[ClipScript, ...]
  rules: dict[str, str]  # household item -> where it goes (general knowledge said aloud)
  qa_list: tuple[dict[str, Any], ...]
  gold_memories: dict[int, dict[str, list[str]]]

  def character(self, name: str) -> Character:
    return next(c for c in self.characters if c.name == name)

  def annotations(self, video_path: str, mem_path: str) -> dict[str, Any]:
    """M3-Bench robot-format annotations ({id: {video_path, mem_path, qa_list}}) plus the episode's extras."""
    return {self.id: {
        "video_path": video_path, "mem_path": mem_path, "qa_list": [dict(q) for q in self.qa_list],
        "characters": [{"name": c.name, "photo": c.photo, "voice": c.voice, "pitch": c.pitch, **c.facts}
                       for c in self.characters],
        "clips": [{"clip": s.clip, "present": list(s.present),
                   "utterances": [dataclasses.asdict(u) for u in s.utterances]} for s in self.clips],
        "gold_memories": {str(k): v for k, v in self.gold_memories.items()},
    }}


def _pick(rng: np.random.Generator, pool, k: int):
  idx = rng.choice(len(pool), size=k, replace=False)
  return [pool[int(i)] for i in idx]


def _characters(rng: np.random.Generator, n: int) -> tuple[Character, ...]:
  names = [NAMES[p][int(rng.integers(len(NAMES[p])))] for p in PHOTO_ORDER[:n]]
  drinks, foods = _pick(rng, DRINKS, n), _pick(rng, FOODS, n)
  places, cities, jobs = _pick(rng, PLACES, n), _pick(rng, CITIES, n), _pick(rng, JOBS, n)
  objects, furniture = _pick(rng, OBJECTS, n), _pick(rng, FURNITURE, n)
  return tuple(Character(names[i], PHOTO_ORDER[i], *VOICES[PHOTO_ORDER[i]], {
      "drink": drinks[i], "food": foods[i], "plan": places[i], "city": cities[i], "job": jobs[i],
      "object": objects[i], "furniture": furniture[i]}) for i in range(n))


def _sentence(kind: str, c: Character, rules: dict[str, str], rule_item: str | None) -> str:
  f = c.facts
  return {
      "intro": f"Hello everyone, my name is {c.name}.",
      "drink": f"I really like to drink {f['drink']} in the morning.",
      "food": f"My favourite food is {f['food']}, I eat it every week.",
      "plan": f"Tomorrow I will go to the {f['plan']} with a friend.",
      "city": f"I have lived in {f['city']} for many years.",
      "job": f"I work as a {f['job']} in the town centre.",
      "object": f"I put my {f['object']} on the {f['furniture']} this morning.",
      "rule": f"In this house, the {rule_item} always goes in the {rules.get(rule_item, '')}.",
  }[kind]


def _presence(rng: np.random.Generator, num_clips: int, names: list[str]) -> list[tuple[str, ...]]:
  """Who is on screen per clip. Every character gets a solo clip when there is room (the meta-clip idea:
  one face + one voice ties them); other clips show a random group of two or more."""
  n = len(names)
  solo = {int(c): names[i] for i, c in enumerate(rng.permutation(num_clips)[:n])} if num_clips >= n else {}
  out = []
  for clip in range(num_clips):
    if clip in solo:
      out.append((solo[clip],))
    elif n == 1:
      out.append((names[0],))
    else:
      k = int(rng.integers(2, n + 1))
      out.append(tuple(names[int(i)] for i in sorted(rng.choice(n, size=k, replace=False))))
  return out


def make_episode(config: EpisodeConfig = EpisodeConfig()) -> Episode:
  """Writes the script, the questions and the gold memories of one episode (no media)."""
  rng = np.random.default_rng(config.seed)
  chars = _characters(rng, config.num_characters)
  by_name = {c.name: c for c in chars}
  rules = dict(_pick(rng, RULE_ITEMS, min(2, len(RULE_ITEMS))))
  presence = _presence(rng, config.num_clips, [c.name for c in chars])
  # Facts each character still has to say, in a seeded order; the intro always comes first.
  pending = {c.name: ["intro"] + [str(k) for k in rng.permutation(["drink", "food", "plan", "city", "job", "object"])]
             for c in chars}
  pending_rules = list(rules)
  clips: list[ClipScript] = []
  for clip, present in enumerate(presence):
    lo, hi = config.utterances_per_clip
    k = int(rng.integers(lo, hi + 1))
    slot = config.clip_seconds / k
    utts = []
    for j in range(k):
      speaker = present[j % len(present)] if j < len(present) else present[int(rng.integers(len(present)))]
      todo = pending[speaker]
      if todo:
        kind, rule_item = todo.pop(0), None
      elif pending_rules:
        kind, rule_item = "rule", pending_rules.pop(0)
      else:
        kind, rule_item = "small_talk", None
      text = (SMALL_TALK[int(rng.integers(len(SMALL_TALK)))] if kind == "small_talk"
              else _sentence(kind, by_name[speaker], rules, rule_item))
      start = round(clip * config.clip_seconds + j * slot + 0.5 + float(rng.uniform(0.0, 0.5)), 2)
      utts.append(Utterance(clip, start, speaker, text, kind))
    clips.append(ClipScript(clip, present, tuple(utts)))
  ep_id = f"episode_{config.seed:04d}"
  qa = _questions(rng, ep_id, config, chars, clips, rules)
  return Episode(ep_id, config, chars, tuple(clips), rules, tuple(qa), _gold(clips, by_name))


def _said(clips, kind: str, speaker: str | None = None, contains: str | None = None) -> list[Utterance]:
  return [u for s in clips for u in s.utterances if u.kind == kind and (speaker is None or u.speaker == speaker)
          and (contains is None or contains in u.text)]


def _mmss(seconds: float) -> str:
  s = int(seconds)
  return f"{s // 60:02d}:{s % 60:02d}"


def _questions(rng, ep_id, config, chars, clips, rules) -> list[dict[str, Any]]:
  """Questions of the five M3-Bench types whose evidence was actually said in the script."""
  items: list[tuple[str, str, list[str], list[Utterance], str]] = []
  def add(q, a, types, evidence, why):
    if evidence and all(evidence):
      items.append((q, a, types, evidence, why))
  for c in chars:
    f = c.facts
    intro = _said(clips, "intro", c.name)
    drink, plan = _said(clips, "drink", c.name), _said(clips, "plan", c.name)
    job, obj, city = _said(clips, "job", c.name), _said(clips, "object", c.name), _said(clips, "city", c.name)
    if drink and intro:
      add(f"What does {c.name} like to drink?", f"{f['drink'].capitalize()}.", ["Person Understanding"],
          [intro[0], drink[0]], f"{c.name} said: {drink[0].text}")
    if plan and intro:
      add(f"Who said they will go to the {f['plan']} tomorrow?", f"{c.name}.", ["Cross-Modal Reasoning"],
          [intro[0], plan[0]], f"the voice of {c.name} said: {plan[0].text}")
    if obj and intro:
      add(f"Where did {c.name} put the {f['object']}?", f"On the {f['furniture']}.",
          ["Person Understanding", "Cross-Modal Reasoning"], [intro[0], obj[0]], obj[0].text)
    if drink and plan:
      add(f"Where will the person who likes {f['drink']} go tomorrow?", f"The {f['plan']}.",
          ["Multi-Hop Reasoning"], [drink[0], plan[0]], f"{c.name} likes {f['drink']} and goes to {f['plan']}")
    if job and city and intro:
      add(f"What is {c.name}'s job and which city does {c.name} live in?", f"{f['job'].capitalize()}, {f['city']}.",
          ["Multi-Detail Reasoning", "Person Understanding"], [intro[0], job[0], city[0]],
          f"{job[0].text} {city[0].text}")
  for item, where in rules.items():
    said = _said(clips, "rule", contains=item)
    if said:
      add(f"Where does the {item} go in this house?", f"In the {where}.", ["General Knowledge Extraction"],
          said[:1], said[0].text)
  out = []
  for n, (q, a, types, evidence, why) in enumerate(items):
    last = max(u.clip for u in evidence)
    end = config.num_clips * config.clip_seconds
    t = min((last + 1) * config.clip_seconds + float(rng.uniform(0, config.clip_seconds - 1)), end)
    out.append({"question": q, "answer": a, "question_id": f"{ep_id}_Q{n + 1:02d}", "reasoning": why,
                "timestamp": _mmss(t), "type": types, "before_clip": int(t // config.clip_seconds) - 1,
                "evidence_clips": sorted({u.clip for u in evidence})})
  return out


def _gold(clips, by_name) -> dict[int, dict[str, list[str]]]:
  """What an ideal memorizer writes per clip, with <face:NAME>/<voice:NAME> placeholders."""
  gold: dict[int, dict[str, list[str]]] = {}
  for s in clips:
    epi = [f"<face:{n}> is present." for n in s.present]
    sem: list[str] = []
    speakers = []
    for u in s.utterances:
      epi.append(f"<face:{u.speaker}> says: \"{u.text}\"")
      if u.speaker not in speakers:
        speakers.append(u.speaker)
      f = by_name[u.speaker].facts
      fact = {"intro": f"<face:{u.speaker}>'s name is {u.speaker}.",
              "drink": f"<face:{u.speaker}> likes to drink {f['drink']}.",
              "food": f"<face:{u.speaker}>'s favourite food is {f['food']}.",
              "plan": f"<face:{u.speaker}> plans to go to the {f['plan']} tomorrow.",
              "city": f"<face:{u.speaker}> lives in {f['city']}.",
              "job": f"<face:{u.speaker}> works as a {f['job']}.",
              "object": f"<face:{u.speaker}> put the {f['object']} on the {f['furniture']}."}.get(u.kind)
      if u.kind == "rule":
        fact = u.text
      if fact:
        sem.append(fact)
    sem = [f"Equivalence: <face:{n}>, <voice:{n}>" for n in speakers] + sem
    gold[s.clip] = {"episodic": epi, "semantic": sem}
  return gold


_PLACEHOLDER = re.compile(r"<(face|voice):([^<>]+)>")


def render_gold(text: str, face_ids: dict[str, int], voice_ids: dict[str, int]) -> str:
  """Replaces `<face:NAME>` / `<voice:NAME>` with the graph's `<face_N>` / `<voice_N>` tags."""
  def sub(m: re.Match) -> str:
    ids = face_ids if m.group(1) == "face" else voice_ids
    if m.group(2) not in ids:
      raise ValueError(f"no {m.group(1)} node id given for character {m.group(2)!r}")
    return f"<{m.group(1)}_{ids[m.group(2)]}>"
  return _PLACEHOLDER.sub(sub, text)
