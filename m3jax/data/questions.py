"""Question families of generated episodes: several phrasings each, held-out phrasings and family, unanswerables.

WHY: one fixed phrasing per question lets an answerer pass by template matching (the rule answerer's regexes did).
Every family here has six phrasings: the first four are the training phrasings, the last two are only asked in
held-out episodes, and the family `HELDOUT_FAMILY` is only asked there. An episode's split is decided by its seed
(`split_of`): seeds >= `HELDOUT_SEED_START` are held out. So a policy trained on train-split episodes has never
seen a held-out episode's graph, phrasings nor that family.

Unanswerable questions reuse the answerable families' phrasings (a fact the person never said, a person who is not
in the video, a job nobody has, a household item with no rule), so the wording does not give them away. Their
gold answer is `NOT_IN_MEMORY`. With the `contains` judge (and `demo.answer_correct`) an answer is a correct
decline exactly when its normalised text contains "memory does not say" (articles, case and punctuation ignored):
"The memory does not say." and "I checked: the memory does not say." count, "I don't know." does not. A decline
on an answerable question is a false decline and wrong, even beside the gold answer ("Cheese. The memory does not
say.", a hedge a DAPO run learned when the judge accepted it).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

NOT_IN_MEMORY = "The memory does not say."
HELDOUT_SEED_START = 1_000_000
SPLITS = ("train", "heldout")
TRAIN_PHRASINGS = 4  # phrasings[:4] are asked in training episodes, phrasings[4:] only in held-out ones

PU, CMR, MDR = "Person Understanding", "Cross-Modal Reasoning", "Multi-Detail Reasoning"
MHR, GKE = "Multi-Hop Reasoning", "General Knowledge Extraction"


@dataclasses.dataclass(frozen=True)
class Family:
  types: tuple[str, ...]
  phrasings: tuple[str, ...]  # str.format templates over the family's slots


FAMILIES: dict[str, Family] = {
    # ---- Person Understanding: preferences, plans, jobs, cities
    "drink": Family((PU,), (
        "What does {name} like to drink?", "What is {name}'s favourite drink?", "Which drink does {name} enjoy?",
        "What does {name} drink in the morning?",
        "If you made {name} a drink, what should it be?", "What drink should I bring for {name}?")),
    "food": Family((PU,), (
        "What is {name}'s favourite food?", "What food does {name} like best?",
        "Which food does {name} eat every week?", "What does {name} like to eat?",
        "What should I cook for {name}?", "Which dish would make {name} happy?")),
    "dislike": Family((PU,), (
        "What does {name} not like to drink?", "Which drink does {name} dislike?",
        "What drink should I not give {name}?", "Which drink does {name} not enjoy?",
        "What drink does {name} avoid?", "Which drink would {name} refuse?")),
    "plan": Family((PU,), (
        "Where will {name} go tomorrow?", "Where is {name} going tomorrow?",
        "What place will {name} visit tomorrow?", "Where does {name} plan to go tomorrow?",
        "Which place is on {name}'s plan for tomorrow?", "Where can I find {name} tomorrow?")),
    "job": Family((PU,), (
        "What is {name}'s job?", "What does {name} do for work?", "What does {name} work as?",
        "Which job does {name} have?",
        "What is the profession of {name}?", "How does {name} earn a living?")),
    "city": Family((PU,), (
        "Which city does {name} live in?", "Where does {name} live?",
        "In which city has {name} lived for many years?", "What city is {name}'s home?",
        "Which city is {name} from?", "Where is the home town of {name}?")),
    # ---- objects and places, and what changed (asked before and after the move, with before_clip)
    "object_place": Family((PU, CMR), (
        "Where can {name}'s {object} be found?", "Where should I look for {name}'s {object}?",
        "Where did {name} leave the {object}?", "Where does {name} keep the {object}?",
        "If {name} needs the {object}, where should {name} look?", "Where would you find {name}'s {object}?")),
    "object_from": Family((MDR,), (
        "Where did {name} move the {object} from?", "Where had {name} put the {object} before moving it?",
        "From which place did {name} take the {object}?", "What was the first place {name} put the {object}?",
        "Before the move, where did {name} keep the {object}?", "Where did {name} take the {object} away from?")),
    # ---- Cross-Modal Reasoning: who said it (voice -> face -> name), who was present
    "who_plan": Family((CMR,), (
        "Who said they will go to the {plan} tomorrow?", "Who is going to the {plan} tomorrow?",
        "Which person plans to visit the {plan} tomorrow?", "Who will be at the {plan} tomorrow?",
        "Who mentioned a trip to the {plan} tomorrow?", "Whose plan for tomorrow is the {plan}?")),
    "who_job": Family((CMR,), (
        "Who works as {a_job}?", "Which person is {a_job}?", "Who said they work as {a_job}?",
        "Who has a job as {a_job}?",
        "Who here earns a living as {a_job}?", "Which of the people is the {job}?")),
    "present_when": Family((CMR,), (
        "Who else was there when {name} talked about {topic}?",
        "Apart from {name}, who was in the room when {name} spoke about {topic}?",
        "Who was with {name} when {name} mentioned {topic}?", "Which person heard {name} talk about {topic}?",
        "Who was listening when {name} brought up {topic}?",
        "Who kept {name} company while {name} talked about {topic}?")),
    "mention_order": Family((CMR, MDR), (
        "Who mentioned the {object} {order}?", "Who talked about the {object} {order}?",
        "Which person spoke about the {object} {order}?", "Who was the {order} to mention the {object}?",
        "Who brought up the {object} {order}?", "Which person was the {order} one to talk about the {object}?")),
    # ---- Multi-Detail Reasoning: comparisons between two people
    "compare_same": Family((MDR,), (
        "Do {a} and {b} like the same drink?", "Do {a} and {b} enjoy the same drink?",
        "Is {a}'s favourite drink the same as {b}'s?", "Would {a} and {b} order the same drink?",
        "Does {a} like to drink what {b} likes to drink?", "Do {a} and {b} share a favourite drink?")),
    "compare_which": Family((MDR,), (
        "Who lives in {city}, {a} or {b}?", "Which of {a} and {b} lives in {city}?",
        "Does {a} or {b} live in {city}?", "Between {a} and {b}, who has lived in {city} for years?",
        "Is it {a} or {b} who lives in {city}?", "Of {a} and {b}, whose home is in {city}?")),
    # ---- Multi-Hop Reasoning: a description resolved to a person, then a fact, then another person
    "hop_plan": Family((MHR,), (
        "Where will the person who likes {drink} go tomorrow?",
        "Where is the one who likes to drink {drink} going tomorrow?",
        "What place will the {drink} lover visit tomorrow?",
        "The person who likes {drink}: where will they go tomorrow?",
        "Where does the person who drinks {drink} plan to go tomorrow?",
        "Tomorrow, where will the person who enjoys {drink} go?")),
    "hop_drink": Family((MHR,), (
        "What does the person who lives in {city} like to drink?", "Which drink does the person from {city} like?",
        "What is the favourite drink of the one who lives in {city}?",
        "The person who has lived in {city} for years likes which drink?",
        "What should I serve the person who lives in {city} to drink?",
        "What drink does the person living in {city} enjoy?")),
    "hop_same_drink": Family((MHR,), (
        "Does the {job} like the same drink as {name}?", "Do the {job} and {name} like the same drink?",
        "Is the favourite drink of the {job} the same as {name}'s?",
        "Would the {job} and {name} order the same drink?",
        "Does the person who works as {a_job} share {name}'s favourite drink?",
        "Do {name} and the {job} enjoy the same drink?")),
    # ---- General Knowledge Extraction: household rules said aloud
    "rule_place": Family((GKE,), (
        "Where does the {item} go in this house?", "Where should the {item} be kept in this house?",
        "In this house, where do you put the {item}?", "Where is the {item} stored in this house?",
        "What is the right place for the {item} in this house?",
        "I have the {item}; where does it belong in this house?")),
    "rule_item": Family((GKE,), (
        "What goes in the {place} in this house?", "What is kept in the {place} in this house?",
        "In this house, what belongs in the {place}?", "What should be put in the {place} in this house?",
        "What would I find in the {place} of this house?", "Which household item is stored in the {place}?")),
    "rule_who": Family((GKE, CMR), (
        "Who explained where the {item} goes in this house?", "Who said where to keep the {item}?",
        "Which person told everyone where the {item} goes?", "Who knows where the {item} belongs in this house?",
        "Who gave the house rule about the {item}?", "Who reminded everyone about the place for the {item}?")),
}
HELDOUT_FAMILY = "hop_drink"  # never asked in training episodes (its sibling hop_plan is)


def split_of(seed: int) -> str:
  """The split an episode seed belongs to: "heldout" for seeds >= HELDOUT_SEED_START, else "train"."""
  return "heldout" if int(seed) >= HELDOUT_SEED_START else "train"


def check_split(seeds: Sequence[int], split: str) -> None:
  """Refuses seeds outside `split` (a held-out seed in a training set leaks the evaluation, and vice versa)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  wrong = [int(s) for s in seeds if split_of(s) != split]
  if wrong:
    raise ValueError(f"seeds {wrong[:5]} are not {split} seeds (held-out seeds are >= {HELDOUT_SEED_START})")


def phrasing_pool(family: str, split: str) -> tuple[int, ...]:
  """Indices of the phrasings of `family` a `split` episode asks with (empty: the family is not asked)."""
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  n = len(FAMILIES[family].phrasings)
  if split == "train":
    return () if family == HELDOUT_FAMILY else tuple(range(TRAIN_PHRASINGS))
  return tuple(range(n)) if family == HELDOUT_FAMILY else tuple(range(TRAIN_PHRASINGS, n))


def article(word: str) -> str:
  return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


@dataclasses.dataclass(frozen=True)
class Draft:
  """A question before phrasing: its family, slot values, gold answer, the utterances it rests on (empty for an
  unanswerable question) and, for questions asked before a later change, the clip it is asked at."""
  family: str
  slots: dict[str, str]
  answer: str
  evidence: tuple[Any, ...]
  why: str
  before_clip: int | None = None

  @property
  def unanswerable(self) -> bool:
    return self.answer == NOT_IN_MEMORY
