"""The sampler's decode program: `SamplingConfig`, one token sampled per row, and the jitted decode loop.

WHY a module of its own: this is the device side of `Sampler._run_decode` (`sampling.py` keeps the host-side
bookkeeping and calls in here; this module never imports it back), as `prefill.py` is of its prefill.

* `_decode` is a `lax.while_loop` over a donated KV cache that samples and feeds one token per row per step until
  every row is done or `limit` steps ran; its carry holds all the loop's state, so the host can stop it every
  `stop_check_interval` steps to look for stop strings and resume it where it stopped. Stop token ids, the
  token constraint's automaton (`constrained.py`) and the frequency / presence penalties run on device.
* The program is specialised on `_decode_options(cfg)`, the config without the fields it does not read (stop
  strings, seed), so those never cause a recompile; its traces count in `prefill.TRACES`.
* `SamplingConfig` lives here because the program is specialised on it and imports go one way (sampling ->
  decode); callers keep importing it from `m3jax.engine.sampling`, which imports it from here.
* `sample_token` is also the first token of Omni's generation (`omni_generate.py`).

Log-probs are log p(token) under softmax(logits / temperature) (temperature 1 when greedy), before top-k/top-p
truncation — the behaviour policy's log-probs that the RL learner uses as the old policy.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from flax import nnx
from jaxtyping import Array, Float, Int

from m3jax.engine.constrained import TokenConstraint
from m3jax.engine.prefill import TRACES


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  max_new_tokens: int = 256
  greedy: bool = False
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0  # 0 = no top-k
  # OpenAI-style penalties on the tokens this call generated so far: logit -= frequency * count + presence * seen
  # (greedy 135M models loop on a phrase without them)
  frequency_penalty: float = 0.0
  presence_penalty: float = 0.0
  stop_token_ids: tuple[int, ...] = ()
  stop_strings: tuple[str, ...] = ()
  seed: int = 0
  stop_check_interval: int = 32
  length_buckets: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
  batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
  # > 0: a prefill longer than this many tokens runs as pieces of it, each over the rows still fed (`Sampler`'s
  # `_prefill_pieces`; RL rollouts on CPU use 64); 0 = one call at the longest row's width bucket
  prefill_piece: int = 0
  # record each sampled token's distribution entropy (`token_entropy`; `SampleOutput.entropies`): RL's TAURA
  # weights then come from the rollout instead of another forward pass of the learner
  entropy: bool = False

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature must be > 0 when sampling (use greedy=True for argmax), got {self.temperature}")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if self.stop_strings and self.stop_check_interval < 1:
      raise ValueError("stop_check_interval must be >= 1")
    if self.prefill_piece < 0:
      raise ValueError(f"prefill_piece must be >= 0 (0 = one call), got {self.prefill_piece}")


def sample_token(logits: jax.Array, key: jax.Array, cfg: SamplingConfig) -> tuple[jax.Array, jax.Array]:
  """Samples one token per row from logits [B, V] with one key, or a key per row ([B, 2]); returns (token [B],
  log-prob [B])."""
  logits = logits.astype(jnp.float32)
  if cfg.greedy:
    return _greedy_token(logits)
  scaled = logits / cfg.temperature
  logp = jax.nn.log_softmax(scaled, axis=-1)
  if cfg.top_k:
    vals, idx = jax.lax.top_k(scaled, min(cfg.top_k, scaled.shape[-1]))
  elif cfg.top_p < 1:
    idx = jnp.argsort(-scaled, axis=-1)
    vals = jnp.take_along_axis(scaled, idx, axis=-1)
  else:
    vals, idx = scaled, None
  if cfg.top_p < 1:
    probs = jax.nn.softmax(vals, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate (sorted descending)
    vals = jnp.where(before < cfg.top_p, vals, -jnp.inf)
  choice = (jax.random.categorical(key, vals, axis=-1) if key.ndim == 1 else
            jax.vmap(lambda k, v: jax.random.categorical(k, v))(key, vals))
  tok = choice if idx is None else jnp.take_along_axis(idx, choice[:, None], axis=-1)[:, 0]
  return tok.astype(jnp.int32), jnp.take_along_axis(logp, tok[:, None].astype(jnp.int32), axis=-1)[:, 0]


def token_entropy(logits: Float[Array, "B V"], cfg: SamplingConfig) -> Float[Array, "B"]:
  """Entropy of the distribution `sample_token` draws from before top-k/top-p truncation (softmax of the logits
  at the temperature; at T = 1 when greedy), the distribution whose log-probs it returns. Masked logits (-inf,
  constrained decoding) count as probability 0."""
  scaled = logits.astype(jnp.float32) / (1.0 if cfg.greedy else cfg.temperature)
  logp = jax.nn.log_softmax(scaled, axis=-1)
  return -jnp.sum(jnp.where(jnp.isfinite(logp), jnp.exp(logp) * logp, 0.0), axis=-1)


def _greedy_token(logits: Float[Array, "B V"]) -> tuple[Int[Array, "B"], Float[Array, "B"]]:
  """jnp.argmax (first maximum; first NaN if any) and its log-softmax, from two plain reductions over the vocab.

  XLA:CPU runs argmax's (value, index) reduction unvectorised: 1.15 ms for [8, 51864] vs 0.47 ms for a max then a
  min over the matching indices (0.7 ms of a ~20 ms Whisper tiny.en decode step). At the argmax the shifted logit
  is exactly 0, so its log-softmax is -log(sum(exp(logits - max))), the formula `jax.nn.log_softmax` evaluates.
  """
  top = logits.max(axis=-1, keepdims=True)
  index = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
  tok = jnp.min(jnp.where((logits == top) | jnp.isnan(logits), index, logits.shape[-1]), axis=-1)
  return tok, -jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1))


@functools.partial(jax.jit, static_argnums=(0, 5, 8), donate_argnums=(2,))
def _decode(graphdef, params, cache, carry, limit, cfg: SamplingConfig, constraint: TokenConstraint | None = None,
            layers=None, window: int | None = None):
  """Samples and feeds tokens until `limit` steps or every row is done (resumable: the carry holds all state).

  With a `constraint`, logits outside `allowed[automaton state]` are masked before sampling (so log-probs are those
  of the masked distribution, the one actually sampled), a row with no allowed token ends without emitting, and a
  row whose automaton accepts ends after that token. With a `window` (unrolled `layers` only), the loop runs on the
  cache's first `window` slots as per-layer arrays (`KVCache.layer_window`); the caller guarantees no row fills
  more than that before `limit`."""
  TRACES[0] += 1
  model = nnx.merge(graphdef, params)
  stop_ids = jnp.asarray(cfg.stop_token_ids or (-1,), jnp.int32)
  rows = jnp.arange(carry["done"].shape[0])

  def cond(state):
    c, _ = state
    return (c["step"] < limit) & ~jnp.all(c["done"])

  def body(state):
    c, cache = state
    key = (jax.random.fold_in(c["key"], c["step"]) if c["key"].ndim == 1 else  # one stream, or one per row
           jax.vmap(jax.random.fold_in, (0, None))(c["key"], c["step"]))
    logits, live = c["logits"], ~c["done"]
    if "counts" in c:
      logits = logits - cfg.frequency_penalty * c["counts"] - cfg.presence_penalty * (c["counts"] > 0)
    if constraint is not None:
      allowed = constraint.allowed[c["automaton"]]
      logits = jnp.where(allowed, logits, -jnp.inf)
      live = live & jnp.any(allowed, axis=-1)
    tok, logp = sample_token(logits, key, cfg)
    tokens = c["tokens"].at[rows, c["n_gen"]].set(jnp.where(live, tok, c["tokens"][rows, c["n_gen"]]),
                                                  mode="drop")
    logps = c["logp"].at[rows, c["n_gen"]].set(jnp.where(live, logp, 0.0), mode="drop")
    extra = {}
    if "entropy" in c:
      extra["entropy"] = c["entropy"].at[rows, c["n_gen"]].set(jnp.where(live, token_entropy(logits, cfg), 0.0),
                                                              mode="drop")
    n_gen = c["n_gen"] + live.astype(jnp.int32)
    done = c["done"] | ~live | (live & jnp.isin(tok, stop_ids)) | (n_gen >= cfg.max_new_tokens)
    if constraint is not None:
      automaton = jnp.where(live, constraint.next_state[c["automaton"], tok].astype(jnp.int32), c["automaton"])
      done = done | constraint.final[automaton]
      extra["automaton"] = automaton
    if "counts" in c:
      extra["counts"] = c["counts"].at[rows, tok].add(live.astype(jnp.int32))
    # Feed the new tokens (rows already done feed nothing). No lax.cond around this: a cond copies the carried
    # cache every step; the loop condition already ends the loop once all rows are done, so at most the last
    # step's forward is unused.
    logits, cache = model(tok[:, None], cache, (~done).astype(jnp.int32), **({} if layers is None else
                                                                             {"layers": layers}))
    logits = logits[:, 0].astype(jnp.float32)
    new = dict(step=c["step"] + 1, logits=logits, done=done, n_gen=n_gen, tokens=tokens, logp=logps, key=c["key"],
               **extra)
    return new, cache

  if window is None:
    return jax.lax.while_loop(cond, body, (carry, cache))
  carry, kv = jax.lax.while_loop(cond, body, (carry, cache.layer_window(window)))
  return carry, cache.with_window(kv, cache.length, carry["tokens"].shape[1])


WINDOW_MIN = 128


def window_slots(fill: int, slots: int) -> int:
  """The decode loop's window for a loop that fills at most `fill` of a cache's `slots`: the least of 128 * 2^i
  and 192 * 2^i holding `fill` (a window costs at most 1.5x what is filled, with two programs per doubling), or
  every slot."""
  w = WINDOW_MIN
  while w < fill:
    w = w * 3 // 2 if w & (w - 1) == 0 else w * 4 // 3
  return min(w, slots)


def _decode_options(cfg: SamplingConfig) -> SamplingConfig:
  """The fields the decode program depends on (so stop strings or seeds never cause a recompile)."""
  return dataclasses.replace(cfg, stop_strings=(), seed=0, stop_check_interval=1, prefill_piece=0)
