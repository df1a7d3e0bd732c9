"""Deterministic generator of multi-speaker episodes: the test data no model has seen.

An episode is a cast of characters (real face photos shipped in packages, each with a distinct espeak-ng voice
and a name said aloud) and a script over N 30-s clips: who is present, who says what (names, preferences and
dislikes, plans, jobs, cities, objects and where they were put, later moves of those objects, household rules).
Distractors are seeded in: two people may like the same drink, live in the same city or own the same object.
From the script we derive M3-Bench-format annotations (questions of the five types in the families and phrasings
of `m3jax.data.questions`, answers, `before_clip`, evidence clip ids, plus `family`, `phrasing`, `heldout` (a dev
or test episode), `unanswerable` and `distractors`: the episode's other values of the answer's slot, which a strict
judge refuses beside the truth; in training episodes `described` where the question names its person by a fact
instead of a name: `DESCRIBE_FRACTION`) and the gold memories an ideal memorizer would write per clip.
Everything here is pure Python on a seeded `numpy.random.Generator`, so the same seed gives the same episode
whatever PYTHONHASHSEED is; `m3jax.data.episode_render` turns it into an mp4. The cast, the config and the
script's pieces are `m3jax.data.script`'s; this module assembles them and derives the questions and gold memories.

Gold memories name people with placeholders `<face:NAME>` / `<voice:NAME>`: the node ids an ideal memorizer would
use are only known once perception has run, so `render_gold` substitutes them.
"""

from __future__ import annotations

import dataclasses
import re
import string
from typing import Any

import numpy as np

from m3jax.data.questions import FAMILIES, NOT_IN_MEMORY, TEST_FAMILY, Draft, article, phrasing_pool, split_of
from m3jax.data.script import (JOBS, NAMES, PHOTO_ORDER, RULE_ITEMS, SMALL_TALK, Character, ClipScript, EpisodeConfig,
                               Utterance, draw_agenda, draw_cast, draw_other, draw_presence, pick_distinct,
                               sentence_for)

QUESTION_TYPES = ("Person Understanding", "Cross-Modal Reasoning", "Multi-Detail Reasoning",
                  "Multi-Hop Reasoning", "General Knowledge Extraction")

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


def make_episode(config: EpisodeConfig = EpisodeConfig()) -> Episode:
  """Writes the script, the questions (of the split the seed belongs to: `questions.split_of`) and the gold
  memories of one episode (no media)."""
  rng = np.random.default_rng(config.seed)
  chars = draw_cast(rng, config.num_characters)
  by_name = {c.name: c for c in chars}
  rules = dict(pick_distinct(rng, RULE_ITEMS, min(2, len(RULE_ITEMS))))
  presence = draw_presence(rng, config.num_clips, [c.name for c in chars])
  pending = {c.name: draw_agenda(rng) for c in chars}
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
      while todo and todo[0] == "rule" and not pending_rules:
        todo.pop(0)
      rule_item = None
      if todo:
        kind = todo.pop(0)
      elif pending_rules:
        kind = "rule"
      else:
        kind = "small_talk"
      if kind == "rule":
        rule_item = pending_rules.pop(0)
      text = (SMALL_TALK[int(rng.integers(len(SMALL_TALK)))] if kind == "small_talk"
              else sentence_for(kind, by_name[speaker], rules, rule_item))
      start = round(clip * config.clip_seconds + j * slot + 0.5 + float(rng.uniform(0.0, 0.5)), 2)
      utts.append(Utterance(clip, start, speaker, text, kind))
    clips.append(ClipScript(clip, present, tuple(utts)))
  # A talking episode has its own id: caches keyed by episode id (writer_data's render dirs) keep both renderings.
  ep_id = f"episode_{config.seed:04d}" + ("_talking" if config.talking_faces else "")
  qa = _questions(rng, ep_id, config, chars, clips, rules)
  return Episode(ep_id, config, chars, tuple(clips), rules, tuple(qa), _gold(clips, by_name))


def _said(clips, kind: str, speaker: str | None = None, contains: str | None = None) -> list[Utterance]:
  return [u for s in clips for u in s.utterances if u.kind == kind and (speaker is None or u.speaker == speaker)
          and (contains is None or contains in u.text)]


def _mmss(seconds: float) -> str:
  s = int(seconds)
  return f"{s // 60:02d}:{s % 60:02d}"


