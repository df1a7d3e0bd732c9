"""Constrained decoding: a byte-level automaton compiled into per-state token masks the sampler applies on device.

WHY: a small instruction model (the embedded SmolLM2-135M) almost never writes the memory writer's JSON contract
unaided, so every clip fell back to template memories. Masking the logits to the tokens that keep the output a
valid prefix of the contract makes every reply parse, whatever the model's size, and costs one gather per step.

A `ByteDFA` is a deterministic automaton over UTF-8 bytes (state 0 is the dead state). `compile_constraint`
runs it over every token's bytes from every state at once (numpy, vectorised over states x tokens) and gives a
`TokenConstraint`: `allowed[S, V]`, `next_state[S, V]` and `final[S]` as device arrays. The sampler masks
`logits[b]` with `allowed[state[b]]`, advances `state[b] = next_state[state[b], token[b]]` and ends a row once its
state is final (or it samples a stop token, allowed where the automaton accepts) — no host round trip, no Python
loop over tokens or vocabulary.

`json_string_lists(keys)` is the automaton of `{"k1": ["...", ...], "k2": [...]}` with the keys in order
(whitespace between tokens, JSON string escapes) — the memory writer's contract; `prefixed_line(prefixes)` is a
line after one of a few literal prefixes — the control protocol's action format.
"""

from __future__ import annotations

import collections
import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Bool, Int

from m3jax.models.tokenizer import bytes_to_unicode

_WS = b" \t\n\r"
_HEX = b"0123456789abcdefABCDEF"
DEAD = 0


class ByteDFA:
  """A deterministic automaton over bytes: `table[state, byte] -> state` (0 = dead), `accepting[state]`."""

  def __init__(self, table: np.ndarray, accepting: np.ndarray, start: int):
    if table.ndim != 2 or table.shape[1] != 256 or accepting.shape != (table.shape[0],):
      raise ValueError(f"bad automaton shapes: table {table.shape}, accepting {accepting.shape}")
    self.table, self.accepting, self.start = table.astype(np.int32), accepting.astype(bool), int(start)

  @property
  def num_states(self) -> int:
    return self.table.shape[0]

  def run(self, data: bytes, state: int | None = None) -> int:
    s = self.start if state is None else state
    for b in data:
      s = int(self.table[s, b])
    return s

  def closing(self, prefix: bytes) -> bytes | None:
    """The shortest bytes that turn `prefix` into an accepted text (b"" if it already is), or None when `prefix`
    is not a valid prefix. Used to repair a reply cut off by the token budget."""
    s = self.run(prefix)
    if s == DEAD:
      return None
    back: dict[int, tuple[int, int] | None] = {s: None}
    queue = collections.deque([s])
    while queue:  # breadth-first over states: tens of states, 256 edges each
      u = queue.popleft()
      if self.accepting[u]:
        out = bytearray()
        while back[u] is not None:
          u, b = back[u]
          out.append(b)
        return bytes(reversed(out))
      for b in _closing_order():
        v = int(self.table[u, b])
        if v != DEAD and v not in back:
          back[v] = (u, b)
          queue.append(v)
    return None


@functools.cache
def _closing_order() -> tuple[int, ...]:
  """Bytes tried by `closing`, structural ones first, so a repair closes strings and lists rather than adding text."""
  first = list(b'"]},:[{') + list(_HEX)
  return tuple(first + [b for b in range(256) if b not in first])


