"""The sampler: jitted prefill, the decode loop's host side, and multi-turn continuation on the same KV cache.

One sampler serves the controller, the LLM judge, the text memory writer, Whisper and RL rollouts. It drives any
model with the contract `model(tokens, cache, chunk_len) -> (logits, cache)` + `model.init_cache(batch, max_len)`
(see `decoder.py`); models that can return hidden states (`model.hidden` + `model.logits`) get a cheaper prefill
that projects only the last position of each row onto the vocabulary.

This module is the host-side bookkeeping: buckets, histories, slots, stop strings, finish reasons. The device
programs it launches live below it: `prefill.py` (prefill and forks) and `decode.py` (`SamplingConfig`, token
sampling and the jitted decode loop); neither imports this module.

Throughput design:
* prompt length, batch size and cache length are padded to buckets, so a workload compiles a bounded number of
  times (`Sampler.compilations` counts traces);
* decode is a `lax.while_loop` (`decode.py`) that stops when every row is done or the budget is spent; on CPU it
  reads the cache as per-layer arrays of the slots it can fill (`decoder.LayerKV`, `decode.window_slots`);
* stop strings need detokenisation, so they are checked on the host every `stop_check_interval` steps (the loop
  resumes on device from where it stopped); stop token ids are checked on device every step;
* identical prompts of one `generate` call (an RL group's samples) are prefilled once and their cache rows forked,
  and so are the rows of one `continue_` call whose whole conversations are the same (empty slots starting one
  prompt; a group's rows that made the same search and got the same result);
* `continue_` appends new tokens (a tool result, a user message) at each row's own cache offset and keeps decoding,
  without re-prefilling the conversation;
* `reset_rows` empties chosen rows of a live state, so a finished conversation's slot takes a new one while the
  other rows keep their caches (continuous batching, `m3jax.control.controller.Controller.run(slots=...)`);
* a call that feeds a few rows of a wide state decodes them in a batch of their own bucket (`_continue_subset`);
* a long prefill runs in pieces over the rows still fed (`_prefill_pieces`), so rows fed chunks of different
  lengths (tool results of 150-360 tokens, a new prompt beside short tool results) each compute about their own
  length instead of the longest row's width bucket.

Log-probs are the behaviour policy's, before top-k/top-p truncation (`decode.sample_token`).
"""
from __future__ import annotations

import bisect
import dataclasses
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from m3jax.engine.constrained import TokenConstraint
from m3jax.engine.decode import SamplingConfig, _decode, _decode_options, window_slots
from m3jax.engine.prefill import TRACES, copy_rows, fork, prefill, prefill_subset, put_rows, scatter_logits, tokens_of
from m3jax.engine.work import EngineWork, kv_bytes
from m3jax.models.decoder import Decoder, KVCache
from m3jax.parallel import named_sharding

FINISH_STOP, FINISH_LENGTH, FINISH_STOP_STRING = "stop", "length", "stop_string"
FINISH_CONSTRAINT = "constraint"  # the constraint's automaton reached a final state (nothing may follow)


@dataclasses.dataclass
class DecodeState:
  """What `continue_` needs: the device cache and, per row, the committed history not yet written to it."""

  cache: Any
  history: list[list[int]]  # prompt + kept generated tokens, per row
  batch: int  # bucketed batch size of the cache


@dataclasses.dataclass
class SampleOutput:
  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  finish_reason: list[str]
  state: DecodeState
  text: list[str] | None = None
  entropies: list[np.ndarray] | None = None  # per sampled token, with `SamplingConfig.entropy`


def _first_of_equal(feed: list[list[int]], history: list[list[int]], cache_len: np.ndarray) -> dict[int, int]:
  """{row: the first earlier row whose whole conversation is the same} over the rows fed something: the same
  cached length and the same history (which then ends in the same feed). WHY not only empty rows: an RL group's G
  rows that sampled the same search get the same tool result, so one prefill serves the group in later rounds too."""
  first: dict[tuple, int] = {}
  out = {}
  for b, f in enumerate(feed):
    key = (int(cache_len[b]), tuple(history[b]))
    if f and first.setdefault(key, b) != b:
      out[b] = first[key]
  return out


