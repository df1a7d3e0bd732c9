"""The deterministic text embedder of the official-graph fixtures (`weighted-hashed-bow-sha256-64`).

The fixture graphs were built with this stand-in for `text-embedding-3-large`; replaying their insertion and
their queries needs the exact same vectors, so the algorithm is implemented literally (float64, the same
summation order) as documented in `tests/fixtures/official_graphs/*.embedder.json`. It implements the memory
package's embedder interface: `embed(texts) -> float32 [N, D]` unit rows.

The spec's parameters (stop words, negations, dimension) are also constants here, so `HashedBowEmbedder.builtin()`
(the `embedder="hashed"` of the eval and RL configs) needs no file outside the package; a test checks them
against the JSON spec.
"""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np

_TOKEN_RE = re.compile(r"[a-z0-9_]+")
# the spec `weighted-hashed-bow-sha256-64`: stop words, negation words, dimension
STOPWORDS = tuple("""
a about after all also am an and any are as asks at be been before being but by can could d did do does
each every for from had has have he her here him his how i if in into is it its just ll m me my of on or
our re s says she should so t than that the their them then there these they this those to too us ve was
we were what when where which who whom whose why will with would you your
""".split())
NEGATIONS = ("never", "no", "not")
DIMENSION = 64


class HashedBowEmbedder:
  """Hashed bag-of-words: sha256 picks a slot and a weight per token; odd negation count flips the sign."""

  def __init__(self, stopwords: Iterable[str], negations: Iterable[str], dim: int = 64):
    if dim <= 0:
      raise ValueError(f"embedder dimension must be positive, got {dim}")
    self.stopwords = frozenset(stopwords)
    self.negations = frozenset(negations)
    self.dim = dim
    self._token_cache: dict[str, tuple[int, float]] = {}

  @classmethod
  def builtin(cls, dim: int = DIMENSION) -> "HashedBowEmbedder":
    """The fixture graphs' embedder from the constants above (no spec file needed). Another `dim` keeps its
    tokens, stopwords and negations for a graph of that text width (the service's `embedder="hashed"`)."""
    return cls(STOPWORDS, NEGATIONS, dim)

  @classmethod
  def from_json(cls, path: str | pathlib.Path) -> "HashedBowEmbedder":
    spec = json.loads(pathlib.Path(path).read_text())
    return cls(spec["stopwords"], spec["negations"], int(spec["dimension"]))

  def _slot(self, token: str) -> tuple[int, float]:
    hit = self._token_cache.get(token)
    if hit is None:
      d = hashlib.sha256(token.encode("utf-8")).digest()
      hit = (int.from_bytes(d[:8], "big") % self.dim, 1.0 + (int.from_bytes(d[8:16], "big") >> 12) / 2.0**52)
      self._token_cache[token] = hit
    return hit

  def embed_one(self, text: str) -> list[float]:
    """Float64 vector exactly as the fixture's reference function computes it."""
    toks = [t for t in _TOKEN_RE.findall(text.lower()) if t not in self.stopwords]
    toks = [t[:-1] if len(t) > 3 and t.endswith("s") and not t.endswith("ss") else t for t in toks]
    negative = sum(t in self.negations for t in toks) % 2 == 1
    v = [0.0] * self.dim
    for t in toks + ["<bias>"]:
      idx, w = self._slot(t)
      v[idx] += w
    ss = 0.0
    for x in v:
      ss += x * x
    n = math.sqrt(ss)
    v = [x / n for x in v]
    return [-x for x in v] if negative else v

  def __call__(self, texts: Sequence[str]) -> np.ndarray:
    out = np.zeros((len(texts), self.dim), np.float32)
    for i, t in enumerate(texts):
      out[i] = self.embed_one(t)
    return out