class _Builder:
  """Builds the automaton. A place where JSON allows whitespace is a *gap*: a chain of `max_ws + 1` states (each
  whitespace byte moves one state on), and every edge out of a gap leaves from all of them — so whitespace is
  bounded (a model cannot spend its budget on blank lines) at the cost of `max_ws` states per gap."""

  def __init__(self, max_ws: int):
    self.rows = [np.zeros(256, np.int32)]  # state 0: dead (every byte stays dead)
    self.accepting = [False]
    self.max_ws = max_ws

  def state(self) -> list[int]:
    self.rows.append(np.zeros(256, np.int32))
    self.accepting.append(False)
    return [len(self.rows) - 1]

  def gap(self) -> list[int]:
    chain = [self.state()[0] for _ in range(self.max_ws + 1)]
    for a, b in zip(chain, chain[1:]):
      self.rows[a][list(_WS)] = b
    return chain

  def edge(self, src: list[int], data: bytes | Sequence[int], dst: list[int]) -> None:
    for s in src:
      self.rows[s][list(data)] = dst[0]

  def literal(self, src: list[int], text: bytes) -> list[int]:
    for b in text:
      nxt = self.state()
      self.edge(src, [b], nxt)
      src = nxt
    return src

  def string_list(self, opened: list[int]) -> list[int]:
    """From just after '[': zero or more JSON strings separated by commas, then ']'; returns the gap after it."""
    in_str, after, before, closed = self.state(), self.gap(), self.gap(), self.gap()
    plain = [b for b in range(0x20, 256) if b not in (0x22, 0x5C)]  # JSON forbids raw control characters
    self.edge(opened, b'"', in_str)
    self.edge(opened, b"]", closed)
    self.edge(in_str, plain, in_str)
    self.edge(in_str, b'"', after)
    esc = self.state()
    self.edge(in_str, b"\\", esc)
    self.edge(esc, b'"\\/bfnrt', in_str)
    hex_state = self.state()
    self.edge(esc, b"u", hex_state)
    for _ in range(3):
      nxt = self.state()
      self.edge(hex_state, _HEX, nxt)
      hex_state = nxt
    self.edge(hex_state, _HEX, in_str)
    self.edge(after, b",", before)
    self.edge(after, b"]", closed)
    self.edge(before, b'"', in_str)
    return closed

  def build(self, start: list[int]) -> ByteDFA:
    return ByteDFA(np.stack(self.rows), np.asarray(self.accepting), start[0])


@functools.cache
def json_string_lists(keys: tuple[str, ...], max_ws: int = 12) -> ByteDFA:
  """The automaton of a JSON object whose keys are exactly `keys`, in order, each holding a list of strings, with
  at most `max_ws` whitespace bytes between two JSON tokens (enough for pretty-printing)."""
  if not keys:
    raise ValueError("json_string_lists needs at least one key")
  g = _Builder(max_ws)
  start = state = g.gap()
  for i, key in enumerate(keys):
    punct = g.gap()
    g.edge(state, b"{" if i == 0 else b",", punct)
    after_key = g.gap()
    g.edge(g.literal(punct, b'"' + key.encode()), b'"', after_key)
    colon, opened = g.gap(), g.gap()
    g.edge(after_key, b":", colon)
    g.edge(colon, b"[", opened)
    state = g.string_list(opened)
  end = g.state()
  g.edge(state, b"}", end)
  g.accepting[end[0]] = True
  return g.build(start)


@functools.cache
def prefixed_line(prefixes: tuple[str, ...]) -> ByteDFA:
  """The automaton of one of `prefixes` followed by a non-empty line: the first byte after the prefix is not
  whitespace, no control bytes but tab, and a newline ends the text (so does a stop token, once a byte was
  written). The control protocol's `Action: [Search]\\nContent: query` is such a text."""
  if not prefixes:
    raise ValueError("prefixed_line needs at least one prefix")
  g = _Builder(max_ws=0)
  start = g.state()
  trie: dict[bytes, list[int]] = {b"": start}
  line, end = g.state(), g.state()
  for p in prefixes:
    data = p.encode()
    for i in range(1, len(data) + 1):
      if data[:i] not in trie:
        trie[data[:i]] = g.state()
        g.edge(trie[data[:i - 1]], data[i - 1:i], trie[data[:i]])
    g.edge(trie[data], [b for b in range(0x21, 256)], line)
  g.edge(line, [9] + list(range(0x20, 256)), line)
  g.edge(line, b"\n", end)
  g.accepting[line[0]] = g.accepting[end[0]] = True
  return g.build(start)


class TokenConstraint(NamedTuple):
  """Device tables of a `ByteDFA` over a vocabulary (a pytree: passes through `jax.jit` as arguments).
  `final[s]`: nothing can follow state s, so a row that reaches it is done; a stop token is allowed in the
  automaton's accepting states."""
  allowed: Bool[jax.Array, "S V"]
  next_state: Int[jax.Array, "S V"]  # int16 when the automaton has < 32768 states
  final: Bool[jax.Array, "S"]
  start: Int[jax.Array, ""]


