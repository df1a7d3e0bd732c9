"""The policy interface the controller drives: start a batch of conversations, then extend chosen ones.

WHY two calls instead of "generate from this conversation": the controller never re-sends history. `begin`
opens one episode per row; `step` appends a user message to the listed rows and generates their next turn. An
LLM policy can therefore keep each row's KV cache and append only the new tokens (`Sampler.continue_`), while a
rule-based test double just reads the messages. Each returned `Turn` says which tokens were fed to the model
(`context_ids`) and which it sampled (`gen_ids`, `logprobs`), so trajectories are assembled without re-tokenising.

A `SlotPolicy` (the LLM policy) also runs continuous batching: `open(slots)` then `advance(starts, continues)`,
where one call both starts new episodes in free slots and continues running ones, at whatever round each is.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Protocol, Sequence

import numpy as np
from jaxtyping import Float

from m3jax.control.prompts import ASSISTANT_PREFIX, END_OF_TURN, Message, render_chatml, render_chatml_message
from m3jax.engine.constrained import (DEAD, ByteDFA, TokenConstraint, compile_constraint, merge_constraints,
                                     prefixed_line, token_bytes)
from m3jax.engine.sampling import SampleOutput, Sampler, SamplingConfig


@dataclasses.dataclass
class Turn:
  """One generated turn. `context_ids` are the tokens appended to the row before sampling (the whole rendered
  prompt for the first turn; the previous turn's end, the user message and the assistant header afterwards)."""
  text: str
  context_ids: list[int] = dataclasses.field(default_factory=list)
  gen_ids: list[int] = dataclasses.field(default_factory=list)
  logprobs: Float[np.ndarray, "G"] = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))
  finish_reason: str = "stop"
  # each sampled token's distribution entropy, when the sampling config records it (empty otherwise)
  entropies: Float[np.ndarray, "G"] = dataclasses.field(default_factory=lambda: np.zeros((0,), np.float32))


class Policy(Protocol):
  """What the controller needs from a policy. Rows are indices into the `begin` batch."""

  def begin(self, conversations: Sequence[Sequence[Message]]) -> list[Turn]:
    """Starts one episode per conversation (each ends with a user message) and generates its first turn."""
    ...

  def step(self, rows: Sequence[int], user_messages: Sequence[str]) -> list[Turn]:
    """Appends `user_messages[i]` as a user turn to episode `rows[i]` and generates that episode's next turn."""
    ...


class SlotPolicy(Policy, Protocol):
  """A policy with a fixed number of slots whose episodes start and continue independently (continuous batching:
  `Controller.run(questions, slots=...)`)."""

  def open(self, slots: int) -> int:
    """Opens at least `slots` empty slots; returns how many there are."""
    ...

  def advance(self, starts: Sequence[tuple[int, int, Sequence[Message]]],
              continues: Sequence[tuple[int, str]]) -> list[Turn]:
    """One generation over the slots: each `(slot, episode id, conversation)` of `starts` opens a new episode in
    that slot (dropping what it held) and each `(slot, user message)` of `continues` appends a user message to
    its slot's episode; returns the next turn of every start, then of every continue."""
    ...


class ChatTokenizer(Protocol):
  """What the LLM policy needs from a tokenizer: ChatML special tokens are parsed, none are added."""

  def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
    ...

  def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
    ...


def continuation_text(previous_finish_reason: str, user_message: str) -> str:
  """The ChatML text appended to a row after its last turn: close that turn (unless its sampled stop token already
  did), the user message, and the next assistant header. Every piece starts after a special token, so encoding
  it separately gives the same ids as encoding the re-rendered conversation."""
  close = "" if previous_finish_reason == "stop" else END_OF_TURN
  return close + "\n" + render_chatml_message("user", user_message) + ASSISTANT_PREFIX


class PromptTooLongError(ValueError):
  """A question whose prompt does not fit the model's positions: refused before any cache is allocated."""


def prompt_token_limit(sampler: Sampler, config: SamplingConfig) -> int:
  """The longest first prompt a sampler takes with room left for a reply of `config.max_new_tokens`: the model's
  trained positions (`max_position_embeddings`) and the sampler's largest cache bucket bound it. WHY: an
  unchecked 100 KB question made the prefill allocate over 100 GB before anything failed."""
  positions = getattr(sampler.model.cfg, "max_position_embeddings", None) or config.length_buckets[-1]
  return min(positions, config.length_buckets[-1]) - config.max_new_tokens