_ANSWERS = {"drink": lambda f: f"{f['drink'].capitalize()}.", "food": lambda f: f"{f['food'].capitalize()}.",
            "dislike": lambda f: f"{f['dislike'].capitalize()}.", "plan": lambda f: f"The {f['plan']}.",
            "job": lambda f: f"{f['job'].capitalize()}.", "city": lambda f: f"{f['city']}."}
_TOPICS = {"drink": lambda f: f["drink"], "food": lambda f: f["food"], "plan": lambda f: f"going to the {f['plan']}",
           "city": lambda f: f"living in {f['city']}", "job": lambda f: f"working as {article(f['job'])}"}


def _unique(chars, key: str, value: str) -> bool:
  return sum(c.facts[key] == value for c in chars) == 1


def _yes_no(same: bool) -> str:
  return "Yes." if same else "No."


def _drafts(rng, chars, clips, rules, test: bool = False) -> tuple[list[Draft], list[Draft]]:
  """(answerable, unanswerable) questions before phrasing. Answerable ones rest on utterances of the script;
  a question about a person needs their intro (the only way the memory can tie the name to a face). `test` adds
  TEST_FAMILY's drafts; they draw nothing from `rng` and are added only there, so train and dev episodes (whose
  number of drafts sets how many unanswerables are drawn) stay what they were."""
  def first(kind, who=None):
    said = _said(clips, kind, who)
    return said[0] if said else None
  intro = {c.name: first("intro", c.name) for c in chars}
  ok, missing = [], []
  for c in chars:
    f, name, me = c.facts, c.name, intro[c.name]
    if me is None:
      continue
    for kind, answer in _ANSWERS.items():
      u = first(kind, name)
      if u is None:
        missing.append(Draft(kind, {"name": name}, NOT_IN_MEMORY, (), f"{name} never says their {kind}"))
      else:
        ok.append(Draft(kind, {"name": name}, answer(f), (me, u), f"{name} said: {u.text}"))
    obj, mv = first("object", name), first("move", name)
    slots = {"name": name, "object": f["object"]}
    if obj and mv:
      ok.append(Draft("object_place", slots, f"On the {f['moved_to']}.", (me, obj, mv), mv.text))
      ok.append(Draft("object_from", slots, f"On the {f['furniture']}.", (me, obj, mv), f"{obj.text} {mv.text}"))
      if mv.clip > obj.clip:  # asked before the change: the answer is where it was then
        ok.append(Draft("object_place", slots, f"On the {f['furniture']}.", (me, obj), obj.text,
                        before_clip=int(rng.integers(obj.clip, mv.clip))))
    elif obj:
      ok.append(Draft("object_place", slots, f"On the {f['furniture']}.", (me, obj), obj.text))
    plan, job, drink, city = first("plan", name), first("job", name), first("drink", name), first("city", name)
    if plan and _unique(chars, "plan", f["plan"]):
      ok.append(Draft("who_plan", {"plan": f["plan"]}, f"{name}.", (me, plan), f"the voice of {name}: {plan.text}"))
    if job and _unique(chars, "job", f["job"]):
      ok.append(Draft("who_job", {"job": f["job"], "a_job": article(f["job"])}, f"{name}.", (me, job), job.text))
    for u in (u for s in clips if len(s.present) == 2 for u in s.utterances
              if u.speaker == name and u.kind in _TOPICS):
      other = next(n for n in clips[u.clip].present if n != name)
      if intro[other] is not None:
        ok.append(Draft("present_when", {"name": name, "topic": _TOPICS[u.kind](f)}, f"{other}.",
                        (me, intro[other], u), f"{other} was on screen when {name} said: {u.text}"))
        break
    if drink and plan and _unique(chars, "drink", f["drink"]):
      ok.append(Draft("hop_plan", {"drink": f["drink"]}, f"The {f['plan']}.", (drink, plan),
                      f"{name} likes {f['drink']} and will go to the {f['plan']}"))
    if drink and city and _unique(chars, "city", f["city"]):
      ok.append(Draft("hop_drink", {"city": f["city"]}, f"{f['drink'].capitalize()}.", (city, drink),
                      f"{name} lives in {f['city']} and likes {f['drink']}"))
    food = first("food", name)
    if test and job and food and _unique(chars, "job", f["job"]):
      ok.append(Draft(TEST_FAMILY, {"job": f["job"], "a_job": article(f["job"])}, f"{f['food'].capitalize()}.",
                      (job, food), f"the {f['job']} ({name}) likes {f['food']}"))
    if job and drink and _unique(chars, "job", f["job"]):
      for other in chars:
        od = first("drink", other.name)
        if other.name != name and od and intro[other.name]:
          ok.append(Draft("hop_same_drink", {"job": f["job"], "a_job": article(f["job"]), "name": other.name},
                          _yes_no(f["drink"] == other.facts["drink"]), (job, drink, intro[other.name], od),
                          f"the {f['job']} ({name}) likes {f['drink']}, {other.name} likes {other.facts['drink']}"))
          break
  for i, a in enumerate(chars):
    for b in chars[i + 1:]:
      if not (intro[a.name] and intro[b.name]):
        continue
      da, db = first("drink", a.name), first("drink", b.name)
      if da and db:
        ok.append(Draft("compare_same", {"a": a.name, "b": b.name}, _yes_no(a.facts["drink"] == b.facts["drink"]),
                        (intro[a.name], intro[b.name], da, db), f"{da.text} / {db.text}"))
      ca, cb = first("city", a.name), first("city", b.name)
      if ca and cb and a.facts["city"] != b.facts["city"]:
        who = (a, ca) if rng.random() < 0.5 else (b, cb)
        ok.append(Draft("compare_which", {"a": a.name, "b": b.name, "city": who[0].facts["city"]},
                        f"{who[0].name}.", (intro[a.name], intro[b.name], ca, cb), who[1].text))
  owners: dict[str, list[str]] = {}
  for c in chars:
    owners.setdefault(c.facts["object"], []).append(c.name)
  for obj, names in owners.items():
    mentions = sorted((u for s in clips for u in s.utterances if u.speaker in names and u.kind in ("object", "move")),
                      key=lambda u: u.start)
    if len(names) > 1 and len({u.speaker for u in mentions}) > 1 and all(intro[u.speaker] for u in mentions):
      order = "first" if rng.random() < 0.5 else "last"
      u = mentions[0] if order == "first" else mentions[-1]
      ok.append(Draft("mention_order", {"object": obj, "order": order}, f"{u.speaker}.",
                      tuple(intro[n] for n in names) + tuple(mentions), f"{u.speaker} spoke of the {obj} {order}"))
  for item, where in rules.items():
    said = _said(clips, "rule", contains=f"the {item} goes")
    if said:
      u = said[0]
      ok.append(Draft("rule_place", {"item": item}, f"In the {where}.", (u,), u.text))
      ok.append(Draft("rule_item", {"place": where}, f"The {item}.", (u,), u.text))
      if intro[u.speaker]:
        ok.append(Draft("rule_who", {"item": item}, f"{u.speaker}.", (intro[u.speaker], u), u.text))
  cast = [c.name for c in chars]
  absent = [n for p in PHOTO_ORDER for n in NAMES[p] if n not in cast]
  name = absent[int(rng.integers(len(absent)))]
  kind = list(_ANSWERS)[int(rng.integers(len(_ANSWERS)))]
  missing.append(Draft(kind, {"name": name}, NOT_IN_MEMORY, (), f"nobody called {name} is in the video"))
  job = draw_other(rng, [j for j in JOBS if all(c.facts["job"] != j for c in chars)], "")
  missing.append(Draft("who_job", {"job": job, "a_job": article(job)}, NOT_IN_MEMORY, (), f"nobody is a {job}"))
  item = draw_other(rng, [i for i, _ in RULE_ITEMS if i not in rules], "")
  missing.append(Draft("rule_place", {"item": item}, NOT_IN_MEMORY, (), f"no rule for the {item} was said"))
  return ok, missing


