"""Face and voice identities: banks of embedding sets and batched matching by mean pairwise cosine.

A face (voice) node keeps at most 10 (20) unit embeddings. A query (a face cluster's embeddings, or one
speech segment's embedding) matches the node with the highest mean pairwise cosine if it reaches the
threshold (0.3 faces, 0.6 voices), else it founds a new node. Scores against every existing node come from
one jitted masked einsum over the padded bank `[F, K, D]`; only the few nodes created or changed earlier in the
same batch are rescored on the host, which keeps the reference's sequential semantics (a segment can match a
node created by the previous segment of the same clip). On overflow, a subsample seeded by
(graph seed, node id, update count) keeps the cap, where the reference uses unseeded `random.sample`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from m3jax.memory.arrays import GrowableArray, next_pow2


class IdentityError(ValueError):
  """Bad face/voice embeddings handed to the graph."""


@jax.jit
def mean_pairwise_cosine(q: Float[Array, "Q M D"], q_mask: Bool[Array, "Q M"], bank: Float[Array, "F K D"],
                         count: Int[Array, "F"]) -> Float[Array, "Q F"]:
  """Mean over valid (query embedding, stored embedding) pairs of their dot products (unit rows: cosines)."""
  sims = jnp.einsum("qmd,fkd->qfmk", q, bank)
  k_mask = jnp.arange(bank.shape[1])[None, :] < count[:, None]
  pair = q_mask[:, None, :, None] & k_mask[None, :, None, :]
  total = jnp.sum(jnp.where(pair, sims, 0.0), axis=(2, 3))
  n = jnp.sum(pair, axis=(2, 3))
  return jnp.where(n > 0, total / jnp.maximum(n, 1), -jnp.inf)


class EntityBank:
  """Struct-of-arrays store of one entity kind: embeddings `[F, K, D]`, counts, owning node ids."""

  def __init__(self, dim: int, max_embeddings: int, threshold: float, capacity: int = 16):
    self.dim = dim
    self.max_embeddings = max_embeddings
    self.threshold = threshold
    self.emb = GrowableArray((max_embeddings, dim), np.float32, capacity)
    self.count = GrowableArray((), np.int32, capacity)
    self.node = GrowableArray((), np.int32, capacity, fill=-1)
    self.updates = GrowableArray((), np.int32, capacity)

  def __len__(self) -> int:
    return self.count.size

  def embeddings(self, slot: int) -> np.ndarray:
    return self.emb.data[slot, : self.count.data[slot]]

  def add(self, node_id: int, embs: np.ndarray) -> int:
    """New node holding the first `max_embeddings` of `embs`; returns its slot."""
    embs = embs[: self.max_embeddings]
    row = np.zeros((self.max_embeddings, self.dim), np.float32)
    row[: len(embs)] = embs
    slot = self.emb.append(row[None])
    self.count.append([len(embs)])
    self.node.append([node_id])
    self.updates.append([0])
    return slot

  def merge(self, slot: int, embs: np.ndarray, seed: int) -> None:
    """Old + new embeddings; above the cap a seeded subsample (original order kept) keeps `max_embeddings`."""
    merged = np.concatenate([self.embeddings(slot), embs], axis=0)
    n_updates = int(self.updates.data[slot]) + 1
    if len(merged) > self.max_embeddings:
      rng = np.random.default_rng([seed, int(self.node.data[slot]), n_updates])
      merged = merged[np.sort(rng.choice(len(merged), self.max_embeddings, replace=False))]
    row = np.zeros((self.max_embeddings, self.dim), np.float32)
    row[: len(merged)] = merged
    self.emb.set(slot, row)
    self.count.set(slot, len(merged))
    self.updates.set(slot, n_updates)

  def score(self, queries: Sequence[np.ndarray]) -> np.ndarray:
    """`[Q, F]` mean pairwise cosines of each query set against every node, in one jitted call."""
    n_q, n_f = len(queries), len(self)
    if n_q == 0 or n_f == 0:
      return np.zeros((n_q, n_f), np.float32)
    m = next_pow2(max(len(q) for q in queries))
    q = np.zeros((next_pow2(n_q), m, self.dim), np.float32)
    mask = np.zeros(q.shape[:2], bool)
    for i, e in enumerate(queries):
      q[i, : len(e)] = e
      mask[i, : len(e)] = True
    out = mean_pairwise_cosine(jnp.asarray(q), jnp.asarray(mask), self.emb.device(), self.count.device())
    return np.asarray(out)[:n_q, :n_f]

  def _score_one(self, query: np.ndarray, slot: int) -> float:
    return float(np.mean(query @ self.embeddings(slot).T))

  def match_and_insert(self, queries: Sequence[np.ndarray], new_node_id, seed: int) -> list[tuple[int, bool]]:
    """Matches queries in order; returns (slot, created) per query. `new_node_id()` allocates graph ids."""
    for q in queries:
      if q.ndim != 2 or q.shape[1] != self.dim or len(q) == 0:
        raise IdentityError(f"expected a non-empty [n, {self.dim}] embedding set, got shape {q.shape}")
      if not np.all(np.isfinite(q)):
        raise IdentityError("embeddings contain NaN or inf")
    base = self.score(queries)
    n_base = base.shape[1]
    touched: set[int] = set()
    out: list[tuple[int, bool]] = []
    for i, q in enumerate(queries):
      scores = np.full(len(self), -np.inf, np.float32)
      scores[:n_base] = base[i]
      for slot in touched:
        scores[slot] = self._score_one(q, slot)
      ok = scores >= self.threshold
      if ok.any():
        slot = int(np.argmax(np.where(ok, scores, -np.inf)))
        self.merge(slot, q, seed)
        out.append((slot, False))
      else:
        slot = self.add(new_node_id(), q)
        out.append((slot, True))
      touched.add(slot)
    return out
