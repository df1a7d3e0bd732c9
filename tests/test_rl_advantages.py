"""GRPO and TAURA advantages, reward shaping and dynamic sampling vs hand-computed cases."""

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest

from m3jax.rl import advantages, dynamic_sampling as ds, rewards


def test_grpo_group_normalisation_by_hand():
  r = np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0], np.float32)  # groups [1, 0, 1] and [1, 0, 0]
  a = np.asarray(advantages.grpo_advantages(r, 3))
  s = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)  # unbiased std of both groups
  np.testing.assert_allclose(a[:3], np.array([1 / 3, -2 / 3, 1 / 3]) / (s + 1e-6), rtol=1e-5)
  np.testing.assert_allclose(a[3:], np.array([2 / 3, -1 / 3, -1 / 3]) / (s + 1e-6), rtol=1e-5)


def test_grpo_pair_gives_plus_minus_0_7071_and_singletons_get_zero():
  a = np.asarray(advantages.grpo_advantages(np.array([1.0, 0.0]), 2))
  np.testing.assert_allclose(a, [0.70710, -0.70710], rtol=1e-4)
  for norm in (True, False):  # a group of one: reward minus its own mean, whatever the reward
    np.testing.assert_array_equal(advantages.grpo_advantages(np.array([0.3, -1.0, 1.0]), 1, norm_by_std=norm), 0.0)
  np.testing.assert_allclose(advantages.grpo_advantages(np.array([1.0, 0.0]), 2, norm_by_std=False), [0.5, -0.5])
  with pytest.raises(advantages.AdvantageError, match="groups of 3"):
    advantages.grpo_advantages(np.zeros(4), 3)


def test_token_advantages_broadcast_on_mask():
  mask = jnp.array([[0, 1, 1, 0], [0, 0, 1, 1]], jnp.float32)
  out = advantages.token_advantages(jnp.array([2.0, -1.0]), mask)
  np.testing.assert_allclose(out, [[0, 2, 2, 0], [0, 0, -1, -1]])


def test_taura_rescales_each_turn_by_its_normalised_mean_entropy():
  # one trajectory: turn 0 = tokens 1,2 (entropy 1, 3 -> mean 2); prompt token 3; turn 1 = tokens 4,5 (mean 1)
  turn = jnp.array([[-1, 0, 0, -1, 1, 1]])
  mask = (turn >= 0).astype(jnp.float32)
  ent = jnp.array([[9.0, 1.0, 3.0, 9.0, 0.5, 1.5]])
  out = advantages.token_advantages(jnp.array([0.6]), mask, entropy=ent, turn_ids=turn, num_turns=5)
  # turn means 2 and 1, trajectory mean 1.5 -> weights 4/3 and 2/3 (prompt tokens ignored)
  np.testing.assert_allclose(out, [[0, 0.8, 0.8, 0, 0.4, 0.4]], rtol=1e-5)
  capped = advantages.token_advantages(jnp.array([0.6]), mask, entropy=ent, turn_ids=turn, num_turns=5,
                                       max_weight=1.0)
  np.testing.assert_allclose(capped, [[0, 0.6, 0.6, 0, 0.4, 0.4]], rtol=1e-5)
  with pytest.raises(advantages.AdvantageError, match="turn_ids"):
    advantages.token_advantages(jnp.array([0.6]), mask, entropy=ent)


