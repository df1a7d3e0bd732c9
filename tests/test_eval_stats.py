"""Intervals of evaluation numbers on constructed cases whose answer is known."""

import numpy as np
import pytest

from m3jax.eval.stats import accuracy_interval, paired_bootstrap, rate_bootstrap, wilson_interval


def test_wilson_interval_known_values():
  assert wilson_interval(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
  assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)  # not collapsed to 0 at 0/n
  assert wilson_interval(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
  acc, lo, hi = accuracy_interval([True] * 72 + [False] * 28)
  assert acc == 0.72 and lo < 0.72 < hi and hi - lo == pytest.approx(0.175, abs=0.01)
  with pytest.raises(ValueError):
    wilson_interval(3, 0)


def test_paired_bootstrap_identical_answerers_differ_by_exactly_zero():
  a = np.random.default_rng(1).random(300) < 0.6
  assert paired_bootstrap(a, a) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_opposite_answerers_differ_by_exactly_one():
  right, wrong = np.ones(120, bool), np.zeros(120, bool)  # a right on every question where b is wrong
  assert paired_bootstrap(right, wrong) == (1.0, 1.0, 1.0)
  assert paired_bootstrap(wrong, right) == (-1.0, -1.0, -1.0)


def test_paired_bootstrap_matches_the_normal_interval_and_is_deterministic():
  """a right everywhere, b right on half the questions: the per-question difference is 0 or 1 with mean 0.5, so
  the 95% interval is 0.5 ± 1.96 · 0.5 / sqrt(n)."""
  n = 400
  a, b = np.ones(n, bool), np.arange(n) % 2 == 0
  diff, lo, hi = paired_bootstrap(a, b, resamples=20_000, seed=3)
  half = 1.96 * 0.5 / np.sqrt(n)
  assert diff == 0.5 and lo == pytest.approx(0.5 - half, abs=0.01) and hi == pytest.approx(0.5 + half, abs=0.01)
  assert paired_bootstrap(a, b, resamples=20_000, seed=3) == (diff, lo, hi)
  assert paired_bootstrap(a, b, resamples=20_000, seed=4) != (diff, lo, hi)
  # pairing matters: the same accuracies with the disagreements concentrated give a narrower interval
  c = np.arange(n) < 220
  d = np.arange(n) < 200
  _, lo2, hi2 = paired_bootstrap(c, d, seed=3)
  assert lo2 > 0 and hi2 - lo2 < 0.06
  with pytest.raises(ValueError):
    paired_bootstrap(a, b[:10])


def test_rate_bootstrap_is_the_corpus_rate_with_a_known_interval():
  """Equal-size items, each with 0 or 2 errors in 10 words: the corpus rate is 0.1 and its resampling interval
  is the mean's, 0.1 ± 1.96 · 0.1 / sqrt(n) (the per-item rate is 0 or 0.2, standard deviation 0.1)."""
  n = 400
  errors, sizes = np.where(np.arange(n) % 2 == 0, 2.0, 0.0), np.full(n, 10.0)
  rate, lo, hi = rate_bootstrap(errors, sizes, resamples=20_000, seed=3)
  half = 1.96 * 0.1 / np.sqrt(n)
  assert rate == pytest.approx(0.1) and lo == pytest.approx(0.1 - half, abs=0.002) and hi == pytest.approx(
      0.1 + half, abs=0.002)
  # weighted: a long utterance's errors count by its words, not as one item (edits over all words)
  assert rate_bootstrap([1, 9], [10, 90])[0] == pytest.approx(0.1)
  # paired: the same system against itself differs by exactly zero; one extra error per item by 1/size exactly
  assert rate_bootstrap(errors, sizes, other=errors) == (0.0, 0.0, 0.0)
  d, lo, hi = rate_bootstrap(errors + 1, sizes, other=errors)
  assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
  with pytest.raises(ValueError):
    rate_bootstrap(errors, sizes[:10])