# Training questions that name their person by a fact instead of a name ("the person who lives in Boston", "the
# nurse"), about one in DESCRIBE_FRACTION. WHY: people ask that way (issue 43), and a controller that only ever saw
# names learns to resolve names, not people. Train only: dev and test episodes (and every number measured on them)
# stay what they were, so the form is learned but not yet measured.
DESCRIBE_FRACTION = 0.3
# Not `food`: the food of a described person is TEST_FAMILY's question (its templates, "What does the {job} like to
# eat?", would match it).
DESCRIBED_FAMILIES = ("drink", "dislike", "plan", "job", "city", "object_place", "object_from")
# (family, fact) pairs a description must not make: the asked fact itself gives the answer away, and the others
# would be hop families asked in dev (the drink of the person who lives in X is HELDOUT_FAMILY; the plan of the
# person who likes X is hop_plan, whose dev phrasings read "the person who drinks X").
_NOT_DESCRIBED = {("drink", "drink"), ("plan", "plan"), ("job", "job"), ("city", "city"), ("drink", "city"),
                  ("plan", "drink")}
_DESCRIPTIONS = {"city": lambda f: f"the person who lives in {f['city']}", "job": lambda f: f"the {f['job']}",
                 "drink": lambda f: f"the person who likes {f['drink']}",
                 "plan": lambda f: f"the person going to the {f['plan']} tomorrow",
                 "food": lambda f: f"the person whose favourite food is {f['food']}"}