def test_reward_components_by_hand():
  eps = [rewards.EpisodeStats("<character_1> did it <character_2>", 1, 2, 1, 100),
         rewards.EpisodeStats(None, 0, 4, 0, 300)]
  cfg = rewards.RewardConfig(overlong_max_tokens=250, overlong_buffer=100)
  c = rewards.reward_components([1.0, 0.0], eps, cfg)
  np.testing.assert_allclose(c["character"], [-0.4, 0.0])
  np.testing.assert_allclose(c["format"], [-0.3, 0.0])
  np.testing.assert_allclose(c["search"], [0.2, 0.4])
  np.testing.assert_allclose(c["empty_search"], [-0.15, 0.0])
  np.testing.assert_allclose(c["overlong"], [0.0, -1.0])
  np.testing.assert_allclose(c["total"], [1.0 - 0.4 - 0.3 + 0.2 - 0.15, 0.4 - 1.0])
  off = rewards.reward_components([1.0, 0.0], eps, rewards.RewardConfig(shaping=False))
  np.testing.assert_allclose(off["search"], [0, 0])
  np.testing.assert_allclose(rewards.overlong_penalty(np.array([150, 200, 250, 251]), 250, 100, 1.0),
                             [0.0, -0.5, -1.0, -1.0])
  with pytest.raises(rewards.RewardError, match="outcomes"):
    rewards.reward_components([1.0], eps, cfg)


def test_a_wrong_guess_scores_below_a_decline_with_the_wrong_answer_penalty():
  from m3jax.eval.judges import is_decline

  answers = ["Tea.", "Coffee.", "The memory does not say.", None]  # right, wrong, declined, never answered
  eps = [rewards.EpisodeStats(a, 0, 0, 0, 10, declined=is_decline(a)) for a in answers]
  assert [e.declined for e in eps] == [False, False, True, False]
  cfg = rewards.RewardConfig(shaping=False, wrong_answer_penalty=-0.5)
  c = rewards.reward_components([1.0, 0.0, 0.0, 0.0], eps, cfg)
  np.testing.assert_allclose(c["wrong_answer"], [0.0, -0.5, 0.0, 0.0])
  np.testing.assert_allclose(c["total"], [1.0, -0.5, 0.0, 0.0])
  assert not rewards.reward_components([1.0, 0.0, 0.0, 0.0], eps, rewards.RewardConfig())["wrong_answer"].any()
  with pytest.raises(rewards.RewardError, match="wrong_answer_penalty"):
    rewards.RewardConfig(wrong_answer_penalty=0.5)


def _groups(outcomes_per_group, tag):
  return [ds.Group(payload=(tag, i), outcomes=np.array(o, np.float32)) for i, o in enumerate(outcomes_per_group)]


def test_dynamic_sampling_refills_until_full_and_drops_surplus():
  rounds = iter([_groups([[1, 1], [0, 1], [0, 0]], "r0"), _groups([[1, 0], [1, 1], [0, 1]], "r1")])
  batcher = ds.DynamicBatcher(ds.DynamicSamplingConfig(max_rounds=5), batch_groups=2)
  batch, stats = batcher.fill(lambda n: next(rounds))
  assert [g.payload for g in batch] == [("r0", 1), ("r1", 0)]
  assert stats["ds/rounds"] == 2 and stats["ds/generated_groups"] == 6 and stats["ds/kept_groups"] == 3
  assert stats["ds/dropped_groups"] == 1 and stats["ds/hit_cap"] == 0 and stats["ds/stale_groups"] == 0
  # no stale carry-over: the surplus ("r1", 2) never appears in the next batch
  nxt = iter([_groups([[0, 1], [1, 0]], "r2")])
  batch2, stats2 = batcher.fill(lambda n: next(nxt))
  assert [g.payload for g in batch2] == [("r2", 0), ("r2", 1)] and stats2["ds/stale_groups"] == 0


def test_dynamic_sampling_cap_returns_partial_batch():
  batcher = ds.DynamicBatcher(ds.DynamicSamplingConfig(max_rounds=3), batch_groups=4)
  calls = []
  batch, stats = batcher.fill(lambda n: calls.append(1) or _groups([[1, 1], [0, 1]], "r"))
  assert len(calls) == 3 and len(batch) == 3 and stats["ds/hit_cap"] == 1


