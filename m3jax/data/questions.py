"""Question families of generated episodes: several phrasings each, dev and test phrasings and families, unanswerables.

WHY: one fixed phrasing per question lets an answerer pass by template matching (the rule answerer's regexes did),
and numbers measured on the data every choice was made on overstate what the agent does on new data. Episodes
fall in three splits by seed (`split_of`):
- train (seeds < HELDOUT_SEED_START): phrasings[:4] and phrasings[8:] of every family but HELDOUT_FAMILY and
  TEST_FAMILY: 21 a family, the 17 from index 8 on (`m3jax.data.phrasings.TRAIN_MORE`: indirect requests, other word
  orders, terse and casual forms, yes/no forms only where the answer is Yes or No, forms mined from the M3-Bench
  questions) added because four let an answerer learn templates instead of questions (issue 43);
- dev (HELDOUT_SEED_START <= seed < TEST_SEED_START, once called held out): phrasings[4:6] and HELDOUT_FAMILY;
  training curves and every choice (learning rates, teachers, answer cuts) are made on it;
- test (seeds >= TEST_SEED_START): phrasings[6:8], hand-written apart from the others, HELDOUT_FAMILY in those
  phrasings and TEST_FAMILY, asked nowhere else; only the final evaluation and the demo use it.
Training code checks its seeds with `check_split` / `refuse_test_seeds`. Dev episodes are what they were before
the test split existed (the test split only added), and dev and test episodes are what they were before the
training phrasings grew: those are appended after the eight original phrasings, so the dev and test pools (and the
rng draws over them) did not change; train episodes did (tests/test_episodes.py pins all three digests).
tests/test_phrasings.py checks that no training phrasing equals or nearly equals a dev or test one.

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

from m3jax.data.phrasings import TRAIN_MORE

NOT_IN_MEMORY = "The memory does not say."
HELDOUT_SEED_START = 1_000_000  # the dev split's first seed (its old name: held out)
TEST_SEED_START = 2_000_000
SPLITS = ("train", "dev", "test")
TRAIN_PHRASINGS = 4  # phrasings[:4] and [8:] are asked in training episodes, [4:6] in dev ones, [6:8] in test ones
DEV_PHRASINGS = 6
ORIGINAL_PHRASINGS = 8  # the end of the test phrasings; the training phrasings of `phrasings.TRAIN_MORE` follow

PU, CMR, MDR = "Person Understanding", "Cross-Modal Reasoning", "Multi-Detail Reasoning"
MHR, GKE = "Multi-Hop Reasoning", "General Knowledge Extraction"


@dataclasses.dataclass(frozen=True)
class Family:
  types: tuple[str, ...]
  phrasings: tuple[str, ...]  # str.format templates over the family's slots


_FAMILIES: dict[str, Family] = {
    # ---- Person Understanding: preferences, plans, jobs, cities
    "drink": Family((PU,), (
        "What does {name} like to drink?", "What is {name}'s favourite drink?", "Which drink does {name} enjoy?",
        "What does {name} drink in the morning?",
        "If you made {name} a drink, what should it be?", "What drink should I bring for {name}?",
        # test only
        "Any idea what {name} usually orders to drink?", "Tell me {name}'s drink of choice.")),
    "food": Family((PU,), (
        "What is {name}'s favourite food?", "What food does {name} like best?",
        "Which food does {name} eat every week?", "What does {name} like to eat?",
        "What should I cook for {name}?", "Which dish would make {name} happy?",
        # test only
        "Planning a dinner: what does {name} love to eat most?", "Name the meal {name} never gets tired of.")),
    "dislike": Family((PU,), (
        "What does {name} not like to drink?", "Which drink does {name} dislike?",
        "What drink should I not give {name}?", "Which drink does {name} not enjoy?",
        "What drink does {name} avoid?", "Which drink would {name} refuse?",
        # test only
        "Which drink is {name} not a fan of?", "I'm making drinks; which one will {name} turn down?")),
    "plan": Family((PU,), (
        "Where will {name} go tomorrow?", "Where is {name} going tomorrow?",
        "What place will {name} visit tomorrow?", "Where does {name} plan to go tomorrow?",
        "Which place is on {name}'s plan for tomorrow?", "Where can I find {name} tomorrow?",
        # test only
        "What are {name}'s plans for tomorrow, place-wise?", "Tomorrow {name} is heading out. To where?")),
    "job": Family((PU,), (
        "What is {name}'s job?", "What does {name} do for work?", "What does {name} work as?",
        "Which job does {name} have?",
        "What is the profession of {name}?", "How does {name} earn a living?",
        # test only
        "What line of work is {name} in?", "Remind me, what is {name}'s occupation?")),
    "city": Family((PU,), (
        "Which city does {name} live in?", "Where does {name} live?",
        "In which city has {name} lived for many years?", "What city is {name}'s home?",
        "Which city is {name} from?", "Where is the home town of {name}?",
        # test only
        "What town does {name} call home?", "If I wanted to visit {name} at home, which city would I travel to?")),
    # ---- objects and places, and what changed (asked before and after the move, with before_clip)
    "object_place": Family((PU, CMR), (
        "Where can {name}'s {object} be found?", "Where should I look for {name}'s {object}?",
        "Where did {name} leave the {object}?", "Where does {name} keep the {object}?",
        "If {name} needs the {object}, where should {name} look?", "Where would you find {name}'s {object}?",
        # test only
        "I'm looking for the {object} that belongs to {name}. Any idea where it is?",
        "{name} lost track of the {object}; where is it now?")),
    "object_from": Family((MDR,), (
        "Where did {name} move the {object} from?", "Where had {name} put the {object} before moving it?",
        "From which place did {name} take the {object}?", "What was the first place {name} put the {object}?",
        "Before the move, where did {name} keep the {object}?", "Where did {name} take the {object} away from?",
        # test only
        "The {object} of {name} got moved. Where was it sitting originally?",
        "Which spot did {name}'s {object} start out on?")),
    # ---- Cross-Modal Reasoning: who said it (voice -> face -> name), who was present
    "who_plan": Family((CMR,), (
        "Who said they will go to the {plan} tomorrow?", "Who is going to the {plan} tomorrow?",
        "Which person plans to visit the {plan} tomorrow?", "Who will be at the {plan} tomorrow?",
        "Who mentioned a trip to the {plan} tomorrow?", "Whose plan for tomorrow is the {plan}?",
        # test only
        "Somebody has a {plan} trip planned for tomorrow. Who?", "Whose day tomorrow includes the {plan}?")),
    "who_job": Family((CMR,), (
        "Who works as {a_job}?", "Which person is {a_job}?", "Who said they work as {a_job}?",
        "Who has a job as {a_job}?",
        "Who here earns a living as {a_job}?", "Which of the people is the {job}?",
        # test only
        "Is anyone here {a_job}? Who?", "Which one of them has the {job}'s job?")),
    "present_when": Family((CMR,), (
        "Who else was there when {name} talked about {topic}?",
        "Apart from {name}, who was in the room when {name} spoke about {topic}?",
        "Who was with {name} when {name} mentioned {topic}?", "Which person heard {name} talk about {topic}?",
        "Who was listening when {name} brought up {topic}?",
        "Who kept {name} company while {name} talked about {topic}?",
        # test only
        "When {name} chatted about {topic}, who else could hear it?",
        "{name} talked about {topic}; name the other person who was around.")),
    "mention_order": Family((CMR, MDR), (
        "Who mentioned the {object} {order}?", "Who talked about the {object} {order}?",
        "Which person spoke about the {object} {order}?", "Who was the {order} to mention the {object}?",
        "Who brought up the {object} {order}?", "Which person was the {order} one to talk about the {object}?",
        # test only
        "Of everyone, who spoke of the {object} {order}?", "Who raised the subject of the {object} {order}?")),
    # ---- Multi-Detail Reasoning: comparisons between two people
    "compare_same": Family((MDR,), (
        "Do {a} and {b} like the same drink?", "Do {a} and {b} enjoy the same drink?",
        "Is {a}'s favourite drink the same as {b}'s?", "Would {a} and {b} order the same drink?",
        "Does {a} like to drink what {b} likes to drink?", "Do {a} and {b} share a favourite drink?",
        # test only
        "Is there a drink that {a} and {b} both like best?",
        "If {a} and {b} went to a cafe, would they order the same thing to drink?")),
    "compare_which": Family((MDR,), (
        "Who lives in {city}, {a} or {b}?", "Which of {a} and {b} lives in {city}?",
        "Does {a} or {b} live in {city}?", "Between {a} and {b}, who has lived in {city} for years?",
        "Is it {a} or {b} who lives in {city}?", "Of {a} and {b}, whose home is in {city}?",
        # test only
        "{city} is home to one of them: {a} or {b}?", "I heard that {a} or {b} lives in {city}. Which one?")),
    # ---- Multi-Hop Reasoning: a description resolved to a person, then a fact, then another person
    "hop_plan": Family((MHR,), (
        "Where will the person who likes {drink} go tomorrow?",
        "Where is the one who likes to drink {drink} going tomorrow?",
        "What place will the {drink} lover visit tomorrow?",
        "The person who likes {drink}: where will they go tomorrow?",
        "Where does the person who drinks {drink} plan to go tomorrow?",
        "Tomorrow, where will the person who enjoys {drink} go?",
        # test only
        "Someone here loves {drink}. What is their plan for tomorrow?",
        "The {drink} drinker has plans tomorrow; where to?")),
    "hop_drink": Family((MHR,), (
        "What does the person who lives in {city} like to drink?", "Which drink does the person from {city} like?",
        "What is the favourite drink of the one who lives in {city}?",
        "The person who has lived in {city} for years likes which drink?",
        "What should I serve the person who lives in {city} to drink?",
        "What drink does the person living in {city} enjoy?",
        # test only
        "Someone here lives in {city}. What do they like to drink?",
        "Think of the {city} resident: what drink do they enjoy?")),
    "hop_same_drink": Family((MHR,), (
        "Does the {job} like the same drink as {name}?", "Do the {job} and {name} like the same drink?",
        "Is the favourite drink of the {job} the same as {name}'s?",
        "Would the {job} and {name} order the same drink?",
        "Does the person who works as {a_job} share {name}'s favourite drink?",
        "Do {name} and the {job} enjoy the same drink?",
        # test only
        "Do {name} and whoever works as {a_job} have the same favourite drink?",
        "Would {name} and the {job} be happy with the same drink?")),
    # ---- General Knowledge Extraction: household rules said aloud
    "rule_place": Family((GKE,), (
        "Where does the {item} go in this house?", "Where should the {item} be kept in this house?",
        "In this house, where do you put the {item}?", "Where is the {item} stored in this house?",
        "What is the right place for the {item} in this house?",
        "I have the {item}; where does it belong in this house?",
        # test only
        "Quick question about the house: where should the {item} end up?",
        "Just found the {item} lying around. Where does it go here?")),
    "rule_item": Family((GKE,), (
        "What goes in the {place} in this house?", "What is kept in the {place} in this house?",
        "In this house, what belongs in the {place}?", "What should be put in the {place} in this house?",
        "What would I find in the {place} of this house?", "Which household item is stored in the {place}?",
        # test only
        "Looking in the {place}, what am I supposed to find there?", "The {place} is meant for what, in this house?")),
    "rule_who": Family((GKE, CMR), (
        "Who explained where the {item} goes in this house?", "Who said where to keep the {item}?",
        "Which person told everyone where the {item} goes?", "Who knows where the {item} belongs in this house?",
        "Who gave the house rule about the {item}?", "Who reminded everyone about the place for the {item}?",
        # test only
        "The rule about the {item}: who told us that?", "Who laid down the rule for where the {item} goes?")),
    # ---- asked only in test episodes (TEST_FAMILY): a job resolved to a person, then their favourite food
    "hop_food": Family((MHR,), (
        "What is the favourite food of the person who works as {a_job}?", "What does the {job} like to eat?",
        "Which food does the person working as {a_job} like best?", "The {job}: what is their favourite food?",
        "What should I cook for the person who works as {a_job}?", "Which dish would the {job} enjoy most?",
        "We are having the {job} over for lunch. What would they most like to eat?",
        "Whoever is the {job} here has a favourite dish. Which is it?")),
}
HELDOUT_FAMILY = "hop_drink"  # asked in dev and test episodes, never in training ones (its sibling hop_plan is)
TEST_FAMILY = "hop_food"  # asked only in test episodes: neither training nor any choice made on dev has seen it
# Every family: its eight original phrasings, then `phrasings.TRAIN_MORE`'s (train only, indices ORIGINAL_PHRASINGS..).
FAMILIES: dict[str, Family] = {name: Family(fam.types, fam.phrasings + TRAIN_MORE.get(name, ()))
                               for name, fam in _FAMILIES.items()}


def split_of(seed: int) -> str:
  """The split an episode seed belongs to: "test" from TEST_SEED_START, "dev" from HELDOUT_SEED_START, else
  "train"."""
  seed = int(seed)
  return "test" if seed >= TEST_SEED_START else "dev" if seed >= HELDOUT_SEED_START else "train"


def _canonical(split: str) -> str:
  if split not in SPLITS + ("heldout",):
    raise ValueError(f"split must be one of {SPLITS} (heldout = dev), got {split!r}")
  return "dev" if split == "heldout" else split


def check_split(seeds: Sequence[int], split: str) -> None:
  """Refuses seeds outside `split` (a dev or test seed in a training set leaks the evaluation, a test seed in a
  dev set leaks the final evaluation into the choices made on dev). "heldout" is the dev split's old name."""
  want = _canonical(split)
  wrong = [int(s) for s in seeds if split_of(s) != want]
  if wrong:
    test = [s for s in wrong if split_of(s) == "test"]
    why = (f"; test seeds (>= {TEST_SEED_START:,}) are only for the final evaluation (python -m bench.controller_eval "
           f"--split test) and the demo, never for training, training curves or choices" if test else "")
    raise ValueError(f"seeds {wrong[:5]} are not {split} seeds (train < {HELDOUT_SEED_START:,} <= dev < "
                     f"{TEST_SEED_START:,} <= test){why}")


