"""Confidence intervals for evaluation numbers: an accuracy's Wilson interval and a paired bootstrap interval for
the difference of two answerers over the same questions.

WHY: "the trained agent beats the baseline" was read off two accuracies a standard error apart. Every accuracy
gets a 95% interval, and every comparison is paired (both answerers on the same questions, so the questions'
difficulty cancels): its interval is the bootstrap's over resampled questions. Pure numpy, deterministic given
the seed, so a re-run prints the same interval.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def wilson_interval(hits: int, n: int, level: float = 0.95) -> tuple[float, float]:
  """The Wilson score interval of `hits` out of `n` (sound at 0/n and n/n, where the normal one collapses)."""
  if n < 1 or not 0 <= hits <= n:
    raise ValueError(f"need 0 <= hits <= n and n >= 1, got hits={hits}, n={n}")
  z = _z(level)
  p = hits / n
  centre = (p + z * z / (2 * n)) / (1 + z * z / n)
  half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
  return max(0.0, float(centre - half)), min(1.0, float(centre + half))


def accuracy_interval(correct: Sequence[bool], level: float = 0.95) -> tuple[float, float, float]:
  """(accuracy, low, high) of per-question verdicts, with the Wilson interval."""
  c = np.asarray(correct, bool)
  lo, hi = wilson_interval(int(c.sum()), len(c), level)
  return float(c.mean()), lo, hi


def paired_bootstrap(a: Sequence[bool], b: Sequence[bool], resamples: int = 10_000, seed: int = 0,
                     level: float = 0.95) -> tuple[float, float, float]:
  """(accuracy of a − accuracy of b, low, high): the percentile interval of the mean per-question difference over
  `resamples` resamplings of the questions with replacement (the same resampled questions for both answerers)."""
  d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
  if d.ndim != 1 or len(d) < 1 or len(np.asarray(b)) != len(d):
    raise ValueError(f"need two equal-length, non-empty verdict lists, got {len(np.asarray(a))} and "
                     f"{len(np.asarray(b))}")
  rng = np.random.default_rng(seed)
  means = np.empty(resamples)
  chunk = max(1, 2 ** 22 // len(d))  # bounded memory: at most ~4M indices at once
  for start in range(0, resamples, chunk):
    k = min(chunk, resamples - start)
    means[start:start + k] = d[rng.integers(0, len(d), size=(k, len(d)))].mean(axis=1)
  tail = (1 - level) / 2 * 100
  lo, hi = np.percentile(means, [tail, 100 - tail])
  return float(d.mean()), float(lo), float(hi)


def rate_bootstrap(errors: Sequence[float], sizes: Sequence[float], other: Sequence[float] | None = None,
                   resamples: int = 10_000, seed: int = 0, level: float = 0.95) -> tuple[float, float, float]:
  """A corpus rate sum(errors) / sum(sizes) (a word error rate: edits over script words, per utterance) with
  the percentile interval over resampled items; with `other` (a second system's errors on the same items), the
  paired difference rate(errors) − rate(other) and its interval, the same resampled items for both."""
  e = np.asarray(errors, np.float64)
  w = np.asarray(sizes, np.float64)
  o = np.zeros_like(e) if other is None else np.asarray(other, np.float64)
  if e.ndim != 1 or len(e) < 1 or w.shape != e.shape or o.shape != e.shape or w.sum() <= 0:
    raise ValueError(f"need equal-length, non-empty per-item lists with positive sizes, got {e.shape}, {w.shape}, "
                     f"{o.shape}")
  rng = np.random.default_rng(seed)
  rates = np.empty(resamples)
  chunk = max(1, 2 ** 22 // len(e))
  for start in range(0, resamples, chunk):
    k = min(chunk, resamples - start)
    idx = rng.integers(0, len(e), size=(k, len(e)))
    rates[start:start + k] = (e[idx] - o[idx]).sum(axis=1) / np.maximum(w[idx].sum(axis=1), 1e-12)
  tail = (1 - level) / 2 * 100
  lo, hi = np.percentile(rates, [tail, 100 - tail])
  return float((e - o).sum() / w.sum()), float(lo), float(hi)


def _z(level: float) -> float:
  """The two-sided normal quantile for `level` (numpy has no inverse erf: bisection on math.erf)."""
  import math
  if not 0 < level < 1:
    raise ValueError(f"level must be in (0, 1), got {level}")
  lo, hi = 0.0, 10.0
  for _ in range(80):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if math.erf(mid / math.sqrt(2)) < level else (lo, mid)
  return (lo + hi) / 2
