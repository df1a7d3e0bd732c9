"""Turning one generated turn into an action, and a search query into a route.

The reference (§4.4) applies `Action: \\[(.*)\\].*Content: (.*)` (greedy, DOTALL) to the text after the last
`</think>` and compares the action with "Answer" case-sensitively, so `action: [answer]`, a trailing
`<|im_end|>` or extra lines after a query all change the outcome. Here the action is read case-insensitively,
the content is stripped (a search query keeps only its first line: the protocol asks for "a single search
query", and trailing chatter would only dilute its embedding), an answer keeps only its first paragraph (text up
to the first blank line: the DAPO-trained controller, rewarded by the `contains` judge, learned to append further
candidates after blank lines, e.g. "Sophie. …\n\nSame as before.\n\nThe memory does not say.", which the judge
accepts when any candidate holds the truth; `parse_turn_reference` keeps the whole text) and ends before the first
decoding loop (a greedy 135M policy can loop "Market. Market. …" to the token limit, see `_without_repeats`), and
a turn whose thinking never closed (the token cap hit inside `<think>`) is a format error rather than an action
parsed out of the model's scratch text. A format error is then treated exactly like the reference's failed match:
an empty search.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

Action = Literal["answer", "search", "format_error"]

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
# `Action:` then a bracketed word; `Content:` then everything up to the end (trimmed below). Tolerates `**Action**:`
# style emphasis and whitespace variations, not a different order.
_ACTION_RE = re.compile(r"action\W{0,4}:[\s*_]*\[\s*(answer|search)\s*\]", re.IGNORECASE)
_CONTENT_RE = re.compile(r"content\W{0,4}:[ \t*_]*", re.IGNORECASE)
_BLANK_LINE_RE = re.compile(r"\n[ \t]*\n")
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])[ \t]+")
_FIELD_LINE_RE = re.compile(r"\n\W{0,4}(?:action|content)\W{0,4}:", re.IGNORECASE)
_SPECIAL_TAIL_RE = re.compile(r"(<\|im_end\|>|<\|endoftext\|>|</s>)\s*$")


@dataclasses.dataclass(frozen=True)
class ParsedTurn:
  """One turn's decision. `content` is the answer or the query (None for a format error)."""
  action: Action
  content: str | None


def visible_text(turn_text: str) -> str | None:
  """The text after the last `</think>`; None when a `<think>` block was opened and never closed."""
  if _THINK_CLOSE in turn_text:
    return turn_text.rsplit(_THINK_CLOSE, 1)[1]
  if _THINK_OPEN in turn_text:
    return None
  return turn_text


def parse_turn(turn_text: str) -> ParsedTurn:
  """Parses `Action: [Answer|Search]` / `Content: ...`; anything unusable is a format error.

  The last `Action:` line wins (models sometimes restate the format before acting); the content is the text
  after the first `Content:` that follows it, stripped, with a trailing end-of-turn token removed (first line only
  for a search, first paragraph for an answer). An empty
  content is a format error for both actions: the reference would search for nothing / answer nothing.
  """
  text = visible_text(turn_text)
  if text is None:
    return ParsedTurn("format_error", None)
  actions = list(_ACTION_RE.finditer(text))
  if not actions:
    return ParsedTurn("format_error", None)
  last = actions[-1]
  content_match = _CONTENT_RE.search(text, last.end())
  if content_match is None:
    return ParsedTurn("format_error", None)
  content = _SPECIAL_TAIL_RE.sub("", text[content_match.end():]).strip()
  action: Action = "answer" if last.group(1).lower() == "answer" else "search"
  if action == "search":
    content = content.split("\n", 1)[0].strip()
  else:
    content = _without_repeats(_BLANK_LINE_RE.split(content, 1)[0].strip())
  if not content:
    return ParsedTurn("format_error", None)
  return ParsedTurn(action, content)


def _without_repeats(answer: str) -> str:
  """`answer` up to a decoding loop: a line restarting the protocol (`Content: …` again), or a sentence that
  repeats the one before it ("Market. Market. …") or any earlier one of two words or more ("On the sofa. On the
  table. On the sofa. …"); a one-word repeat further back ("Dr. Smith. Dr. Jones.") is not a loop."""
  answer = _FIELD_LINE_RE.split(answer, 1)[0].strip()
  sentences = _SENTENCE_END_RE.split(answer)
  seen: set[str] = set()
  for k, sentence in enumerate(sentences):
    key = " ".join(sentence.lower().split())
    if k and (key == " ".join(sentences[k - 1].lower().split()) or (len(key.split()) > 1 and key in seen)):
      return " ".join(sentences[:k])
    seen.add(key)
  return answer


def parse_turn_reference(turn_text: str) -> ParsedTurn:
  """The reference's exact parse (§4.4), kept to measure how often the robust parse disagrees with it."""
  match = re.search(r"Action: \[(.*)\].*Content: (.*)", turn_text.split(_THINK_CLOSE)[-1], re.DOTALL)
  if match is None:
    return ParsedTurn("format_error", None)
  if match.group(1) == "Answer":
    return ParsedTurn("answer", match.group(2))
  return ParsedTurn("search", match.group(2))


Route = Literal["clip", "node"]


def route_for(query: str) -> Route:
  """`search_node` when the query contains the substring "character id" (case-sensitive, as trained), else clip."""
  return "node" if "character id" in query else "clip"


_LETTER_RE = re.compile(r"^\W*\(?([A-Za-z])\)?(?:[\s.:,)\]]|$)")


def choice_letter(answer: str) -> str | None:
  """The option letter of a multiple-choice answer: "B", "(b)", "B. the red one" -> "B"; None if no letter leads."""
  match = _LETTER_RE.match(answer.strip())
  return match.group(1).upper() if match else None