def refuse_test_seeds(seeds: Sequence[int], what: str) -> None:
  """For code that may mix train and dev seeds but must never see a test one (training data, training curves)."""
  test = [int(s) for s in seeds if split_of(s) == "test"]
  if test:
    raise ValueError(f"{what}: seeds {test[:5]} are test seeds (>= {TEST_SEED_START:,}), only for the final "
                     "evaluation (python -m bench.controller_eval --split test) and the demo")


def phrasing_pool(family: str, split: str) -> tuple[int, ...]:
  """Indices of the phrasings of `family` a `split` episode asks with (empty: the family is not asked). Train asks
  phrasings[:4] and [8:] (`phrasings.TRAIN_MORE`), dev phrasings[4:6] (all six of HELDOUT_FAMILY), test
  phrasings[6:8] (all eight of TEST_FAMILY); so no phrasing is asked in two splits, except HELDOUT_FAMILY's first
  six, which are dev's alone. The dev and test pools are what they were before the training phrasings grew, so
  dev and test episodes (the same rng draws over the same pools) are byte for byte what they were."""
  split = _canonical(split)
  n = len(FAMILIES[family].phrasings)
  if split == "test":
    return tuple(range(ORIGINAL_PHRASINGS)) if family == TEST_FAMILY else tuple(range(DEV_PHRASINGS,
                                                                                        ORIGINAL_PHRASINGS))
  if family == TEST_FAMILY:
    return ()
  if split == "train":
    return () if family == HELDOUT_FAMILY else tuple(range(TRAIN_PHRASINGS)) + tuple(range(ORIGINAL_PHRASINGS, n))
  return tuple(range(DEV_PHRASINGS)) if family == HELDOUT_FAMILY else tuple(range(TRAIN_PHRASINGS, DEV_PHRASINGS))


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