def _describe(rng, d: Draft, template: str, chars, clips) -> tuple[Draft, str] | None:
  """`d` with its person named by a fact the memory holds by the time it is asked (said by them, no later than
  `d.before_clip` when set, and true of nobody else in the episode), or None when no such fact fits: `template`
  names the person more than once, or as a possessive where only a job fits ("the nurse's keys")."""
  if d.family not in DESCRIBED_FAMILIES or d.unanswerable or template.count("{name}") != 1:
    return None
  c = next(c for c in chars if c.name == d.slots["name"])
  kinds = ("job",) if "{name}'s" in template else tuple(_DESCRIPTIONS)
  facts = [u for kind in kinds if (d.family, kind) not in _NOT_DESCRIBED and _unique(chars, kind, c.facts[kind])
           for u in _said(clips, kind, c.name)[:1] if d.before_clip is None or u.clip <= d.before_clip]
  if not facts:
    return None
  u = facts[int(rng.integers(len(facts)))]
  slots = {**d.slots, "name": _DESCRIPTIONS[u.kind](c.facts), "described_by": c.facts[u.kind]}
  return dataclasses.replace(d, slots=slots, evidence=d.evidence + (u,), why=f"{d.why}; {c.name}: {u.text}"), u.kind


def _questions(rng, ep_id, config, chars, clips, rules) -> list[dict[str, Any]]:
  """Questions of the five M3-Bench types, phrased for the seed's split. About one in six is unanswerable; in
  training episodes about DESCRIBE_FRACTION of those `_describe` can name by a fact do (`described`: the fact's
  kind)."""
  split = split_of(config.seed)
  ok, missing = _drafts(rng, chars, clips, rules, test=split == "test")
  k = min(len(missing), max(1, len(ok) // 5))
  keep = sorted(int(i) for i in rng.choice(len(missing), size=k, replace=False))
  out = []
  for d in ok + [missing[i] for i in keep]:
    pool = phrasing_pool(d.family, split)
    if not pool:
      continue
    phrasing = pool[int(rng.integers(len(pool)))]
    described = None
    if split == "train" and rng.random() < DESCRIBE_FRACTION:  # no draw outside training: dev and test unchanged
      found = _describe(rng, d, FAMILIES[d.family].phrasings[phrasing], chars, clips)
      if found:
        d, described = found
    text = FAMILIES[d.family].phrasings[phrasing].format(**d.slots)
    last = d.before_clip if d.before_clip is not None else max((u.clip for u in d.evidence),
                                                                default=config.num_clips - 1)
    end = config.num_clips * config.clip_seconds
    t = min((last + 1) * config.clip_seconds + float(rng.uniform(0, config.clip_seconds - 1)), end)
    out.append({"question": text[0].upper() + text[1:], "answer": d.answer,
                "question_id": f"{ep_id}_Q{len(out) + 1:02d}", "reasoning": d.why, "timestamp": _mmss(t),
                "type": list(FAMILIES[d.family].types), "before_clip": int(t // config.clip_seconds) - 1,
                "evidence_clips": sorted({u.clip for u in d.evidence}), "family": d.family, "phrasing": phrasing,
                "heldout": split != "train", "unanswerable": d.unanswerable,
                **({"described": described} if described else {}),
                "distractors": distractors(d.family, d.answer, chars, rules, d.slots)})
  return out


# The slot a family's answer fills (values of which `distractors` lists); "yes_no" families answer Yes or No.
_ANSWER_SLOT = {"drink": "drink", "dislike": "drink", "hop_drink": "drink", "food": "food", "hop_food": "food",
                "plan": "place", "hop_plan": "place", "job": "job", "city": "city", "object_place": "furniture",
                "object_from": "furniture", "who_plan": "person", "who_job": "person", "present_when": "person",
                "mention_order": "person", "compare_which": "person", "rule_who": "person",
                "compare_same": "yes_no", "hop_same_drink": "yes_no", "rule_place": "rule_place",
                "rule_item": "rule_item"}


def slot_values(slot: str, chars, rules: dict[str, str]) -> list[str]:
  """Every value of `slot` the episode's script holds (the people's drinks and dislikes, foods, ...)."""
  f = [c.facts for c in chars]
  values = {"drink": [x[k] for x in f for k in ("drink", "dislike")], "food": [x["food"] for x in f],
            "place": [x["plan"] for x in f], "job": [x["job"] for x in f], "city": [x["city"] for x in f],
            "furniture": [x[k] for x in f for k in ("furniture", "moved_to")], "person": [c.name for c in chars],
            "yes_no": ["Yes", "No"], "rule_place": list(rules.values()), "rule_item": list(rules)}[slot]
  return list(dict.fromkeys(values))


def distractors(family: str, answer: str, chars, rules: dict[str, str], slots: dict[str, str] | None = None
                ) -> list[str]:
  """The episode's values of the answer's slot other than the truth (all of them for an unanswerable question):
  an answer naming one of them beside the truth is a list or a hedge, which the strict judge refuses. WHY from the
  generator: it alone knows which other drinks, places, people and jobs the memory holds. Values the question
  itself names (`slots`: "who was with Victoria ...") are left out, as an answer may repeat them, except where
  they are the alternatives offered ("Anna or Grace?")."""
  truth = f" {_norm(answer)} " if answer != NOT_IN_MEMORY else ""
  asked = set() if family == "compare_which" else {_norm(v) for v in (slots or {}).values()}
  return [v for v in slot_values(_ANSWER_SLOT[family], chars, rules)
          if f" {_norm(v)} " not in truth and _norm(v) not in asked]


def _norm(text: str) -> str:
  """`judges.normalize_answer` (lower case, no punctuation nor articles), inlined: data does not import agents."""
  text = text.lower().translate(str.maketrans({c: " " for c in string.punctuation}))
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def utterance_fact(u: Utterance, c: Character) -> str | None:
  """The semantic memory an ideal memorizer draws from utterance `u` by `c` (None for small talk), with a
  <face:NAME> placeholder."""
  f, who = c.facts, f"<face:{u.speaker}>"
  if u.kind == "rule":
    return u.text
  return {"intro": f"{who}'s name is {u.speaker}.",
          "drink": f"{who} likes to drink {f['drink']}.",
          "food": f"{who}'s favourite food is {f['food']}.",
          "plan": f"{who} plans to go to the {f['plan']} tomorrow.",
          "city": f"{who} lives in {f['city']}.",
          "job": f"{who} works as {article(f['job'])}.",
          "dislike": f"{who} does not like to drink {f['dislike']}.",
          "object": f"{who} put the {f['object']} on the {f['furniture']}.",
          "move": f"{who} moved the {f['object']} from the {f['furniture']} to the {f['moved_to']}."}.get(u.kind)


def fact_values(u: Utterance, c: Character) -> tuple[str, ...]:
  """The words of `utterance_fact(u, c)` that only the utterance tells (the name, the drink, ...): a writer that
  did not hear them (a misheard transcript) cannot know the fact."""
  f = c.facts
  return {"intro": (u.speaker,), "drink": (f["drink"],), "food": (f["food"],), "plan": (f["plan"],),
          "city": (f["city"],), "job": (f["job"],), "dislike": (f["dislike"],),
          "object": (f["object"], f["furniture"]), "move": (f["object"], f["furniture"], f["moved_to"]),
          "rule": next(((i, p) for i, p in RULE_ITEMS if f"the {i} goes" in u.text), ())}.get(u.kind, ())


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
      fact = utterance_fact(u, by_name[u.speaker])
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
