"""The widened training phrasings (issue 43): many per family, well formed, and none a dev or test wording.

A train phrasing that equals or nearly equals a dev or test one (of any family) would leak the evaluation's wording
into training; "nearly" is judged on normalised text (lower case, punctuation stripped, `{slots}` kept by name):
the same words in another order, or a word-level difflib ratio of 0.8 or more (about one word in five changed).
WHY words, not characters: character ratios of short questions flag different questions that share a frame
("What does {name} like to eat?" / "What does the {job} like to eat?", 0.81); the original train phrasings reach a
word ratio of 0.78 against the dev and test ones, the new ones stay below 0.8 (and were rewritten where a
character ratio of 0.85 or more flagged them)."""

import difflib
import re
import string

from m3jax.data.phrasings import TRAIN_MORE
from m3jax.data.questions import (DEV_PHRASINGS, FAMILIES, HELDOUT_FAMILY, ORIGINAL_PHRASINGS, TEST_FAMILY,
                                  TRAIN_PHRASINGS, phrasing_pool)

NEAR = 0.8
_SLOT = re.compile(r"\{\w+\}")
_PUNCT = str.maketrans({c: " " for c in set(string.punctuation) - set("{}_")})


def _words(template: str) -> list[str]:
  return template.lower().translate(_PUNCT).split()


def _near(a: str, b: str) -> bool:
  wa, wb = _words(a), _words(b)
  return wa == wb or sorted(wa) == sorted(wb) or difflib.SequenceMatcher(None, wa, wb).ratio() >= NEAR


# Pairs that were there before this table: the original train phrasing 0 of object_from against its dev phrasing
# 5 (word ratio 0.80). Left as they were (train episodes asked it before); a candidate for rewording.
KNOWN = {("Where did {name} move the {object} from?", "Where did {name} take the {object} away from?")}


def _split_phrasings(split: str) -> list[tuple[str, str]]:
  return [(f, FAMILIES[f].phrasings[i]) for f in FAMILIES for i in phrasing_pool(f, split)]


def _slots(template: str) -> frozenset:
  return frozenset(_SLOT.findall(template))


def test_every_trained_family_has_twenty_train_phrasings_and_none_repeats():
  for f in FAMILIES:
    pool = phrasing_pool(f, "train")
    if f in (HELDOUT_FAMILY, TEST_FAMILY):  # never asked in training
      assert not pool and f not in TRAIN_MORE
      continue
    texts = [FAMILIES[f].phrasings[i] for i in pool]
    assert len(texts) >= 20, (f, len(texts))
    assert len({' '.join(_words(t)) for t in texts}) == len(texts), f
  assert set(TRAIN_MORE) == set(FAMILIES) - {HELDOUT_FAMILY, TEST_FAMILY}


def test_dev_and_test_pools_are_the_original_ones():
  """The dev and test pools index the eight original phrasings exactly as before the training phrasings grew."""
  for f, fam in FAMILIES.items():
    assert fam.phrasings[ORIGINAL_PHRASINGS:] == TRAIN_MORE.get(f, ())
    if f == TEST_FAMILY:
      assert phrasing_pool(f, "test") == tuple(range(ORIGINAL_PHRASINGS))
      continue
    assert phrasing_pool(f, "test") == tuple(range(DEV_PHRASINGS, ORIGINAL_PHRASINGS))
    dev = tuple(range(DEV_PHRASINGS)) if f == HELDOUT_FAMILY else tuple(range(TRAIN_PHRASINGS, DEV_PHRASINGS))
    assert phrasing_pool(f, "dev") == dev


def test_no_train_phrasing_is_or_nearly_is_a_dev_or_test_one():
  held = _split_phrasings("dev") + _split_phrasings("test")
  clashes = [(f, t, g, h) for f, t in _split_phrasings("train") for g, h in held if _near(t, h)
             and (t, h) not in KNOWN]
  assert not clashes, clashes