def merge_constraints(constraints: Sequence[TokenConstraint]) -> tuple[TokenConstraint, list[int]]:
  """One table holding several automata side by side (state ids offset), and each one's start state in it: rows
  of one decode call can then run under different automata (`Sampler.continue_(constraint_starts=...)`)."""
  if not constraints:
    raise ValueError("merge_constraints needs at least one constraint")
  offsets = np.cumsum([0] + [int(c.allowed.shape[0]) for c in constraints])
  small = np.int16 if offsets[-1] <= np.iinfo(np.int16).max else np.int32
  nxt = [np.asarray(c.next_state).astype(np.int64) + o for c, o in zip(constraints, offsets)]
  merged = TokenConstraint(jnp.concatenate([c.allowed for c in constraints]),
                           jnp.asarray(np.concatenate(nxt).astype(small)),
                           jnp.concatenate([c.final for c in constraints]), constraints[0].start)
  return merged, [int(c.start) + int(o) for c, o in zip(constraints, offsets)]


def token_bytes(tokenizer) -> list[bytes | None]:
  """Each token id's bytes (None for special/added tokens, which never appear inside constrained text).
  Byte-level BPE (GPT-2, SmolLM2, Qwen) maps its alphabet back to bytes; SentencePiece pieces map '▁' to a space
  and `<0xNN>` to the byte."""
  pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
  special = set(tokenizer.all_special_ids) | set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
  decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
  byte_level = "ByteLevel" in repr(decoder)
  inverse = {c: b for b, c in bytes_to_unicode().items()}
  out: list[bytes | None] = []
  for i, piece in enumerate(pieces):
    if i in special or piece is None:
      out.append(None)
    elif byte_level:
      out.append(bytes(inverse[c] for c in piece) if all(c in inverse for c in piece) else None)
    elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
      out.append(bytes([int(piece[3:5], 16)]))
    else:
      out.append(piece.replace("▁", " ").encode())
  return out


def compile_constraint(dfa: ByteDFA, tokens: Sequence[bytes | None], vocab_size: int,
                       stop_token_ids: Sequence[int] = ()) -> TokenConstraint:
  """Token tables for `dfa` over a vocabulary of `vocab_size` (ids past `tokens` — padding rows of the embedding —
  and empty or special tokens are never allowed; `stop_token_ids` are allowed in accepting states)."""
  if len(tokens) > vocab_size:
    raise ValueError(f"{len(tokens)} tokens do not fit a vocabulary of {vocab_size}")
  S = dfa.num_states
  lens = np.zeros(vocab_size, np.int64)
  for i, t in enumerate(tokens):
    lens[i] = len(t) if t else 0
  width = max(int(lens.max()), 1)
  data = np.zeros((vocab_size, width), np.uint8)
  for i, t in enumerate(tokens):
    if t:
      data[i, :len(t)] = np.frombuffer(t, np.uint8)
  order = np.argsort(-lens, kind="stable")     # longest first: step j touches only tokens longer than j
  states = np.broadcast_to(np.arange(S, dtype=np.int32)[:, None], (S, vocab_size)).copy()
  sorted_data, sorted_states = data[order], states[:, order]
  for j in range(width):
    n = int((lens > j).sum())
    sorted_states[:, :n] = dfa.table[sorted_states[:, :n], sorted_data[:n, j][None, :]]
  states[:, order] = sorted_states
  allowed = (states != DEAD) & (lens > 0)[None, :]
  allowed[DEAD] = False
  for t in stop_token_ids:
    if not 0 <= t < vocab_size:
      raise ValueError(f"stop token id {t} is outside the vocabulary of {vocab_size}")
    allowed[:, t] = dfa.accepting
    states[:, t] = np.arange(S)
  small = np.int16 if S <= np.iinfo(np.int16).max else np.int32  # the tables are [S, V]: keep them compact
  final = dfa.accepting & (dfa.table == DEAD).all(axis=1)
  return TokenConstraint(jnp.asarray(allowed), jnp.asarray(states.astype(small)), jnp.asarray(final),
                         jnp.asarray(dfa.start, jnp.int32))