def _require_chatml(tokenizer: ChatTokenizer) -> None:
  """The protocol is rendered as ChatML; a tokenizer without its special tokens would silently split them."""
  for token in ("<|im_start|>", END_OF_TURN):
    if len(tokenizer.encode(token, add_special_tokens=False)) != 1:
      raise ValueError(f"the LLM policy renders ChatML, but this tokenizer has no single {token} token "
                       "(use a ChatML model: SmolLM2, Qwen2/2.5/3)")


class LLMPolicy:
  """A policy over the m3jax `Sampler`. With `reuse_kv` each round appends only the new tokens to every row's KV
  cache (`Sampler.continue_`); without it every round re-prefills each active conversation from scratch (the
  reference's behaviour, kept as the baseline the benchmark compares against). Each round uses its own seed, so
  rounds do not replay the same random stream. With `row_ids` (one int per episode of `begin`) each episode
  samples from its own stream keyed by its id (`Sampler.generate`), so it draws the same tokens whichever other
  episodes share its batch: RL rollouts split over processes then equal the one-process run."""

  def __init__(self, sampler: Sampler, tokenizer: ChatTokenizer, config: SamplingConfig, reuse_kv: bool = True,
               actions: ActionConstraints | None = None, row_ids: Sequence[int] | None = None):
    _require_chatml(tokenizer)
    self.sampler, self.tokenizer, self.config, self.reuse_kv = sampler, tokenizer, config, reuse_kv
    self.actions = actions
    self.row_ids = None if row_ids is None else list(row_ids)
    self._state = None
    self._history: list[list[int]] = []
    self._finish: list[str] = []
    self._round = 0
    self._slot_round: list[int] | None = None  # per slot, while `open` (continuous batching) holds the state

  def _prompts(self, conversations: Sequence[Sequence[Message]]) -> list[list[int]]:
    prompts = [self.tokenizer.encode(render_chatml(c), add_special_tokens=False) for c in conversations]
    limit = prompt_token_limit(self.sampler, self.config)
    for n, p in enumerate(prompts):
      if len(p) > limit:
        where = f" (question {n + 1} of {len(prompts)})" if len(prompts) > 1 else ""
        raise PromptTooLongError(f"the question is too long{where}: its prompt is {len(p)} tokens and this model "
                                 f"takes at most {limit} (leaving {self.config.max_new_tokens} for the reply)")
    return prompts

  def begin(self, conversations: Sequence[Sequence[Message]]) -> list[Turn]:
    prompts = self._prompts(conversations)
    self._round, self._slot_round = 0, None
    self._history = [list(p) for p in prompts]
    self._finish = ["" for _ in prompts]
    if self.row_ids is not None and len(self.row_ids) != len(prompts):
      raise ValueError(f"{len(self.row_ids)} row ids for {len(prompts)} conversations")
    out = self.sampler.generate(prompts, self.config, seed=self.config.seed, constraint=self._constraint(),
                                row_ids=self.row_ids)
    self._state = out.state
    return self._turns(range(len(prompts)), prompts, out)

  def step(self, rows: Sequence[int], user_messages: Sequence[str]) -> list[Turn]:
    if self._state is None:
      raise ValueError("LLMPolicy.step() called before begin()")
    if len(rows) != len(user_messages):
      raise ValueError(f"{len(rows)} rows but {len(user_messages)} user messages")
    self._round += 1
    seed = self.config.seed + 7919 * self._round
    chunks = [self.tokenizer.encode(continuation_text(self._finish[r], m), add_special_tokens=False)
              for r, m in zip(rows, user_messages)]
    for r, chunk in zip(rows, chunks):
      self._history[r].extend(chunk)
    if self.reuse_kv:
      feed: list[list[int] | None] = [None] * len(self._history)
      for r, chunk in zip(rows, chunks):
        feed[r] = chunk
      out = self.sampler.continue_(self._state, feed, self.config, seed=seed, constraint=self._constraint(),
                                   row_ids=self.row_ids)
      self._state = out.state
    else:
      out = self.sampler.generate([self._history[r] for r in rows], self.config, seed=seed,
                                  constraint=self._constraint(),
                                  row_ids=None if self.row_ids is None else [self.row_ids[r] for r in rows])
    return self._turns(rows, chunks, out)

  def _constraint(self) -> TokenConstraint | None:
    return None if self.actions is None else self.actions.for_round(self._round)

  # ------------------------------------------------------------------------------ continuous batching
  def open(self, slots: int) -> int:
    """Continuous batching over `slots` rows of one KV cache, rounded up to the sampler's batch bucket (`SlotPolicy`;
    returns the slot count). Needs `reuse_kv`: a slot's episode lives in its cache rows."""
    if not self.reuse_kv:
      raise ValueError("continuous batching needs reuse_kv=True (each slot keeps its episode's KV cache)")
    if slots < 1:
      raise ValueError(f"slots must be >= 1, got {slots}")
    self._state = self.sampler.empty_state(slots, self.config)
    n = self._state.batch
    self._history, self._finish = [[] for _ in range(n)], ["" for _ in range(n)]
    self._slot_round, self._slot_episode = [0] * n, [0] * n
    return n

  def advance(self, starts: Sequence[tuple[int, int, Sequence[Message]]],
              continues: Sequence[tuple[int, str]]) -> list[Turn]:
    """See `SlotPolicy.advance`. Each row samples from its own stream keyed by its round's seed and its episode
    id (with `row_ids`, the episode's row id), so an episode draws the same tokens whichever episodes share its
    calls. Its turns equal the static loop's (`begin`/`step`) when greedy, and when sampled with `row_ids` (the
    same streams), up to float rounding across batch shapes."""
    if self._state is None or self._slot_round is None:
      raise ValueError("LLMPolicy.advance() called before open()")
    slots = [s for s, *_ in starts] + [s for s, _ in continues]
    if len(set(slots)) != len(slots) or any(not 0 <= s < self._state.batch for s in slots):
      raise ValueError(f"advance(): slots {slots} must be distinct and below {self._state.batch}")
    prompts = self._prompts([c for *_, c in starts])
    self.sampler.reset_rows(self._state, [s for s, *_ in starts])
    feed: list[list[int] | None] = [None] * self._state.batch
    for (slot, episode, _), prompt in zip(starts, prompts):
      self._history[slot], self._finish[slot] = list(prompt), ""
      self._slot_round[slot], self._slot_episode[slot] = 0, episode
      feed[slot] = prompt
    chunks = []
    for slot, message in continues:
      chunk = self.tokenizer.encode(continuation_text(self._finish[slot], message), add_special_tokens=False)
      self._history[slot].extend(chunk)
      self._slot_round[slot] += 1
      feed[slot] = chunk
      chunks.append(chunk)
    ids = [self._slot_episode[s] if self.row_ids is None else self.row_ids[self._slot_episode[s]]
           for s in range(self._state.batch)]
    seeds = [self.config.seed + 7919 * r for r in self._slot_round]  # `step`'s per-round seed
    constraint, first = None, None
    if self.actions is not None:
      constraint, starts = self.actions.merged
      first = [starts[self.actions.kind(r)] for r in self._slot_round]
    out = self.sampler.continue_(self._state, feed, self.config, constraint=constraint, row_ids=ids,
                                 constraint_starts=first, row_seeds=seeds)
    self._state = out.state
    order = np.argsort(np.argsort(slots))  # the sampler returns rows by slot; give them back in call order
    pick = lambda values: None if values is None else [values[i] for i in order]
    out = dataclasses.replace(out, tokens=pick(out.tokens), logprobs=pick(out.logprobs),
                              finish_reason=pick(out.finish_reason), entropies=pick(out.entropies))
    return self._turns(slots, prompts + chunks, out)

  def _turns(self, rows: Sequence[int], contexts: Sequence[list[int]], out: SampleOutput) -> list[Turn]:
    turns = []
    entropies = out.entropies or [np.zeros((0,), np.float32)] * len(out.tokens)
    for r, context, ids, logprobs, entropy, reason in zip(rows, contexts, out.tokens, out.logprobs, entropies,
                                                          out.finish_reason):
      self._history[r].extend(ids)
      self._finish[r] = reason
      turns.append(Turn(text=self.tokenizer.decode(ids, skip_special_tokens=False), context_ids=list(context),
                        gen_ids=list(ids), logprobs=np.asarray(logprobs, np.float32), finish_reason=reason,
                        entropies=np.asarray(entropy, np.float32)))
    return turns


