"""The sampler's prefill programs: a batch's chunks written into its KV cache, whole, by groups of rows, or once
per distinct prompt and forked.

WHY a module of its own: these are the device programs behind `Sampler._prefill_rows` and
`Sampler._generate_forked` (`sampling.py` keeps the host-side scheduling, `decode.py` holds the decode loop).
Every program counts its traces in `TRACES`, which `Sampler.compilations` reads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

TRACES = [0]  # incremented whenever a sampler program is traced (compiled)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def prefill(graphdef, params, cache, tokens, chunk_len):
  """Writes each row's chunk into the cache; returns the logits after each row's last real token."""
  TRACES[0] += 1
  return _prefill_rows(graphdef, params, cache, tokens, chunk_len)


def _prefill_rows(graphdef, params, cache, tokens, chunk_len):
  model = nnx.merge(graphdef, params)
  last = jnp.maximum(chunk_len - 1, 0)
  if hasattr(model, "hidden"):
    h, cache = model.hidden(tokens, cache, chunk_len)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)
    return model.logits(h_last)[:, 0], cache
  logits, cache = model(tokens, cache, chunk_len)
  return jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0], cache


def tokens_of(feed, rows, width: int, batch: int | None = None) -> np.ndarray:
  """[batch, width] token ids: row i holds feed[rows[i]] (rows past `rows` stay empty)."""
  rows = list(rows)
  out = np.zeros((len(rows) if batch is None else batch, width), np.int32)
  for i, b in enumerate(rows):
    out[i, :len(feed[b])] = feed[b]
  return out


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def prefill_subset(graphdef, params, cache, index, tokens, chunk_len):
  """`prefill` on the cache rows `index` (distinct) only, their new slots written back in place: a group of rows
  prefilled at its own width, without computing the rest of the batch."""
  TRACES[0] += 1
  logits, sub = _prefill_rows(graphdef, params, cache.take_rows(index), tokens, chunk_len)
  return logits, cache.with_rows_filled(sub, index, cache.length[index], tokens.shape[1])


@functools.partial(jax.jit, static_argnums=(3,))
def scatter_logits(logits, part, members, batch: int):
  """The full batch's last-token logits with rows `members` taken from a group's prefill (`part`'s first rows)."""
  TRACES[0] += 1
  base = jnp.zeros((batch, part.shape[-1]), part.dtype) if logits is None else logits
  return base.at[members].set(part[:members.shape[0]])


@functools.partial(jax.jit, donate_argnums=(0,))
def put_rows(cache, sub, index):
  """`cache` with rows `index` (distinct) replaced by `sub`'s rows, in place: a subset's decode written back."""
  TRACES[0] += 1
  return cache.replace(k=cache.k.at[:, index].set(sub.k), v=cache.v.at[:, index].set(sub.v),
                       length=cache.length.at[index].set(sub.length))


@jax.jit
def fork(cache, logits, index, keep):
  """Row b of the result is row `index[b]` of a prefill's cache and logits; rows with `keep` False are emptied."""
  TRACES[0] += 1
  cache = cache.take_rows(index)
  return cache.replace(length=jnp.where(keep, cache.length, 0)), logits[index]


@functools.partial(jax.jit, donate_argnums=(0, 1))
def copy_rows(cache, logits, dst, src):
  """`cache` and `logits` with rows `dst` replaced by rows `src`, in place: only the copied rows move (a gather
  of the whole cache, as `fork` does, would copy every row of a cache that later rounds have filled)."""
  TRACES[0] += 1
  return (cache.replace(k=cache.k.at[:, dst].set(cache.k[:, src]), v=cache.v.at[:, dst].set(cache.v[:, src]),
                        length=cache.length.at[dst].set(cache.length[src])), logits.at[dst].set(logits[src]))
