"""DAPO loss vs hand-computed values in every clip region and mask pattern; exact whole-batch aggregation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from m3jax.rl import losses

CFG = losses.LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0)

# (advantage, ratio, expected per-token loss, expected d loss / d logp, active region)
CASES = [
    (1.0, 1.0, -1.0, -1.0, None),  # inside the trust region
    (1.0, 1.5, -1.28, 0.0, "clip_high"),  # A>0, ratio above 1+0.28: flat
    (1.0, 1.2, -1.2, -1.2, None),  # A>0, between 1+0.2 and 1+0.28: clip-higher keeps the gradient
    (1.0, 0.5, -0.5, -0.5, None),  # A>0, ratio below 1-0.2: not clipped (pessimistic side)
    (-1.0, 0.5, 0.8, 0.0, "clip_low"),  # A<0, ratio below 1-0.2: flat
    (-1.0, 1.5, 1.5, 1.5, None),  # A<0, ratio above 1+0.28: not clipped
    (-1.0, 4.0, 3.0, 0.0, "clip_dual"),  # A<0, ratio above c=3: dual clip caps the loss
    (-2.0, 2.0, 4.0, 4.0, None),  # A<0, 1.28 < ratio < c
    (0.5, 1.0, -0.5, -0.5, None),
]


@pytest.mark.parametrize("adv,ratio,want_loss,want_grad,region", CASES)
def test_per_token_loss_and_gradient_in_every_clip_region(adv, ratio, want_loss, want_grad, region):
  old = jnp.array([[-1.0]])
  logp = old + math.log(ratio)
  a = jnp.array([[adv]])
  f = lambda lp: losses.per_token_pg_loss(lp, old, a, CFG)[0].sum()
  loss, grad = jax.value_and_grad(f)(logp)
  np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
  np.testing.assert_allclose(grad[0, 0], want_grad, rtol=1e-5, atol=1e-7)
  info = losses.per_token_pg_loss(logp, old, a, CFG)[1]
  for name in ("clip_low", "clip_high", "clip_dual"):
    assert bool(info[name][0, 0]) == (name == region), name


def test_without_dual_clip_a_negative_large_ratio_is_unbounded():
  cfg = losses.LossConfig(dual_clip=None)
  lc, info = losses.per_token_pg_loss(jnp.log(jnp.array([[4.0]])), jnp.zeros((1, 1)), -jnp.ones((1, 1)), cfg)
  np.testing.assert_allclose(lc, 4.0, rtol=1e-6)
  assert not bool(info["clip_dual"][0, 0])


def _batch():
  # 3 sequences, 4 positions, ragged masks (one row with a hole, one empty row)
  ratio = np.array([[1.0, 1.5, 0.5, 1.0], [1.0, 1.0, 4.0, 0.5], [1.0, 1.0, 1.0, 1.0]], np.float32)
  mask = np.array([[0, 1, 1, 1], [0, 1, 0, 1], [0, 0, 0, 0]], np.float32)
  adv = np.array([1.0, -1.0, 2.0], np.float32)
  old = np.full((3, 4), -2.0, np.float32)
  return jnp.asarray(old + np.log(ratio)), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask)


def test_token_mean_and_seq_mean_token_mean_by_hand():
  logp, old, adv, mask = _batch()
  # row 0 (A=+1): ratios 1.5, 0.5, 1.0 -> -1.28, -0.5, -1.0 ; row 1 (A=-1): ratios 1.0, 0.5 -> 1.0, 0.8
  row0, row1 = [-1.28, -0.5, -1.0], [1.0, 0.8]
  loss, m = losses.policy_loss(logp, old, adv, mask, CFG)
  np.testing.assert_allclose(loss, (sum(row0) + sum(row1)) / 5, rtol=1e-5)
  np.testing.assert_allclose(m["clip_high"], 1 / 5, rtol=1e-6)
  np.testing.assert_allclose(m["clip_low"], 1 / 5, rtol=1e-6)
  np.testing.assert_allclose(m["clip_dual"], 0.0)  # the ratio-4 token of row 1 is masked out
  cfg = losses.LossConfig(agg_mode="seq-mean-token-mean")
  loss2, _ = losses.policy_loss(logp, old, adv, mask, cfg)
  np.testing.assert_allclose(loss2, (np.mean(row0) + np.mean(row1)) / 2, rtol=1e-5)  # empty row not counted


def test_masked_tokens_get_no_gradient():
  logp, old, adv, mask = _batch()
  g = jax.grad(lambda lp: losses.policy_loss(lp, old, adv, mask, CFG)[0])(logp)
  assert np.all(np.asarray(g)[np.asarray(mask) == 0] == 0)
  assert np.any(np.asarray(g)[np.asarray(mask) == 1] != 0)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_accumulated_micro_batches_equal_whole_batch_loss_and_gradient(mode):
  cfg = losses.LossConfig(agg_mode=mode)
  rng = np.random.default_rng(0)
  n, t = 6, 7
  logp = jnp.asarray(rng.normal(-2, 0.3, (n, t)), jnp.float32)
  old = jnp.asarray(rng.normal(-2, 0.3, (n, t)), jnp.float32)
  adv = jnp.asarray(rng.normal(size=n), jnp.float32)
  lens = np.array([6, 1, 3, 0, 5, 2])
  mask = jnp.asarray(np.arange(t)[None, :] >= t - lens[:, None], jnp.float32)
  whole = lambda lp: losses.policy_loss(lp, old, adv, mask, cfg)[0]
  denom = losses.denominator(mask, mode)

  def accumulated(lp):
    total = 0.0
    for s in (slice(0, 2), slice(2, 4), slice(4, 6)):
      total = total + losses.loss_sums(lp[s], old[s], adv[s], mask[s], cfg)["objective"] / denom
    return total

  np.testing.assert_allclose(accumulated(logp), whole(logp), rtol=1e-6)
  np.testing.assert_allclose(jax.grad(accumulated)(logp), jax.grad(whole)(logp), rtol=1e-5, atol=1e-8)
  if mode == "token-mean":  # the reference's mean of micro-batch means is a different number here
    ref = np.mean([losses.policy_loss(logp[s], old[s], adv[s], mask[s], cfg)[0]
                   for s in (slice(0, 2), slice(2, 4), slice(4, 6))])
    assert abs(ref - float(whole(logp))) > 1e-3


def test_low_var_kl_values_and_loss_term():
  logp = jnp.array([[-1.0, -1.0, -1.0]])
  ref = jnp.array([[-1.0, -1.0 + math.log(2.0), -30.0]])
  kl = losses.low_var_kl(logp, ref)
  np.testing.assert_allclose(kl[0], [0.0, 2.0 - math.log(2.0) - 1.0, 10.0], rtol=1e-5)  # last one clamped
  cfg = losses.LossConfig(kl_coef=0.5)
  mask = jnp.ones((1, 3))
  loss, m = losses.policy_loss(logp, logp, jnp.zeros((1,)), mask, cfg, ref_logp=ref)
  np.testing.assert_allclose(loss, 0.5 * float(kl.mean()), rtol=1e-5)
  np.testing.assert_allclose(m["kl"], float(kl.mean()), rtol=1e-5)


def test_entropy_metric_and_bonus():
  logp = jnp.full((1, 2), -1.0)
  ent = jnp.array([[1.0, 3.0]])
  mask = jnp.array([[1.0, 1.0]])
  loss, m = losses.policy_loss(logp, logp, jnp.zeros((1,)), mask, losses.LossConfig(entropy_coef=0.1), entropy=ent)
  np.testing.assert_allclose(m["entropy"], 2.0)
  np.testing.assert_allclose(loss, -0.2, rtol=1e-6)


def test_bad_settings_are_rejected():
  with pytest.raises(losses.LossConfigError, match="clip_low"):
    losses.LossConfig(clip_low=1.5)
  with pytest.raises(losses.LossConfigError, match="dual_clip"):
    losses.LossConfig(dual_clip=0.5)
  with pytest.raises(losses.LossConfigError, match="agg_mode"):
    losses.LossConfig(agg_mode="sum")
