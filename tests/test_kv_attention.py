"""Ragged attention over the KV cache (`kv_attention.cached_attention`) equals dense attention over the whole cache,
judged against a float64 softmax the way parity.py judges ports: its error within a small factor of the dense
float32 path's own."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from m3jax.models.decoder import attention
from m3jax.models.kv_attention import cached_attention, window_attention

from parity import assert_close_to_reference

L, S, K, G, DH = 2, 64, 2, 3, 8
BLOCK = 16  # 4 blocks in the 64-slot cache, so lengths land on, inside and past block edges


def _case(lengths, T, seed):
  """A random cache whose rows hold `lengths` filled slots, and T new queries per row written at their end
  (`chunk` of them real; a decode step is T=1). Slots past a row's fill hold values that must not matter."""
  rs = np.random.RandomState(seed)
  B = len(lengths)
  ck, cv = rs.randn(2, L, B, S, K, DH).astype(np.float32)
  q = rs.randn(B, T, K * G, DH).astype(np.float32)
  start = np.array([n for n, _ in lengths], np.int32)
  valid = np.array([n + c for n, c in lengths], np.int32)
  slots = start[:, None] + np.arange(T, dtype=np.int32)[None]
  return q, ck, cv, slots, valid


def _heads_first(ck, cv):
  """The cache's layout `[L, B, K, S, Dh]` of `_case`'s `[L, B, S, K, Dh]` arrays (the dense path's layer layout)."""
  return tuple(jnp.asarray(c.transpose(0, 1, 3, 2, 4)) for c in (ck, cv))


def _f64_attention(q, k, v, slots, valid, window):
  """Masked grouped-query softmax attention in float64 (rows that see no key are left at 0)."""
  B, T, H, Dh = q.shape
  keys = np.arange(k.shape[1])
  out = np.zeros((B, T, H, Dh))
  for b in range(B):
    for t in range(T):
      seen = (keys <= slots[b, t]) & (keys < valid[b])
      if window:
        seen &= keys > slots[b, t] - window
      if not seen.any():
        continue
      for h in range(H):
        s = k[b, seen, h // G].astype(np.float64) @ q[b, t, h].astype(np.float64) / np.sqrt(Dh)
        p = np.exp(s - s.max())
        out[b, t, h] = (p / p.sum()) @ v[b, seen, h // G].astype(np.float64)
  return out


# (filled before the step, real new tokens): an empty row, rows inside / on the edge of a block, a full row
DECODE = [(0, 1), (5, 1), (15, 1), (16, 1), (40, 1), (63, 1)]
PREFILL = [(0, 7), (3, 2), (16, 9), (50, 7), (20, 0)]  # longest ends inside a block; the last row idles (done)


@pytest.mark.parametrize("lengths,T,window", [(DECODE, 1, None), (DECODE, 1, 6), (PREFILL, 9, None),
                                              (PREFILL, 9, 4)])
def test_ragged_attention_equals_dense_attention(lengths, T, window):
  q, ck, cv, slots, valid = _case(lengths, T, seed=T + (window or 0))
  layer = 1
  w = None if window is None else jnp.int32(window)
  ours = cached_attention(jnp.asarray(q), *_heads_first(ck, cv), jnp.int32(layer), jnp.asarray(slots),
                          jnp.asarray(valid), w, block=BLOCK)
  dense = attention(jnp.asarray(q), jnp.asarray(ck[layer]), jnp.asarray(cv[layer]), jnp.asarray(slots),
                    jnp.asarray(valid), w)
  exact = _f64_attention(q, ck[layer], cv[layer], slots, valid, window)
  real = slots < valid[:, None]  # queries past a row's chunk are padding; their outputs are never used
  assert_close_to_reference(np.asarray(ours)[real], np.asarray(dense)[real], exact[real], what="ragged attention")
  # the decode loop's form: the layer as [B, K, S, Dh] arrays of its own, read whole
  per_layer = [jnp.asarray(c[layer].transpose(0, 2, 1, 3)) for c in (ck, cv)]
  whole = window_attention(jnp.asarray(q), *per_layer, jnp.asarray(slots), jnp.asarray(valid), w)
  assert_close_to_reference(np.asarray(whole)[real], np.asarray(dense)[real], exact[real], what="window attention")


def test_slots_past_the_longest_row_are_never_read():
  """Blocks beyond max(valid_len) are skipped: NaN there leaves every output finite (the dense path reads them)."""
  q, ck, cv, slots, valid = _case([(10, 1), (20, 1)], 1, seed=3)
  ck[:, :, 32:] = np.nan  # blocks 2 and 3 of 16 slots; the longest row fills 21 slots
  cv[:, :, 32:] = np.nan
  args = (jnp.asarray(slots), jnp.asarray(valid))
  ours = cached_attention(jnp.asarray(q), *_heads_first(ck, cv), jnp.int32(0), *args, block=BLOCK)
  assert np.isfinite(np.asarray(ours)).all()
  assert not np.isfinite(np.asarray(attention(jnp.asarray(q), jnp.asarray(ck[0]), jnp.asarray(cv[0]), *args))).all()


def test_a_row_with_nothing_to_see_gives_zeros_and_jit_compiles_once_for_every_length():
  """A batch-padding row (nothing written, no new token) is finite zeros; lengths are traced, so one program serves
  every fill of the same bucket."""
  fn = jax.jit(lambda q, ck, cv, s, v: cached_attention(q, ck, cv, jnp.int32(0), s, v, block=BLOCK))
  traces = []
  for lengths in ([(0, 0), (30, 1)], [(0, 0), (63, 1)], [(0, 0), (1, 1)]):
    q, ck, cv, slots, valid = _case(lengths, 1, seed=4)
    out = np.asarray(fn(q, *_heads_first(ck, cv), slots, valid))
    assert (out[0] == 0).all() and np.isfinite(out).all()
    traces.append(fn._cache_size())
  assert traces == [1, 1, 1]
  for T in (1, 3):  # a decode step's form and a prefill piece's (scores masked by a select / by an additive bias)
    q, ck, cv, slots, valid = _case([(0, 0), (30, T)], T, seed=4)
    for out in (window_attention(q, ck[0].transpose(0, 2, 1, 3), cv[0].transpose(0, 2, 1, 3), slots, valid),
                cached_attention(q, *_heads_first(ck, cv), jnp.int32(0), slots, valid, block=BLOCK)):
      assert (np.asarray(out)[0] == 0).all() and np.isfinite(np.asarray(out)).all() and (np.asarray(out)[1] != 0).all()
