"""Answer judges behind one batched interface: a local LLM, an OpenAI-compatible server, and rules.

The LLM judges ask the reference question (§4.6): can the ground truth be logically inferred from the agent's
answer? Unlike the reference's `"yes" in reply.lower()` (which counts "not yes", "eyes" or "No, yes-men..." as
correct), the reply must start with the word Yes or No; anything else is an invalid verdict, scored incorrect
and counted separately so a weak judge model shows up in the summary. An empty answer is incorrect without a
call, as in the reference.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import re
import string
import time
import urllib.error
import urllib.request
from collections import Counter
from typing import Callable, Literal, Protocol, Sequence

from m3jax.control.parsing import choice_letter
from m3jax.control.prompts import Message, judge_messages
from m3jax.data.questions import NOT_IN_MEMORY


@dataclasses.dataclass(frozen=True)
class JudgeItem:
  question: str
  ground_truth: str
  answer: str | None  # None / "" = the agent never answered
  # the other values of the answer's slot in the question's episode (other drinks, places, people; "No" when the
  # truth is "Yes."): the strict judge refuses an answer naming any of them. Empty: not known
  distractors: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class Verdict:
  correct: bool
  valid: bool = True  # False when an LLM judge's reply was neither Yes nor No (scored incorrect)
  raw: str = ""


class Judge(Protocol):
  def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
    ...


class JudgeError(ValueError):
  """A judge could not produce verdicts (bad configuration, server unreachable after all retries)."""


_YES_NO_RE = re.compile(r"^[\s\"'*`(\[]*(yes|no)(?![a-z])", re.IGNORECASE)


def parse_yes_no(reply: str) -> bool | None:
  """True for a reply starting with the word "Yes", False for "No", None otherwise (strict, not a substring)."""
  match = _YES_NO_RE.match(reply)
  if match is None:
    return None
  return match.group(1).lower() == "yes"


def _llm_verdicts(items: Sequence[JudgeItem], complete: Callable[[list[list[Message]]], list[str]]) -> list[Verdict]:
  """Shared by the LLM judges: skip empty answers, ask the rest in one batch, parse strictly."""
  asked = [i for i, item in enumerate(items) if item.answer and item.answer.strip()]
  replies = complete([judge_messages(items[i].question, items[i].ground_truth, items[i].answer) for i in asked])
  if len(replies) != len(asked):
    raise JudgeError(f"judge backend returned {len(replies)} replies for {len(asked)} prompts")
  verdicts = [Verdict(correct=False, valid=True, raw="") for _ in items]
  for i, reply in zip(asked, replies):
    decision = parse_yes_no(reply)
    verdicts[i] = Verdict(correct=bool(decision), valid=decision is not None, raw=reply)
  return verdicts


class LocalLLMJudge:
  """The entailment judge on a local chat model. `complete` maps a batch of conversations to reply texts (for
  example `m3jax.control.policy.ChatCompleter` over the m3jax Sampler, greedy with a few new tokens)."""

  def __init__(self, complete: Callable[[list[list[Message]]], list[str]]):
    self.complete = complete

  def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
    return _llm_verdicts(items, self.complete)


@dataclasses.dataclass(frozen=True)
class HTTPJudgeConfig:
  """An OpenAI-compatible `/chat/completions` endpoint. Empty fields fall back to the environment:
  M3JAX_JUDGE_BASE_URL / OPENAI_BASE_URL, M3JAX_JUDGE_API_KEY / OPENAI_API_KEY, M3JAX_JUDGE_MODEL."""
  base_url: str = ""
  api_key: str = ""
  model: str = ""
  max_tokens: int = 16
  timeout_s: float = 60.0
  max_retries: int = 5
  backoff_s: float = 1.0
  max_backoff_s: float = 30.0
  concurrency: int = 8

  def resolved(self) -> "HTTPJudgeConfig":
    env = os.environ
    cfg = dataclasses.replace(
      self,
      base_url=self.base_url or env.get("M3JAX_JUDGE_BASE_URL") or env.get("OPENAI_BASE_URL", ""),
      api_key=self.api_key or env.get("M3JAX_JUDGE_API_KEY") or env.get("OPENAI_API_KEY", ""),
      model=self.model or env.get("M3JAX_JUDGE_MODEL", ""))
    if not cfg.base_url:
      raise JudgeError("HTTP judge needs a base URL (config base_url or M3JAX_JUDGE_BASE_URL)")
    if not cfg.model:
      raise JudgeError("HTTP judge needs a model name (config model or M3JAX_JUDGE_MODEL)")
    if cfg.concurrency < 1 or cfg.max_retries < 0:
      raise JudgeError(f"HTTP judge: concurrency must be >= 1 and max_retries >= 0, got {cfg.concurrency}, "
                       f"{cfg.max_retries}")
    return cfg


class HTTPJudge:
  """Calls a judge server with bounded concurrency; retries transport errors, 429 and 5xx with exponential
  backoff (other 4xx are configuration errors and fail at once)."""

  def __init__(self, config: HTTPJudgeConfig = HTTPJudgeConfig(), sleep: Callable[[float], None] = time.sleep):
    self.config = config.resolved()
    self._sleep = sleep

  def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
    return _llm_verdicts(items, self._complete_all)

  def _complete_all(self, conversations: list[list[Message]]) -> list[str]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=self.config.concurrency) as pool:
      return list(pool.map(self._complete_one, conversations))

  def _complete_one(self, messages: list[Message]) -> str:
    cfg = self.config
    body = json.dumps({"model": cfg.model, "messages": messages, "temperature": 0,
                       "max_tokens": cfg.max_tokens}).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if cfg.api_key:
      headers["Authorization"] = f"Bearer {cfg.api_key}"
    url = cfg.base_url.rstrip("/") + "/chat/completions"
    last_error = ""
    for attempt in range(cfg.max_retries + 1):
      if attempt:
        self._sleep(min(cfg.max_backoff_s, cfg.backoff_s * 2 ** (attempt - 1)))
      try:
        request = urllib.request.Request(url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=cfg.timeout_s) as response:
          payload = json.loads(response.read().decode("utf-8"))
        return payload["choices"][0]["message"]["content"] or ""
      except urllib.error.HTTPError as err:
        last_error = f"HTTP {err.code}"
        if err.code != 429 and err.code < 500:
          raise JudgeError(f"judge server {url} rejected the request: HTTP {err.code}") from err
      except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
        last_error = f"{type(err).__name__}: {err}"
      except (KeyError, IndexError, json.JSONDecodeError) as err:
        last_error = f"malformed reply: {err!r}"
    raise JudgeError(f"judge server {url} failed after {cfg.max_retries + 1} attempts ({last_error})")


# ---------------------------------------------------------------------------------------------- rule judges

_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans({c: " " for c in string.punctuation})


def normalize_answer(text: str) -> str:
  """Lower-case, punctuation and English articles removed, whitespace collapsed (SQuAD-style)."""
  return " ".join(_ARTICLES_RE.sub(" ", text.lower().translate(_PUNCT)).split())


def token_f1(prediction: str, ground_truth: str) -> float:
  pred, gold = normalize_answer(prediction).split(), normalize_answer(ground_truth).split()
  common = sum((Counter(pred) & Counter(gold)).values())
  if not pred or not gold or common == 0:
    return float(pred == gold)
  precision, recall = common / len(pred), common / len(gold)
  return 2 * precision * recall / (precision + recall)


RuleKind = Literal["exact", "contains", "strict", "f1", "choice"]
RULE_KINDS = ("exact", "contains", "strict", "f1", "choice")
_SENTENCE_END = re.compile(r"(?<=[.!?;])\s+|\n+")


def first_sentence(answer: str) -> str:
  """The answer up to its first sentence end (. ! ? ; followed by a space, or a line break)."""
  return next((part for part in _SENTENCE_END.split(answer.strip()) if part.strip()), "")


def strict_correct(answer: str, truth: str, distractors: Sequence[str] = ()) -> bool:
  """The strict judge. WHY: `contains` pays for lists ("On the window sill. On the sofa. On the kitchen table."
  for "On the kitchen table.") and for hedges ("Yes or no"), which a policy rewarded by it learns. Right when:
  - answerable: the first sentence contains the whole (normalised) truth, and the answer names no distractor and
    does not decline anywhere (a right answer after a wrong one, a candidate beside a decline are wrong);
  - yes/no truth: the answer starts with the right word and never says the other one;
  - unanswerable (truth NOT_IN_MEMORY): the first sentence declines and the answer names no distractor."""
  if not answer.strip():
    return False
  text = f" {normalize_answer(answer)} "
  if any(f" {d} " in text for d in map(normalize_answer, distractors) if d):
    return False
  if truth == NOT_IN_MEMORY:
    return _says_not_in_memory(first_sentence(answer))
  if _says_not_in_memory(answer):
    return False
  gold = normalize_answer(truth)
  if gold in ("yes", "no"):
    other = "no" if gold == "yes" else "yes"
    return parse_yes_no(answer) == (gold == "yes") and f" {other} " not in text
  return bool(gold) and f" {gold} " in f" {normalize_answer(first_sentence(answer))} "


class RuleJudge:
  """Deterministic judges: normalised exact match, containment of the ground truth in the answer, the strict
  judge (`strict_correct`: the truth in the first sentence, no other candidate, no hedge), token F1 at or above a
  threshold, or the multiple-choice letter."""

  def __init__(self, kind: RuleKind = "exact", f1_threshold: float = 0.5):
    if kind not in RULE_KINDS:
      raise ValueError(f"unknown rule judge {kind!r} ({', '.join(RULE_KINDS)})")
    if not 0.0 <= f1_threshold <= 1.0:
      raise ValueError(f"f1_threshold must be in [0, 1], got {f1_threshold}")
    self.kind = kind
    self.f1_threshold = f1_threshold

  def judge(self, items: Sequence[JudgeItem]) -> list[Verdict]:
    return [Verdict(correct=self._one(item.answer or "", item.ground_truth, item.distractors)) for item in items]

  def _one(self, answer: str, truth: str, distractors: Sequence[str] = ()) -> bool:
    if not answer.strip():
      return False
    if self.kind == "strict":
      return strict_correct(answer, truth, distractors)
    if self.kind != "choice" and truth != NOT_IN_MEMORY and _says_not_in_memory(answer):
      # a decline is never right on an answerable question, even beside a candidate: a policy trained on this
      # judge learned "Cheese. The memory does not say." to be paid on both kinds of question
      return False
    if self.kind == "exact":
      return normalize_answer(answer) == normalize_answer(truth)
    if self.kind == "contains":
      gold = normalize_answer(truth)
      return bool(gold) and f" {gold} " in f" {normalize_answer(answer)} "
    if self.kind == "f1":
      return token_f1(answer, truth) >= self.f1_threshold
    letter, gold_letter = choice_letter(answer), choice_letter(truth)
    return letter is not None and letter == gold_letter


JUDGES = ("llm", "http") + RULE_KINDS


def _says_not_in_memory(answer: str) -> bool:
  return f" {normalize_answer(NOT_IN_MEMORY)} " in f" {normalize_answer(answer)} "


def is_decline(answer: str | None) -> bool:
  """Whether an answer declines: it says `NOT_IN_MEMORY` (normalised, as the `contains` judge reads it)."""
  return bool(answer) and _says_not_in_memory(answer)


def make_judge(kind: str, judge_model: str = "smollm2-135m-instruct", http: HTTPJudgeConfig = HTTPJudgeConfig(),
               max_new_tokens: int = 8) -> Judge:
  """A judge by name (`JUDGES`): a rule, an OpenAI-compatible server, or a local LLM (`judge_model`: the shipped
  default, a .gguf or an HF directory) answering greedily in a few tokens. Used by evaluation and by RL rewards;
  for RL the local judge is its own frozen model, never the policy being trained."""
  if kind == "http":
    return HTTPJudge(http)
  if kind != "llm":
    if kind not in JUDGES:
      raise ValueError(f"unknown judge {kind!r} (known: {', '.join(JUDGES)})")
    return RuleJudge(kind)
  from m3jax.control.policy import ChatCompleter
  from m3jax.models.llm import load_llm
  from m3jax.engine.sampling import Sampler, SamplingConfig

  model, tok = load_llm(judge_model)
  encoded = (tok.encode(t, add_special_tokens=False) for t in ("<|im_end|>", "<|endoftext|>"))
  stops = tuple(dict.fromkeys(ids[0] for ids in encoded if len(ids) == 1))
  sampling = SamplingConfig(max_new_tokens=max_new_tokens, greedy=True, stop_token_ids=stops)
  return LocalLLMJudge(ChatCompleter(Sampler(model, sampling, tok), tok, sampling))


def score_answers(judge: Judge, records: Sequence, answers: Sequence[str]) -> dict:
  """Accuracy of `answers` to `records` (each with .question, .answer, .types, .unanswerable) under `judge`,
  per question type, and the declines: an answer the same judge accepts against NOT_IN_MEMORY is a decline,
  correct on an unanswerable question and false on an answerable one. `correct` keeps the per-question verdicts."""
  correct = [v.correct for v in judge.judge([JudgeItem(r.question, r.answer, a, tuple(getattr(r, "distractors", ())))
                                              for r, a in zip(records, answers)])]
  declined = [v.correct for v in judge.judge([JudgeItem(r.question, NOT_IN_MEMORY, a)
                                              for r, a in zip(records, answers)])]
  hits, totals = Counter(), Counter()
  for r, ok in zip(records, correct):
    for t in r.types:
      totals[t] += 1
      hits[t] += ok
  unans = [d for r, d in zip(records, declined) if r.unanswerable]
  answerable = [d for r, d in zip(records, declined) if not r.unanswerable]
  return {"accuracy": sum(correct) / len(records), "correct": [bool(c) for c in correct],
          "per_type": {t: (hits[t], totals[t]) for t in totals},
          "correct_declines": (sum(unans), len(unans)), "false_declines": (sum(answerable), len(answerable))}