def _copy_pairs(source: dict[int, int], batch: int) -> tuple[jax.Array, jax.Array]:
  """(destination rows, source rows) padded to a power of two (at most `batch`) with a source row copied onto
  itself, so `copy_rows` compiles once per bucket of the number of copies."""
  n = min(batch, 1 << (len(source) - 1).bit_length())
  pad = next(iter(source.values()))
  dst = list(source) + [pad] * (n - len(source))
  src = list(source.values()) + [pad] * (n - len(source))
  return jnp.asarray(dst, jnp.int32), jnp.asarray(src, jnp.int32)


def _bucket(n: int, buckets: Sequence[int]) -> int:
  i = bisect.bisect_left(buckets, n)
  if i == len(buckets):
    raise ValueError(f"size {n} exceeds the largest bucket {buckets[-1]}")
  return buckets[i]


SPLIT_LAYERS_MAX_BYTES = 2 << 30


class Sampler:
  """Batched generation with a donated KV cache; see the module docstring."""

  def __init__(self, model: nnx.Module, config: SamplingConfig = SamplingConfig(), tokenizer=None,
               mesh: Mesh | None = None, cache_dtype=None, share_prefix: bool | None = None,
               split_layers: bool | None = None, decode_window: bool = True):
    self.graphdef, self.params = nnx.split(model)
    self.model, self.config, self.tokenizer, self.mesh = model, config, tokenizer, mesh
    self.cache_dtype = cache_dtype
    # identical prompts in one `generate` call are prefilled once and their cache rows forked (an RL group's G
    # samples share their whole first prompt). Only for models whose rows are independent given their tokens: a
    # plain `Decoder` by default (not Whisper, whose cache carries each row's audio, nor a model with per-row
    # state such as Omni's rope offsets)
    self.share_prefix = isinstance(model, Decoder) if share_prefix is None else share_prefix
    # a long prefill runs in pieces over the rows still fed (`_prefill_pieces`): a plain Decoder's rows are
    # independent, so a piece's cache rows can be taken out, prefilled and written back
    self.split_prefill = isinstance(model, Decoder)
    # the decode step reads a plain Decoder's layer weights as separate per-layer arrays (`Decoder.split_layers`,
    # one copy of the weights for this sampler's lifetime; build a new sampler after the weights change, as RL
    # does per rollout): XLA:CPU copies every weight each step when it slices them out of the stacked arrays
    # inside the layer scan. Default: on an unsharded CPU Decoder whose weights take at most SPLIT_LAYERS_MAX_BYTES
    # (the copy doubles them); accelerators slice inside the matmul
    if split_layers is None:
      split_layers = (isinstance(model, Decoder) and mesh is None and jax.default_backend() == "cpu"
                      and sum(x.nbytes for x in jax.tree.leaves(self.params)) <= SPLIT_LAYERS_MAX_BYTES)
    self.layers = model.split_layers() if split_layers else None
    # with split layers, the decode loop also reads the cache as per-layer arrays of the slots it can fill
    # (`decoder.LayerKV`, `decode.window_slots`); False keeps the block loop over the stacked cache (benchmarks)
    self.decode_window = decode_window and self.layers is not None
    self.compilations = 0  # programs traced by this sampler's calls (samplers of one model share programs)
    self.prefill_tokens = 0  # tokens run through a prefill, over this sampler's calls
    self.prefill_tokens_saved = 0  # prompt tokens not prefilled because an identical prompt's rows were forked
    self.decode_row_steps = 0  # batch rows x decode steps run (every row of the bucket computes each step)
    self.decode_tokens = 0  # tokens sampled; decode_tokens / decode_row_steps is the decode's slot utilisation
    self.work = EngineWork()  # seconds and work of prefill and decode (`m3jax.engine.work`)

  # ------------------------------------------------------------------------------------------- public API
  def generate(self, prompts: Sequence[Sequence[int]], config: SamplingConfig | None = None, cache=None,
               seed: int | None = None, constraint: TokenConstraint | None = None,
               row_ids: Sequence[int] | None = None) -> SampleOutput:
    """Generates a continuation for every prompt (ragged lengths). `cache` may be a pre-built empty cache;
    `constraint` restricts every row's output to an automaton's language (`constrained.py`). `row_ids` (one
    int per prompt) key each row's random stream by `fold_in(PRNGKey(seed), row_id)` instead of one stream for
    the batch, so a row samples the same tokens whatever else shares its batch (RL rollouts split over
    processes)."""
    if not prompts or any(len(p) == 0 for p in prompts):
      raise ValueError("generate() needs at least one prompt and every prompt needs at least one token")
    cfg = config or self.config
    batch = _bucket(len(prompts), cfg.batch_buckets)
    need = max(len(p) for p in prompts) + cfg.max_new_tokens
    distinct = list(dict.fromkeys(tuple(p) for p in prompts))
    if cache is None and self.share_prefix and len(distinct) < len(prompts):
      return self._generate_forked(prompts, distinct, batch, _bucket(need, cfg.length_buckets), cfg, seed,
                                   constraint, row_ids)
    if cache is None:
      cache = self._new_cache(batch, _bucket(need, cfg.length_buckets))
    state = DecodeState(cache, [[] for _ in range(batch)], batch)
    return self.continue_(state, [list(p) for p in prompts], cfg, seed, constraint, row_ids)

  def continue_(self, state: DecodeState, new_tokens: Sequence[Sequence[int] | None],
                config: SamplingConfig | None = None, seed: int | None = None,
                constraint: TokenConstraint | None = None, row_ids: Sequence[int] | None = None,
                constraint_starts: Sequence[int] | None = None,
                row_seeds: Sequence[int] | None = None) -> SampleOutput:
    """Appends `new_tokens[b]` to row b's history and decodes; rows given None (or beyond the list) stay idle.
    With `constraint`, this call's output starts in the automaton's start state, or in `constraint_starts[b]`
    (one state per row of `new_tokens`: rows of one call under different automata merged into one table);
    `row_ids` as in `generate` (one per row of the state), each row's stream seeded by `row_seeds[b]` instead
    of `seed` when given (with `row_ids` only)."""
    cfg = config or self.config
    fed = [b for b, t in enumerate(new_tokens) if t is not None]
    if self.split_prefill and self.mesh is None and fed and _bucket(len(fed), cfg.batch_buckets) < state.batch:
      return self._continue_subset(state, fed, new_tokens, cfg, seed, constraint, row_ids, constraint_starts,
                                   row_seeds)
    traces = TRACES[0]
    rows, active, logits, cache = self._prefill_rows(state, new_tokens, cfg)
    return self._decode_rows(state, cache, logits, rows, active, cfg, seed, constraint, traces, row_ids,
                             constraint_starts, row_seeds)

  def _continue_subset(self, state: DecodeState, fed: list[int], new_tokens, cfg: SamplingConfig, seed,
                       constraint, row_ids, constraint_starts, row_seeds) -> SampleOutput:
    """`continue_` on the fed rows only: they are gathered (padded with idle rows to a batch bucket) into a smaller
    state, decoded there and written back. WHY: continuous batching's slots and the static loop's later rounds
    feed a few rows of a wide state, and every row of a decode batch computes each step (measured: serve's
    joined calls at 8 slots were slower than static batches of 1-2 questions). Idle rows written back keep
    their length, so whatever the decode wrote past it is never read. Rows are independent given their tokens,
    so the fed rows decode as they would in the full state (up to float rounding across batch shapes)."""
    n = _bucket(len(fed), cfg.batch_buckets)
    index = fed + [b for b in range(state.batch) if b not in set(fed)][:n - len(fed)]

    def pick(values, default):
      return None if values is None else [values[b] if b < len(values) else default for b in index]

    start = 0 if constraint is None else int(constraint.start)
    sub = DecodeState(state.cache.take_rows(jnp.asarray(index, jnp.int32)), [state.history[b] for b in index], n)
    out = self.continue_(sub, [new_tokens[b] for b in fed], cfg, seed, constraint, pick(row_ids, 0),
                         pick(constraint_starts, start), pick(row_seeds, 0))
    cache = self._ensure_capacity(state.cache, out.state.cache.max_len, cfg)
    state.cache = put_rows(cache, out.state.cache, jnp.asarray(index, jnp.int32))
    return dataclasses.replace(out, state=state)

  def empty_state(self, batch: int, config: SamplingConfig | None = None) -> DecodeState:
    """A state of `batch` empty rows (bucketed) for `continue_`: the slots of continuous batching."""
    cfg = config or self.config
    batch = _bucket(batch, cfg.batch_buckets)
    return DecodeState(self._new_cache(batch, cfg.length_buckets[0]), [[] for _ in range(batch)], batch)

  def reset_rows(self, state: DecodeState, rows: Sequence[int]) -> DecodeState:
    """Empties `rows` of `state` (history and cache length; their stale cache entries are never read again,
    since attention reads a row only up to its length), so `continue_` can start a new conversation there while
    the other rows keep theirs."""
    if not rows:
      return state
    if max(rows) >= state.batch or min(rows) < 0:
      raise ValueError(f"rows {sorted(rows)} outside a decode state of {state.batch} rows")
    for b in rows:
      state.history[b] = []
    keep = np.ones((state.batch,), bool)
    keep[list(rows)] = False
    state.cache = state.cache.replace(length=jnp.where(jnp.asarray(keep), state.cache.length, 0))
    return state

  def decode_text(self, tokens: Sequence[int]) -> str:
    if self.tokenizer is None:
      raise ValueError("this sampler has no tokenizer")
    return self.tokenizer.decode(list(tokens), skip_special_tokens=False)

  # -------------------------------------------------------------------------------------------- internals
  def _generate_forked(self, prompts, distinct: list[tuple[int, ...]], batch: int, max_len: int,
                       cfg: SamplingConfig, seed, constraint, row_ids) -> SampleOutput:
    """`generate` with each distinct prompt prefilled once, in a cache of its own batch bucket, whose rows are
    then gathered (`KVCache.take_rows`) into one row per prompt: every row decodes from the same cache contents
    and last-token logits that its own prefill would have produced."""
    traces = TRACES[0]
    n = _bucket(len(distinct), cfg.batch_buckets)
    shared = DecodeState(self._new_cache(n, max_len), [[] for _ in range(n)], n)
    _, _, logits, cache = self._prefill_rows(shared, [list(d) for d in distinct], cfg)
    where = {d: i for i, d in enumerate(distinct)}
    index = np.zeros((batch,), np.int32)  # batch-padding rows copy row 0 and are emptied (keep False)
    index[:len(prompts)] = [where[tuple(p)] for p in prompts]
    keep = np.arange(batch) < len(prompts)
    cache, logits = fork(cache, logits, jnp.asarray(index), jnp.asarray(keep))
    self.prefill_tokens_saved += sum(len(p) for p in prompts) - sum(len(d) for d in distinct)
    state = DecodeState(cache, [list(p) for p in prompts] + [[] for _ in range(batch - len(prompts))], batch)
    rows = [list(p) for p in prompts] + [None] * (batch - len(prompts))
    return self._decode_rows(state, cache, logits, rows, keep, cfg, seed, constraint, traces, row_ids)

  def _prefill_rows(self, state: DecodeState, new_tokens, cfg: SamplingConfig):
    """Appends `new_tokens` to the rows' histories and prefills them (plus each row's pending last sample);
    returns (rows, active mask, last-token logits, cache)."""
    if len(new_tokens) > state.batch:
      raise ValueError(f"{len(new_tokens)} rows given but the decode state holds {state.batch}")
    t0 = time.perf_counter()
    rows = [list(t) if t is not None else None for t in new_tokens] + [None] * (state.batch - len(new_tokens))
    active = np.array([r is not None and len(state.history[b]) + len(r) > 0 for b, r in enumerate(rows)])
    if not active.any():
      raise ValueError("continue_() needs new tokens for at least one row")
    cache_len = np.asarray(jax.device_get(state.cache.length))
    feed = []
    for b, r in enumerate(rows):
      if r is None:
        feed.append([])
        continue
      pending = state.history[b][int(cache_len[b]):]  # committed tokens not in the cache yet (the last sample)
      state.history[b].extend(r)
      feed.append(pending + r)
    if any(active[b] and not feed[b] for b in range(state.batch)):
      raise ValueError("a continued row needs at least one new token")
    need = max(int(cache_len[b]) + len(feed[b]) for b in range(state.batch)) + cfg.max_new_tokens
    cache = self._ensure_capacity(state.cache, need, cfg)
    # rows whose whole conversation is the same (an RL group entering its slots together, or its rows after the
    # same search) prefill it once: the others are fed nothing, then take a copy of its cache row and logits
    source = _first_of_equal(feed, state.history, cache_len) if self.share_prefix else {}
    if source:
      self.prefill_tokens_saved += sum(len(feed[b]) for b in source)
      feed = [[] if b in source else f for b, f in enumerate(feed)]
    logits, cache = self._prefill_feed(cache, feed, state.batch, cfg)
    if source:
      cache, logits = copy_rows(cache, logits, *_copy_pairs(source, state.batch))
    self.work.prefill(t0, logits, cache_len, feed)
    return rows, active, logits, cache

  def _prefill_feed(self, cache, feed: list[list[int]], batch: int, cfg: SamplingConfig):
    """Prefills `feed[b]` at each row's cache offset (rows fed nothing are left as they are); returns (last-token
    logits [batch, V], cache)."""
    chunk_len = np.array([len(f) for f in feed], np.int32)
    self.prefill_tokens += int(chunk_len.sum())
    pieces = self._prefill_pieces(chunk_len, batch, cfg)
    if len(pieces) == 1 and len(pieces[0][0]) == batch:
      width = pieces[0][3]
      return prefill(self.graphdef, self.params, cache, jnp.asarray(tokens_of(feed, range(batch), width)),
                     jnp.asarray(chunk_len))
    logits = None
    for members, lo, hi, width, rows in pieces:
      part = [f[lo:hi] for f in feed]
      members_ = jnp.asarray(members, jnp.int32)
      if rows == batch:  # every row of the batch computes: no rows taken out and written back
        full, cache = prefill(self.graphdef, self.params, cache, jnp.asarray(tokens_of(part, range(batch), width)),
                              jnp.asarray([len(f) for f in part], np.int32))
        logits = scatter_logits(logits, full[members_], members_, batch)
        continue
      # the piece's rows, padded with other rows of the batch (fed nothing, written back as they were: distinct
      # indices, so the scatter back has no duplicate writes)
      others = [b for b in range(batch) if b not in set(members)]
      index = members + others[:rows - len(members)]
      sub, cache = prefill_subset(self.graphdef, self.params, cache, jnp.asarray(index, jnp.int32),
                                  jnp.asarray(tokens_of(part, index[:len(members)], width, rows)),
                                  jnp.asarray([len(part[b]) if i < len(members) else 0 for i, b in enumerate(index)],
                                              np.int32))
      logits = scatter_logits(logits, sub, members_, batch)  # a row's last piece writes its logits last
    return logits, cache

  def _prefill_pieces(self, chunk_len: np.ndarray, batch: int, cfg: SamplingConfig
                      ) -> list[tuple[list[int], int, int, int, int]]:
    """The prefill's calls as (rows fed, lo, hi, width, batch rows computed): tokens [lo, hi) of every row still
    fed, padded to a width bucket, one piece after another, so each row computes its own length rounded up to a
    piece instead of the longest row's width bucket. The rows of a piece are computed as a batch of their own,
    padded to a multiple of 8 rows (a batch bucket below 8, or under a mesh), or as the whole batch from 3/4 of it
    on (a 24-row subset of a 32-row cache of 1024 slots costs what the whole batch does: 2.9 s for 64 tokens a row,
    SmolLM2-135M on a 2-core Intel Xeon).

    WHY: an RL rollout's continuation prefill fed 32 rows of 155-363 tokens at width 512: half of the computed
    positions were padding, and so were most of the scores its attention computed."""
    piece = cfg.prefill_piece
    longest = int(chunk_len.max())
    if piece:
      piece = _bucket(min(piece, longest), cfg.length_buckets)  # a piece narrower than its width bucket pads
    if not self.split_prefill or piece == 0 or longest <= piece:
      return [(list(range(batch)), 0, longest, _bucket(longest, cfg.length_buckets), batch)]
    pieces = []
    for lo in range(0, longest, piece):
      members = [b for b in range(batch) if chunk_len[b] > lo]
      width = _bucket(min(piece, int(chunk_len[members].max()) - lo), cfg.length_buckets)
      rows = _bucket(len(members), cfg.batch_buckets)
      if rows > 8 and self.mesh is None:
        rows = -(-len(members) // 8) * 8
      if 4 * rows >= 3 * batch:  # taking rows out and writing them back costs about a quarter of their compute
        rows = batch
      pieces.append((members, lo, lo + piece, width, rows))
    return pieces

  def _decode_rows(self, state, cache, logits, rows, active, cfg, seed, constraint, traces,
                   row_ids=None, constraint_starts=None, row_seeds=None) -> SampleOutput:
    if constraint is not None and constraint.allowed.shape[1] != logits.shape[-1]:
      raise ValueError(f"the constraint covers {constraint.allowed.shape[1]} tokens but the model has "
                       f"{logits.shape[-1]}")
    seed = cfg.seed if seed is None else seed
    key = jax.random.PRNGKey(seed)
    if row_ids is not None:  # one stream per row: [B, 2] keys (batch-padding rows get id 0 and sample nothing)
      if len(row_ids) > len(rows):
        raise ValueError(f"{len(row_ids)} row ids for a batch of {len(rows)} rows")
      ids = np.zeros((len(rows),), np.uint32)
      ids[:len(row_ids)] = row_ids
      if row_seeds is None:
        key = jax.vmap(jax.random.fold_in, (None, 0))(key, jnp.asarray(ids))
      else:  # rows at different rounds of their conversations (continuous batching): a seed per row as well
        seeds = np.full((len(rows),), seed, np.uint32)
        seeds[:len(row_seeds)] = row_seeds
        key = jax.vmap(lambda s, i: jax.random.fold_in(jax.random.PRNGKey(s), i))(jnp.asarray(seeds),
                                                                                  jnp.asarray(ids))
    starts = None
    if constraint is not None and constraint_starts is not None:
      if len(constraint_starts) > len(rows):
        raise ValueError(f"{len(constraint_starts)} constraint starts for a batch of {len(rows)} rows")
      starts = np.full((len(rows),), int(constraint.start), np.int32)
      starts[:len(constraint_starts)] = constraint_starts
    out_tok, out_logp, out_ent, n_gen, cache = self._run_decode(cache, logits, ~active, key, cfg, constraint,
                                                                 starts)
    self.compilations += TRACES[0] - traces
    return self._finish(state, cache, out_tok, out_logp, out_ent, n_gen, rows, cfg, constraint is not None)

  def _new_cache(self, batch: int, max_len: int):
    cache = self.model.init_cache(batch, max_len, self.cache_dtype)
    if self.mesh is not None:
      axes = (("layers", "batch", "kv_heads", "seq", "head_dim") if isinstance(cache, KVCache) else
              ("layers", "batch", "seq", "kv_heads", "head_dim"))
      kv = named_sharding(self.mesh, axes, cache.k.shape)
      cache = cache.replace(k=jax.device_put(cache.k, kv), v=jax.device_put(cache.v, kv))
    return cache

  def _ensure_capacity(self, cache, need: int, cfg: SamplingConfig):
    if need <= cache.max_len:
      return cache
    return cache.padded(_bucket(need, cfg.length_buckets))

  def _run_decode(self, cache, logits, idle: np.ndarray, key: jax.Array, cfg: SamplingConfig,
                  constraint: TokenConstraint | None = None, starts: np.ndarray | None = None):
    B, N, t0 = idle.shape[0], cfg.max_new_tokens, time.perf_counter()
    start_len = np.asarray(jax.device_get(cache.length)) if hasattr(cache, "length") else None
    carry = dict(step=jnp.int32(0), logits=logits, done=jnp.asarray(idle), n_gen=jnp.zeros((B,), jnp.int32),
                 tokens=jnp.zeros((B, N), jnp.int32), logp=jnp.zeros((B, N), jnp.float32),
                 key=key)
    if constraint is not None:
      carry["automaton"] = (jnp.full((B,), constraint.start, jnp.int32) if starts is None else
                            jnp.asarray(starts, jnp.int32))
    if cfg.entropy:
      carry["entropy"] = jnp.zeros((B, N), jnp.float32)
    if cfg.frequency_penalty or cfg.presence_penalty:
      carry["counts"] = jnp.zeros((B, logits.shape[-1]), jnp.int32)
    interval = cfg.stop_check_interval if cfg.stop_strings else N
    text_done = np.array(idle)
    windows = []
    while True:
      limit = min(int(carry["step"]) + interval, N)
      # the unrolled-layer loop runs on per-layer arrays of the slots it can fill before `limit` (`LayerKV`)
      window = (None if not self.decode_window or not isinstance(cache, KVCache) else
                window_slots(int(start_len.max(initial=0)) + limit, cache.max_len))
      carry, cache = _decode(self.graphdef, self.params, cache, carry, jnp.int32(limit), _decode_options(cfg),
                             constraint, self.layers, window)
      windows.append((int(carry["step"]), window))
      step = int(carry["step"])
      done = np.asarray(jax.device_get(carry["done"]))
      if cfg.stop_strings and self.tokenizer is not None:
        toks = np.asarray(jax.device_get(carry["tokens"]))
        n_gen = np.asarray(jax.device_get(carry["n_gen"]))
        for b in np.flatnonzero(~done & ~text_done):
          text = self.tokenizer.decode(toks[b, :n_gen[b]].tolist(), skip_special_tokens=False)
          if any(s in text for s in cfg.stop_strings):
            text_done[b] = True
        if text_done.any():
          carry["done"] = jnp.asarray(done | text_done)
          done = done | text_done
      if done.all() or step >= N:
        break
    n_gen = np.asarray(jax.device_get(carry["n_gen"]))
    self.decode_row_steps += B * step
    self.work.decode(t0, step, (0, 0) if start_len is None else kv_bytes(cache, start_len, n_gen, step, windows))
    self.decode_tokens += int(n_gen.sum())
    return carry["tokens"], carry["logp"], carry.get("entropy"), carry["n_gen"], cache

  def _finish(self, state, cache, out_tok, out_logp, out_ent, n_gen, rows, cfg, constrained=False) -> SampleOutput:
    toks, logps, ents, n_gen = (None if x is None else np.asarray(x)
                                for x in jax.device_get((out_tok, out_logp, out_ent, n_gen)))
    tokens, logprobs, entropies, reasons, texts = [], [], [], [], []
    for b, r in enumerate(rows):
      if r is None:
        continue
      seq = toks[b, :n_gen[b]].tolist()
      reason = FINISH_CONSTRAINT if constrained and len(seq) < cfg.max_new_tokens else FINISH_LENGTH
      if seq and seq[-1] in cfg.stop_token_ids:
        reason = FINISH_STOP
      if cfg.stop_strings and self.tokenizer is not None:
        seq, cut = _truncate_at_stop_string(seq, cfg.stop_strings, self.tokenizer)
        reason = FINISH_STOP_STRING if cut else reason
      tokens.append(seq)
      logprobs.append(logps[b, :len(seq)])
      if ents is not None:
        entropies.append(ents[b, :len(seq)])
      reasons.append(reason)
      state.history[b].extend(seq)
      if self.tokenizer is not None:
        texts.append(self.tokenizer.decode(seq, skip_special_tokens=True))
    # The cache holds every fed token; rows truncated at a stop string roll back to their kept history.
    kept = jnp.asarray([len(h) for h in state.history], jnp.int32)
    cache = cache.replace(length=jnp.minimum(cache.length, kept))
    state.cache = cache
    return SampleOutput(tokens, logprobs, reasons, state, texts if self.tokenizer is not None else None,
                        entropies if ents is not None else None)


def _truncate_at_stop_string(seq: list[int], stops: Sequence[str], tokenizer) -> tuple[list[int], bool]:
  """Shortest prefix of `seq` whose text contains a stop string (the stop string is kept, as in vLLM's include)."""
  text = tokenizer.decode(seq, skip_special_tokens=False)
  if not any(s in text for s in stops):
    return seq, False
  lo, hi = 1, len(seq)
  while lo < hi:  # binary search on the token prefix length
    mid = (lo + hi) // 2
    if any(s in tokenizer.decode(seq[:mid], skip_special_tokens=False) for s in stops):
      hi = mid
    else:
      lo = mid + 1
  return seq[:lo], True
