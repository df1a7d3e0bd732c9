"""The cast and the script of a generated episode: who is in it, what each person says, clip by clip.

Pure Python on a seeded `numpy.random.Generator` (the same seed gives the same script whatever PYTHONHASHSEED
is). `m3jax.data.episodes.make_episode` writes a script with these pieces, then derives the questions and the
gold memories from it; `m3jax.data.episode_render` turns it into an mp4.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from m3jax.data.questions import article

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
# House rules: only the (item, place) pairs Whisper tiny.en got right in all three voices in the rule sentence
# (winter coats, dog food, spare key, blue flower pot, towels, umbrella, bread did not).
RULE_ITEMS = (("milk", "fridge door"), ("first aid kit", "bathroom cabinet"), ("house keys", "blue bowl"))
# What each character says after introducing themselves ("rule": one of the house's rules, while any is unsaid).
FACT_KINDS = ("drink", "dislike", "food", "plan", "city", "job", "object", "move", "rule")
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
  # The speaker's mouth moves with their speech (episode_render: the jaw region of the photo opens per frame by
  # the utterance's envelope), the cue an active-speaker estimator reads. Off by default: episodes, their ids and
  # every cache key (`settings_dict`) stay byte-identical to those made before the field existed.
  talking_faces: bool = False

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

  def settings_dict(self) -> dict[str, Any]:
    """The fields as a dict for cache keys and records: `dataclasses.asdict`, less `talking_faces` when it is off,
    so keys hashed from configs made before the field existed are unchanged and a talking config gets its own."""
    out = dataclasses.asdict(self)
    if not self.talking_faces:
      del out["talking_faces"]
    return out


@dataclasses.dataclass(frozen=True)
class Character:
  name: str
  photo: str  # one of PHOTO_ORDER (see episode_render.load_photo)
  voice: str  # espeak-ng voice, e.g. "en-us+f3"
  pitch: int  # espeak-ng -p (0..99)
  facts: dict[str, str]  # drink, food, plan, city, job, object, furniture, dislike, moved_to


@dataclasses.dataclass(frozen=True)
class Utterance:
  clip: int
  start: float  # seconds from the start of the video
  speaker: str  # character name
  text: str
  kind: str  # intro | one of FACT_KINDS | small_talk


@dataclasses.dataclass(frozen=True)
class ClipScript:
  clip: int
  present: tuple[str, ...]  # names, in left-to-right screen order
  utterances: tuple[Utterance, ...]


def pick_distinct(rng: np.random.Generator, pool, k: int):
  idx = rng.choice(len(pool), size=k, replace=False)
  return [pool[int(i)] for i in idx]


def draw_cast(rng: np.random.Generator, n: int) -> tuple[Character, ...]:
  names = [NAMES[p][int(rng.integers(len(NAMES[p])))] for p in PHOTO_ORDER[:n]]
  drinks, foods = pick_distinct(rng, DRINKS, n), pick_distinct(rng, FOODS, n)
  places, cities, jobs = pick_distinct(rng, PLACES, n), pick_distinct(rng, CITIES, n), pick_distinct(rng, JOBS, n)
  objects, furniture = pick_distinct(rng, OBJECTS, n), pick_distinct(rng, FURNITURE, n)
  # Distractors: the second person sometimes likes the same drink, lives in the same city or owns the same kind
  # of object as the first (then questions keyed on that fact are not asked: they would have two answers).
  for facts, p in ((drinks, 0.35), (cities, 0.25), (objects, 0.4)):
    if n >= 2 and rng.random() < p:
      facts[1] = facts[0]
  dislikes = [draw_other(rng, DRINKS, d) for d in drinks]
  moved_to = [draw_other(rng, FURNITURE, f) for f in furniture]
  return tuple(Character(names[i], PHOTO_ORDER[i], *VOICES[PHOTO_ORDER[i]], {
      "drink": drinks[i], "food": foods[i], "plan": places[i], "city": cities[i], "job": jobs[i],
      "object": objects[i], "furniture": furniture[i], "dislike": dislikes[i], "moved_to": moved_to[i]})
      for i in range(n))


def draw_other(rng: np.random.Generator, pool, not_this: str) -> str:
  rest = [x for x in pool if x != not_this]
  return rest[int(rng.integers(len(rest)))]


def sentence_for(kind: str, c: Character, rules: dict[str, str], rule_item: str | None) -> str:
  f = c.facts
  return {
      "intro": f"Hello everyone, my name is {c.name}.",
      "drink": f"I really like to drink {f['drink']} in the morning.",
      "dislike": f"I do not like to drink {f['dislike']} at all.",
      "food": f"My favourite food is {f['food']}, I eat it every week.",
      "plan": f"Tomorrow I will go to the {f['plan']} with a friend.",
      "city": f"I have lived in {f['city']} for many years.",
      "job": f"I work as {article(f['job'])} in the town centre.",
      "object": f"I put my {f['object']} on the {f['furniture']} this morning.",
      "move": f"I moved my {f['object']} from the {f['furniture']} to the {f['moved_to']}.",
      "rule": f"In this house, the {rule_item} goes in the {rules.get(rule_item, '')}.",
  }[kind]


def draw_presence(rng: np.random.Generator, num_clips: int, names: list[str]) -> list[tuple[str, ...]]:
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


def draw_agenda(rng: np.random.Generator) -> list[str]:
  """What one character will say, in order: the intro first, then the facts and one house rule in a seeded order,
  the object always before its move (the move is the change that "what changed" questions ask about)."""
  kinds = [str(k) for k in rng.permutation(FACT_KINDS)]
  i, j = kinds.index("object"), kinds.index("move")
  if j < i:
    kinds[i], kinds[j] = kinds[j], kinds[i]
  return ["intro"] + kinds
