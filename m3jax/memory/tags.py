"""Entity tags in memory text: `<face_N>`, `<voice_N>`, `<character_N>`.

Whole tags only. The reference replaces ids with `str.replace`, so `face_1` also rewrites the inside of
`face_12` (and the order of replacement depends on the hash seed); every function here matches complete
`<...>` tags with a regular expression, so ids never bleed into each other and results do not depend on
PYTHONHASHSEED.
"""

from __future__ import annotations

import itertools
import re
import zlib
from typing import Mapping, Sequence

import numpy as np

ENTITY_KINDS = ("face", "voice", "character")
_TAG_RE = re.compile(r"<([^<>]*)>")
_PERSON_TAG_RE = re.compile(r"<(face|voice)_(\d+)>")
_CHARACTER_TAG_RE = re.compile(r"<character_(\d+)>")
EQUIVALENCE_PREFIX = "equivalence"          # characters are built from statements with this prefix
HIDDEN_PREFIX = "equivalence: "             # search output hides sentences with this prefix (lower-cased)


def parse_entities(text: str) -> list[tuple[str, int]]:
  """`(kind, id)` for every well-formed tag, in text order (duplicates kept), as the reference parser accepts them.

  A tag must split on `_` into exactly two parts, a kind in {face, voice, character} and an integer id.
  """
  out: list[tuple[str, int]] = []
  for body in _TAG_RE.findall(text):
    parts = body.split("_")
    if len(parts) != 2:
      continue
    kind = parts[0].strip().lower()
    if kind not in ENTITY_KINDS:
      continue
    try:
      out.append((kind, int(parts[1])))
    except ValueError:
      continue
  return out


def is_equivalence(text: str) -> bool:
  return text.lower().startswith(EQUIVALENCE_PREFIX)


def is_hidden(text: str) -> bool:
  return text.lower().startswith(HIDDEN_PREFIX)


def translate(text: str, reverse: Mapping[str, str]) -> str:
  """Rewrites `<face_i>` / `<voice_j>` tags that belong to a character into `<character_k>` (whole tags only)."""
  def repl(m: re.Match) -> str:
    key = f"{m.group(1)}_{m.group(2)}"
    return f"<{reverse[key]}>" if key in reverse else m.group(0)
  return _PERSON_TAG_RE.sub(repl, text)


def back_translate(query: str, mappings: Mapping[str, Sequence[str]], max_variants: int = 100,
                   seed: int = 0) -> list[str]:
  """One query variant per combination of the member tags of each `<character_k>` the query names.

  Characters unknown to `mappings` stay as they are. Above `max_variants` combinations a subsample seeded by
  (seed, crc32(query)) keeps the count bounded (the reference uses unseeded `random.sample`).
  """
  names: list[str] = []
  for k in _CHARACTER_TAG_RE.findall(query):
    name = f"character_{k}"
    if name in mappings and mappings[name] and name not in names:
      names.append(name)
  if not names:
    return [query]
  combos = list(itertools.product(*[mappings[n] for n in names]))
  if len(combos) > max_variants:
    rng = np.random.default_rng([seed, zlib.crc32(query.encode("utf-8"))])
    combos = [combos[i] for i in sorted(rng.choice(len(combos), max_variants, replace=False))]
  out = []
  for combo in combos:
    sub = dict(zip(names, combo))
    out.append(_CHARACTER_TAG_RE.sub(lambda m: f"<{sub.get('character_' + m.group(1), 'character_' + m.group(1))}>",
                                     query))
  return out