def test_dynamic_sampling_carry_over_when_configured_and_disabled_filter():
  batcher = ds.DynamicBatcher(ds.DynamicSamplingConfig(carry_over=True), batch_groups=1)
  batch, _ = batcher.fill(lambda n: _groups([[0, 1], [1, 0]], "a"))
  assert batch[0].payload == ("a", 0)
  batch, stats = batcher.fill(lambda n: pytest.fail("buffer should satisfy the batch"))
  assert batch[0].payload == ("a", 1) and stats["ds/stale_groups"] == 1 and stats["ds/rounds"] == 0
  off = ds.DynamicBatcher(ds.DynamicSamplingConfig(enabled=False), batch_groups=2)
  batch, _ = off.fill(lambda n: _groups([[1, 1], [0, 0]], "b"))
  assert len(batch) == 2
  assert ds.is_informative(np.array([1.0])) and not ds.is_informative(np.array([0.0, 0.0]))
  with pytest.raises(ds.DynamicSamplingError):
    ds.DynamicSamplingConfig(max_rounds=0)
  with pytest.raises(ds.DynamicSamplingError, match="oversample"):
    ds.DynamicSamplingConfig(oversample=0.5)


def test_pass_rates_skip_saturated_questions_for_a_while_and_rounds_are_sized_by_the_yield():
  cfg = ds.DynamicSamplingConfig(max_rounds=3, skip_after=4, skip_for=2, oversample=2.0)
  batcher = ds.DynamicBatcher(cfg, batch_groups=4, multiple=2)
  assert batcher.round_size(4) == 4  # no yield known yet: one batch

  def round_of(outcomes):
    return lambda n: [ds.Group(payload=q, outcomes=np.array(o, np.float32), question_id=q)
                      for q, o in list(outcomes.items())[:n]]

  # q_right and q_wrong are saturated after one group of 4; q_mixed is not; q_short has too few outcomes
  outcomes = {"q_right": [1, 1, 1, 1], "q_wrong": [0, 0, 0, 0], "q_mixed": [1, 0, 1, 1], "q_short": [1, 1]}
  batch, stats = batcher.fill(round_of(outcomes), step=1)
  assert stats["ds/rounds"] == 3 and stats["ds/yield"] == 0.25 and batcher.recent_yield == 0.25
  assert [batcher.skips(q, 1) for q in outcomes] == [True, True, False, True]  # q_short: 2 + 2 + 2 ones
  assert batcher.skips("q_right", 2) and not batcher.skips("q_right", 3)  # skip_for=2 steps, then drawn again
  assert not batcher.skips("never_seen", 1)
  # a mixed group later un-saturates a question
  batcher.rates.record("q_right", [0], step=2)
  assert not batcher.skips("q_right", 2)
  # rounds: missing / yield, at least the missing count, at most oversample x batch, a multiple of `multiple`
  assert batcher.round_size(1) == 4 and batcher.round_size(4) == 8
  batcher.recent_yield = 0.9
  assert batcher.round_size(3) == 4 and batcher.round_size(1) == 2
  # the state round-trips (a resumed run draws and sizes its rounds as the uninterrupted one)
  other = ds.DynamicBatcher(cfg, batch_groups=4, multiple=2)
  other.restore(json.loads(json.dumps(batcher.state())))
  assert other.state() == batcher.state()
  # off (skip_after=0, oversample=1): nothing skipped and every round draws one batch, as before
  plain = ds.DynamicBatcher(ds.DynamicSamplingConfig(max_rounds=1), batch_groups=4)
  plain.fill(round_of(outcomes), step=1)
  assert not plain.skips("q_right", 1) and plain.round_size(1) == 4


def test_reward_judge_is_named_and_defaults_to_strict():
  """The outcome's judge is `RewardConfig.judge` (strict unless set); RLConfig.judge, when set, overrides it."""
  from m3jax.rl.program import RLConfig
  assert rewards.RewardConfig().judge == "strict" and RLConfig().outcome_judge == "strict"
  assert RLConfig(reward=rewards.RewardConfig(judge="contains")).outcome_judge == "contains"
  assert RLConfig(judge="llm").outcome_judge == "llm"
  with pytest.raises(ValueError, match="fuzzy"):
    RLConfig(reward=rewards.RewardConfig(judge="fuzzy"))