def test_every_phrasing_formats_with_its_family_slots():
  """A new phrasing asks with the slots of one of the family's original phrasings (the ones its drafts fill: a
  `who_job` phrasing names the job, with or without the article), and formats to a question."""
  values = {"name": "Victoria", "object": "keys", "plan": "museum", "job": "doctor", "a_job": "a doctor",
            "topic": "coffee", "order": "first", "a": "Victoria", "b": "Grace", "city": "Paris", "drink": "tea",
            "item": "milk", "place": "fridge door"}
  for f, fam in FAMILIES.items():
    allowed = {_slots(p) for p in fam.phrasings[:ORIGINAL_PHRASINGS]}
    for p in fam.phrasings:
      assert _slots(p) in allowed, (f, p)
      text = p.format(**values)
      assert "{" not in text and len(_words(_SLOT.sub(" ", p))) >= 2, (f, p)  # words of its own, not slots alone
  # capitals inside a sentence are names or "I" (a capitalised word reads as a name to answerers)
  for f, more in TRAIN_MORE.items():
    for p in more:
      words = _SLOT.sub("x", p).split()
      assert not [w for prev, w in zip(words, words[1:]) if w[0].isupper() and w.strip(string.punctuation) != "I"
                  and not prev.endswith((".", "?", "!"))], (f, p)


def test_no_train_template_matches_a_dev_or_test_question():
  """Text-level leakage, statically: a new train template (slots as wildcards) matches no dev or test phrasing
  filled in, and no dev or test template matches a new train one (the episode tests check drawn questions). Four
  original train phrasings match another family's dev or test phrasing this way ("What does {name} like to eat?"
  / "What does the {job} like to eat?"): the hop families were written as those frames around a description."""
  values = {"name": "Victoria", "object": "keys", "plan": "museum", "job": "doctor", "a_job": "a doctor",
            "topic": "going to the museum", "order": "first", "a": "Victoria", "b": "Grace", "city": "Paris",
            "drink": "tea", "item": "milk", "place": "fridge door"}

  def regex(t):
    return re.compile("^" + re.sub(r"\\\{\w+\\\}", ".+", re.escape(t)) + "$", re.IGNORECASE)
  train = [t for more in TRAIN_MORE.values() for t in more]
  held = [t for _, t in _split_phrasings("dev") + _split_phrasings("test")]
  assert not [(t, h) for t in train for h in held if regex(t).match(h.format(**values))]
  assert not [(h, t) for t in train for h in held if regex(h).match(t.format(**values))]


def test_train_questions_may_name_a_person_by_a_unique_fact_said_before_they_are_asked():
  """Some training questions name their person by a fact ("the person who lives in Boston", "the nurse"): the fact
  is true of that person alone, said by them by the question's clip, and the answer is what the named question
  would have (the person's own fact). Dev and test questions never do."""
  from m3jax.data.episodes import DESCRIBE_FRACTION, EpisodeConfig, make_episode
  from m3jax.data.questions import HELDOUT_SEED_START, TEST_SEED_START
  answers = {"drink": lambda f: [f["drink"]], "dislike": lambda f: [f["dislike"]],
             "plan": lambda f: [f["plan"]], "job": lambda f: [f["job"]], "city": lambda f: [f["city"]],
             "object_place": lambda f: [f["furniture"], f["moved_to"]], "object_from": lambda f: [f["furniture"]]}
  described = total = 0
  for seed in range(60):
    ep = make_episode(EpisodeConfig(seed=seed, num_clips=4, num_characters=3))
    for q in ep.qa_list:
      total += 1
      if "described" not in q:
        continue
      described += 1
      kind = q["described"]
      value = next(c.facts[kind] for c in ep.characters if c.facts[kind] in q["question"] or
                   (kind == "job" and f"the {c.facts[kind]}" in q["question"]))
      who = [c for c in ep.characters if c.facts[kind] == value]
      assert len(who) == 1 and kind != q["family"], q
      assert not [c.name for c in ep.characters if c.name in q["question"]], q  # no name given away
      said = [u for s in ep.clips for u in s.utterances if u.speaker == who[0].name and u.kind == kind]
      assert said and said[0].clip <= q["before_clip"] and said[0].clip in q["evidence_clips"], q
      truth = q["answer"].rstrip(".").lower().removeprefix("on the ").removeprefix("the ")
      assert truth in [v.lower() for v in answers[q["family"]](who[0].facts)], q
  assert 0.05 * total <= described <= DESCRIBE_FRACTION * total, (described, total)  # 8% at 0.3
  for start in (HELDOUT_SEED_START, TEST_SEED_START):
    for seed in range(start, start + 40):
      assert not [q for q in make_episode(EpisodeConfig(seed=seed, num_clips=4, num_characters=3)).qa_list
                  if "described" in q]
