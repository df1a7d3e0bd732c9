"""Only trained positions go through the vocabulary projection (`LearnerConfig.logit_bucket`): the same
log-probs and the same DAPO update as the dense path."""

import dataclasses

import jax
import numpy as np

from m3jax.rl import learner as learner_lib
from m3jax.rl import logprobs
from test_rl_learner import DAPO_CFG, N, RAGGED, _dapo_batch, _dapo_reference, _model, _rel_errors


def _holed_batch(model):
  """Ragged rows with a tool result (untrained) inside every row's turn, so a row trains 9-18 of 14-32 tokens."""
  b = _dapo_batch(model, RAGGED)
  b["mask"][:, 8:20] = 0.0
  b["advantages"] = b["advantages"] * b["mask"]
  return b


def test_trained_positions_list_the_mask_in_order_and_pad():
  mask = np.zeros((2, 12), np.float32)
  mask[0, [2, 3, 7]] = 1
  mask[1, 5:10] = 1
  pos = logprobs.trained_positions(mask, 4)
  np.testing.assert_array_equal(pos, [[2, 3, 7, -1, -1, -1, -1, -1], [5, 6, 7, 8, 9, -1, -1, -1]])
  assert logprobs.trained_positions(np.ones((2, 8)), 4) is None  # nothing to save


def test_gathered_logits_give_the_dense_update():
  """Params after 4 off-policy steps with gathered logits (bucket 4, widths cut to 20-24 of 32; and with length
  buckets) within 10x the dense learner's own float32 distance to the plain reference, which is measured here;
  log-probs and entropies at trained positions equal to 1e-5."""
  model = _model(1)
  batch = _holed_batch(model)
  want, _ = _dapo_reference(_model(1), batch, DAPO_CFG, seed=4)
  dense = learner_lib.Learner(_model(1), dataclasses.replace(DAPO_CFG, logit_bucket=0))
  gathered = learner_lib.Learner(model, dataclasses.replace(DAPO_CFG, logit_bucket=4))
  both = learner_lib.Learner(_model(1), dataclasses.replace(DAPO_CFG, logit_bucket=4, length_bucket=8))
  idx, width = gathered._micro_batches(batch["lengths"], np.arange(N), max(RAGGED))[0]
  assert gathered._slice(batch, idx, width)["positions"].shape[-1] < width  # the gathered path is taken
  m = batch["mask"] > 0
  ref = dense.logprobs(batch)
  for lrn in (gathered, both):
    for got, r in zip(lrn.logprobs(batch), ref):
      np.testing.assert_allclose(got[m], r[m], rtol=1e-5, atol=1e-6 * np.abs(r[m]).max())
  hist_d = dense.update(dict(batch), seed=4)
  noise = max(_rel_errors(jax.device_get(dense.params), want).values())
  assert noise < 1e-4
  for lrn in (gathered, both):
    hist = lrn.update(dict(batch), seed=4)
    np.testing.assert_allclose([h["loss"] for h in hist], [h["loss"] for h in hist_d], rtol=1e-5)
    for name, err in _rel_errors(jax.device_get(lrn.params), jax.device_get(dense.params)).items():
      assert err < max(10 * noise, 1e-6), f"{name}: gathered vs dense, relative error {err:.2e} ({noise=:.1e})"


def test_the_rollouts_log_probs_are_the_learners_old_policy_to_float32():
  """`RLConfig.recompute_old_logp=False` (the shipped recipe) trains against the sampler's log-probs: the
  tempered full softmax (top-k/top-p only choose the token), decoded with the adapters merged into the weights
  through a KV cache. They equal the learner's recomputation (adapters applied, one full forward) at every
  sampled token as closely as the merged and unmerged learner forwards equal each other (float32 rounding),
  so recomputing them before an on-policy update buys nothing."""
  from m3jax.engine.sampling import Sampler, SamplingConfig
  from m3jax.models import lora

  model = lora.attach(_model(2), lora.LoRAConfig(rank=4), seed=1)
  for name in ("wq_b", "w_up_b", "w_down_b"):  # nonzero adapters, so merging changes the weights
    leaf = getattr(model.lora, name)
    leaf[...] = 0.05 * np.random.default_rng(0).normal(size=leaf[...].shape).astype(np.float32)
  cfg = SamplingConfig(max_new_tokens=12, temperature=0.6, top_p=0.95, top_k=20, seed=3)
  prompts = [list(range(3, 3 + n)) for n in (5, 9, 7, 11)]
  out = Sampler(lora.merged(model), cfg).generate(prompts)
  t = max(len(p) + len(o) for p, o in zip(prompts, out.tokens))
  batch = {"tokens": np.zeros((4, t), np.int32), "lengths": np.zeros((4,), np.int32),
           "mask": np.zeros((4, t), np.float32), "old_logp": np.zeros((4, t), np.float32)}
  for i, (p, o, lp) in enumerate(zip(prompts, out.tokens, out.logprobs)):
    n = len(p) + len(o)
    batch["tokens"][i, :n], batch["lengths"][i] = p + o, n
    batch["mask"][i, len(p):n], batch["old_logp"][i, len(p):n] = 1.0, lp
  lcfg = dataclasses.replace(DAPO_CFG, temperature=0.6, micro_batch=0, mini_batches=1)
  adapters = learner_lib.Learner(model, lcfg).logprobs(batch)[0]
  merged = learner_lib.Learner(lora.merged(model), lcfg).logprobs(batch)[0]
  m = batch["mask"] > 0
  rounding = np.abs(adapters[m] - merged[m]).max()
  err = np.abs(batch["old_logp"][m] - adapters[m]).max()
  print(f"rollout vs learner log-probs: max |diff| {err:.2e}; merged vs adapters {rounding:.2e}")
  assert err < max(10 * rounding, 1e-5), (err, rounding)