@dataclasses.dataclass(frozen=True)
class ActionConstraints:
  """Constrained decoding of the control protocol, per round: `kinds[r]` says what round r may write (the last kind
  holds for every later round):
  * "any": exactly `Action: [Search|Answer]\nContent: <one line>`;
  * "answer": the same, answering only (the last round of a weak policy);
  * "search": the same, searching only (`min_searches`: the first rounds of a policy that answers too soon);
  * "free": any text (special tokens but the stop tokens masked).

  WHY: the embedded 135M controller mostly writes neither action (a format error every round, so it never
  searches nor answers); constrained, each turn is a valid action. And a trained controller that answers after one
  search loses to the rules answerer on episodes of 5+ clips (MODEL_CARD, dev): search-only first rounds make it
  look further before it answers. Log-probs are those of the masked distribution, so trajectories sampled this
  way are off-policy for an unmasked learner: for RL keep the policy unconstrained (the format-error penalty
  teaches the format), or accept the mismatch knowingly."""
  kinds: tuple[str, ...]
  tables: dict[str, TokenConstraint]

  KINDS = ("any", "answer", "search", "free")

  @classmethod
  def build(cls, tokenizer, vocab_size: int, stop_token_ids: Sequence[int], max_rounds: int | None,
            min_searches: int = 0) -> "ActionConstraints":
    """`max_rounds`: every round inside the action format, the last of `max_rounds` answer-only (None: rounds
    after the first `min_searches` run free). `min_searches`: that many search-only rounds first."""
    if max_rounds is not None and max_rounds < 1:
      raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    if min_searches < 0 or (max_rounds is not None and min_searches >= max_rounds):
      raise ValueError(f"min_searches={min_searches} must be in 0..{'max_rounds - 1' if max_rounds else 'any'}: "
                       "the last round has to be able to answer")
    if max_rounds is None:
      kinds = ("search",) * min_searches + ("free",)
    else:
      kinds = ("search",) * min_searches + ("any",) * (max_rounds - 1 - min_searches) + ("answer",)
    tokens = token_bytes(tokenizer)
    search, answer = "Action: [Search]\nContent: ", "Action: [Answer]\nContent: "
    dfas = {"any": lambda: prefixed_line((search, answer)), "answer": lambda: prefixed_line((answer,)),
            "search": lambda: prefixed_line((search,)), "free": _any_text}
    return cls(kinds, {k: compile_constraint(dfas[k](), tokens, vocab_size, stop_token_ids) for k in dict.fromkeys(kinds)})

  def kind(self, round_index: int) -> str:
    return self.kinds[min(round_index, len(self.kinds) - 1)]

  def for_round(self, round_index: int) -> TokenConstraint:
    return self.tables[self.kind(round_index)]

  @functools.cached_property
  def merged(self) -> tuple[TokenConstraint, dict[str, int]]:
    """Every kind's automaton in one table and each one's start state: rows at different rounds share a decode
    call under continuous batching."""
    kinds = sorted(self.tables, key=self.KINDS.index)
    table, starts = merge_constraints([self.tables[k] for k in kinds])
    return table, dict(zip(kinds, starts))


def _any_text() -> ByteDFA:
  """The automaton of any text (one accepting state that every byte keeps): a "free" round, the same whether its
  rows decode alone or beside constrained ones. Special tokens other than the stop tokens stay masked, as in every
  constraint; a turn never needs them."""
  return ByteDFA(np.array([[DEAD] * 256, [1] * 256]), np.array([False, True]), start=1)


class ChatCompleter:
  """Batch chat completion on the sampler (the local LLM judge's and text memory writer's backend): ChatML prompt
  in, reply text out; with `constraint` every reply is a prefix of the automaton's language (`constrained.py`)."""

  def __init__(self, sampler: Sampler, tokenizer: ChatTokenizer, config: SamplingConfig,
               constraint: TokenConstraint | None = None):
    _require_chatml(tokenizer)
    self.sampler, self.tokenizer, self.config, self.constraint = sampler, tokenizer, config, constraint

  def __call__(self, conversations: list[list[Message]]) -> list[str]:
    if not conversations:
      return []
    prompts = [self.tokenizer.encode(render_chatml(c), add_special_tokens=False) for c in conversations]
    out = self.sampler.generate(prompts, self.config, constraint=self.constraint)
    return [self.tokenizer.decode(ids, skip_special_tokens=True) for ids in out.tokens]
