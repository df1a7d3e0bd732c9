"""Chunked log-probs, the learner step (accumulation, length buckets, sharding, non-finite skip) and exact
resume."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from m3jax import checkpoint, parallel
from m3jax.models import lora
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.rl import learner as learner_lib
from m3jax.rl import logprobs

CFG = DecoderConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, qk_norm=True, tie_embeddings=True)
N, T = 8, 16


def _model(seed=0, attention_chunk=0):
  return Decoder(dataclasses.replace(CFG, attention_chunk=attention_chunk), rngs=nnx.Rngs(seed))


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  tokens = rng.integers(1, CFG.vocab_size, (N, T)).astype(np.int32)
  lengths = rng.integers(10, T + 1, N).astype(np.int32)
  lengths[0] = T
  pos = np.arange(T)[None, :]
  mask = ((pos >= 6) & (pos < lengths[:, None])).astype(np.float32)
  mask[3, 8:10] = 0.0  # a hole (a tool result between two turns)
  adv = rng.normal(size=(N, 1)).astype(np.float32) * mask
  return {"tokens": tokens, "lengths": lengths, "mask": mask, "advantages": adv}


def test_chunked_logprobs_match_full_softmax_values_and_gradients():
  model = _model()
  toks = jnp.asarray(_batch()["tokens"])
  h, _ = model.hidden(toks)
  w = model.lm_head_weight()

  @jax.jit
  def both(h, w):
    full = lambda h, w: jax.nn.log_softmax(jnp.einsum("btd,dv->btv", h, w) / 0.6)[:, :-1]
    chunked = lambda h, w: logprobs.sequence_logprobs(h, w, toks, temperature=0.6, seq_chunk=5,
                                                      vocab_chunk=64)  # both dimensions padded
    f_full = lambda h, w: jnp.take_along_axis(full(h, w), toks[:, 1:, None], -1)[..., 0]
    ref = full(h, w)
    return (chunked(h, w), (f_full(h, w), -(jnp.exp(ref) * ref).sum(-1)),
            jax.grad(lambda h, w: chunked(h, w)[0].sum(), (0, 1))(h, w),
            jax.grad(lambda h, w: f_full(h, w).sum(), (0, 1))(h, w))

  (lp, ent), (ref_lp, ref_ent), g_chunk, g_full = both(h, w)
  np.testing.assert_allclose(lp[:, 1:], ref_lp, atol=1e-5)
  np.testing.assert_allclose(ent[:, 1:], ref_ent, atol=1e-4)
  assert np.all(np.asarray(lp[:, 0]) == 0)
  for a, b in zip(g_chunk, g_full):
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_chunks_without_trained_tokens_are_skipped_but_used_values_and_gradients_are_exact():
  model = _model()
  toks = jnp.asarray(_batch()["tokens"])
  h, _ = model.hidden(toks)
  w = model.lm_head_weight()
  mask = jnp.zeros(toks.shape).at[:, 9:13].set(1.0)  # h positions 8..11 are needed: chunks [4, 8) and [12, 16) idle

  @jax.jit
  def both(h, w):
    f = lambda h, w, m: logprobs.sequence_logprobs(h, w, toks, m, seq_chunk=4, vocab_chunk=128)
    return f(h, w, mask), jax.grad(lambda h, w: (f(h, w, mask)[0] * mask).sum(), (0, 1))(h, w), \
        f(h, w, None), jax.grad(lambda h, w: (f(h, w, None)[0] * mask).sum(), (0, 1))(h, w)

  (lp, ent), g, (lp_all, ent_all), g_all = both(h, w)
  m = np.asarray(mask) > 0
  np.testing.assert_allclose(np.asarray(lp)[m], np.asarray(lp_all)[m], atol=1e-6)
  np.testing.assert_allclose(np.asarray(ent)[m], np.asarray(ent_all)[m], atol=1e-6)
  assert np.all(np.asarray(lp)[:, 5:9] == 0) and np.all(np.asarray(lp)[:, 13:] == 0)  # skipped chunks
  for a, b in zip(g, g_all):
    np.testing.assert_allclose(a, b, atol=1e-6)


def _learner(cfg, seed=0, mesh=None, lora_rank=0, lora_seed=0):
  model = lora.attach(_model(seed), lora.LoRAConfig(rank=lora_rank), seed=lora_seed)
  return learner_lib.Learner(model, cfg, mesh=mesh), model


LCFG = learner_lib.LearnerConfig(optim=learner_lib.OptimConfig(lr=1e-2, weight_decay=0.0), mini_batches=2,
                                 micro_batch=2, seq_chunk=8, vocab_chunk=128)


@pytest.fixture(scope="module")
def reference_run():
  """Two rollout batches through one unsharded learner with 2 accumulation steps per mini-batch."""
  lrn, model = _learner(LCFG)
  batch = _batch()
  batch["old_logp"], _ = lrn.logprobs(batch)
  hist = lrn.update(batch, seed=1)
  return {"batch": batch, "hist": hist, "params": jax.device_get(lrn.params), "model": model}


def test_update_writes_into_the_model_and_moves_the_ratio(reference_run):
  hist, model = reference_run["hist"], reference_run["model"]
  assert len(hist) == 2 and all(h["skipped"] == 0 for h in hist)
  assert abs(hist[0]["ratio"] - 1.0) < 1e-5 and abs(hist[1]["ratio"] - 1.0) > 1e-4  # second step is off-policy
  leaves = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert all(np.array_equal(a, b) for a, b in zip(leaves, jax.tree.leaves(reference_run["params"])))


@pytest.mark.parametrize("mesh_shape,micro,bucket,logits", [((2, 2, 2), 4, 0, 256), ((2, 1, 4), 2, 4, 256),
                                                            ((2, 2, 2), 4, 0, 4)])
def test_sharded_update_equals_unsharded_accumulation_on_8_devices(reference_run, mesh_shape, micro, bucket,
                                                                   logits):
  """data=2 × fsdp=2 × tensor=2, one 4-row micro-batch per step, or data=2 × tensor=4 with length-bucketed
  2-row micro-batches (widths 12 and 16 in the first step), vs one device, two 2-row micro-batches; the last
  case gathers the trained positions (12 of 16) before the vocabulary projection, sharded like the rows."""
  mesh = parallel.make_mesh(*mesh_shape)
  cfg = learner_lib.LearnerConfig(optim=LCFG.optim, mini_batches=2, micro_batch=micro, length_bucket=bucket,
                                  seq_chunk=8, vocab_chunk=128, logit_bucket=logits)
  lrn, _ = _learner(cfg, mesh=mesh)
  assert len(lrn.params["wq"].get_value().sharding.device_set) == 8
  hist = lrn.update(dict(reference_run["batch"]), seed=1)
  for h, r in zip(hist, reference_run["hist"]):
    np.testing.assert_allclose(h["loss"], r["loss"], rtol=1e-4, atol=1e-6)
  for a, b in zip(jax.tree.leaves(jax.device_get(lrn.params)), jax.tree.leaves(reference_run["params"])):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_non_finite_step_is_skipped_and_counted(reference_run):
  lrn, model = _learner(LCFG)
  before = jax.device_get(lrn.params)
  batch = dict(reference_run["batch"])
  batch["old_logp"] = batch["old_logp"].copy()
  batch["old_logp"][:, 7] = np.nan  # a generated position of every row: both optimizer steps are non-finite
  hist = lrn.update(batch, seed=0)
  assert [h["skipped"] for h in hist] == [1.0, 1.0] and lrn.skipped_steps == 2
  for a, b in zip(jax.tree.leaves(jax.device_get(lrn.params)), jax.tree.leaves(before)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_kill_and_resume_gives_identical_next_step(tmp_path, reference_run, lora_rank):
  """With LoRA the checkpoint holds only the adapters (and their optimizer state); the frozen base is reloaded."""
  batch = reference_run["batch"]
  lrn, _ = _learner(LCFG, lora_rank=lora_rank)
  lrn.update(dict(batch), seed=1)
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  ckpt.save(lrn.step, lrn.state(), {"data": {"next_index": 5}})
  if lora_rank:
    assert set(lrn.state()["params"]) == {"lora"}
  want = lrn.update(dict(batch), seed=2)
  del lrn  # "kill": a fresh process state from a different initialisation (of the adapters, with LoRA)
  fresh, _ = _learner(LCFG, seed=0 if lora_rank else 7, lora_rank=lora_rank, lora_seed=7)
  state, meta = checkpoint.Checkpointer(tmp_path / "ckpt").restore(fresh.state())
  fresh.restore(state)
  assert meta == {"data": {"next_index": 5}} and fresh.step == 2
  got = fresh.update(dict(batch), seed=2)
  assert [h["loss"] for h in got] == [h["loss"] for h in want]


def test_bad_batches_are_rejected():
  lrn, _ = _learner(LCFG)
  b = _batch()
  with pytest.raises(learner_lib.LearnerConfigError, match="old_logp"):
    lrn.update(b, seed=0)
  b["old_logp"] = np.zeros((N, T - 1), np.float32)
  with pytest.raises(learner_lib.LearnerConfigError, match="shape"):
    lrn.update(b, seed=0)
  with pytest.raises(learner_lib.LearnerConfigError, match="ref_model"):
    learner_lib.Learner(_model(), learner_lib.LearnerConfig(loss=learner_lib.losses.LossConfig(kl_coef=0.1)))


@pytest.mark.parametrize("loop,remat", [("unroll", True), ("scan", False)])
def test_training_forward_matches_decoder_hidden(loop, remat):
  model = _model()
  b = _batch()
  toks, lens = jnp.asarray(b["tokens"]), jnp.asarray(b["lengths"])
  ref, _ = model.hidden(toks, chunk_len=lens)
  got = jax.jit(lambda t, l: model.hidden(t, chunk_len=l, layer_loop=loop, remat=remat)[0])(toks, lens)
  np.testing.assert_allclose(got, ref, atol=1e-5)


# ------------------------------------------------------------------------------- an independent DAPO reference
DAPO_CFG = learner_lib.LearnerConfig(
    loss=learner_lib.losses.LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="token-mean"),
    optim=learner_lib.OptimConfig(lr=3e-3, b1=0.9, b2=0.99, weight_decay=0.1, grad_clip=2.0),
    temperature=0.7, epochs=2, mini_batches=2, micro_batch=2, seq_chunk=8, vocab_chunk=128)


def _dapo_batch(model, lengths=(T,) * N, prefixes=()):
  """Rows with very different trained-token counts (so the two mini-batches' denominators differ) and old
  log-probs shifted off the current policy, so the clip-low, clip-high and dual-clip regions all hold tokens
  from the first step on. Width max(lengths); a row's tokens past its length are padding (never trained).
  `prefixes`: (rows, n) pairs, the rows given the first n tokens of the first of them (an RL group's shared
  prompt and turns)."""
  rng = np.random.default_rng(5)
  t = max(lengths)
  b = {"tokens": np.random.default_rng(3).integers(1, CFG.vocab_size, (N, t)).astype(np.int32),
       "lengths": np.asarray(lengths, np.int32)}
  for rows, n in prefixes:
    b["tokens"][list(rows), :n] = b["tokens"][rows[0], :n]
  starts = np.array([2, 12, 4, 13, 6, 14, 3, 11])
  pos = np.arange(t)[None, :]
  b["mask"] = ((pos >= starts[:, None]) & (pos < b["lengths"][:, None])).astype(np.float32)
  b["advantages"] = np.where(rng.random((N, 1)) < 0.5, -1.0, 1.0).astype(np.float32) * rng.uniform(
      0.5, 1.5, (N, 1)).astype(np.float32) * b["mask"]
  logits, _ = model(jnp.asarray(b["tokens"]))
  lp = jax.nn.log_softmax(np.asarray(logits)[:, :-1] / DAPO_CFG.temperature, -1)
  cur = np.zeros((N, t), np.float32)
  cur[:, 1:] = np.take_along_axis(lp, b["tokens"][:, 1:, None], -1)[..., 0]
  b["old_logp"] = (cur + rng.normal(0, 0.6, (N, t))).astype(np.float32)
  return b


def _dapo_reference(model, batch, cfg, seed, params=None, logits_fn=None):
  """The learner's update written out plainly: logits of a full forward pass, log_softmax, the clip-higher
  surrogate with dual clip maximised over the token mean of each mini-batch, jax.grad, clip + AdamW (optax).

  Mini-batch schedule (the learner's contract): per epoch one permutation of the rows from
  np.random.default_rng(seed), cut into `mini_batches` consecutive slices, one optimizer step per slice.
  `params` / `logits_fn(params, tokens)` replace the model's parameters and forward pass (LoRA: the adapters,
  and the explicitly merged model)."""
  graphdef, base, rest = nnx.split(model, nnx.Param, ...)
  params = base if params is None else params
  logits_fn = logits_fn or (lambda p, tokens: nnx.merge(graphdef, p, rest)(tokens)[0])
  lc, oc = cfg.loss, cfg.optim

  def loss(p, tokens, mask, adv, old_logp):
    logits = logits_fn(p, tokens)  # causal: later padding cannot reach a trained position
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1] / cfg.temperature, -1), tokens[:, 1:, None],
                               -1)[..., 0]  # log p(tokens[t + 1] | tokens[:t + 1])
    m, a = mask[:, 1:], adv[:, 1:]
    ratio = jnp.exp(logp - old_logp[:, 1:])
    surrogate = jnp.minimum(ratio * a, jnp.clip(ratio, 1 - lc.clip_low, 1 + lc.clip_high) * a)
    surrogate = jnp.where(a < 0, jnp.maximum(surrogate, lc.dual_clip * a), surrogate)
    return -(surrogate * m).sum() / m.sum()

  tx = optax.chain(optax.clip_by_global_norm(oc.grad_clip),
                   optax.adamw(oc.lr, b1=oc.b1, b2=oc.b2, weight_decay=oc.weight_decay))
  opt = tx.init(params)

  @jax.jit
  def step(p, opt, mb):
    g = jax.grad(loss)(p, *mb)
    upd, opt = tx.update(g, opt, p)
    return optax.apply_updates(p, upd), opt, optax.tree.norm(g)

  rng, n = np.random.default_rng(seed), batch["tokens"].shape[0]
  size, norms = n // cfg.mini_batches, []
  for _ in range(cfg.epochs):
    perm = rng.permutation(n)
    for k in range(cfg.mini_batches):
      rows = perm[k * size:(k + 1) * size]
      params, opt, norm = step(params, opt, tuple(jnp.asarray(batch[key][rows]) for key in
                                                  ("tokens", "mask", "advantages", "old_logp")))
      norms.append(float(norm))
  return params, norms


def test_update_equals_plain_grad_of_the_dapo_loss_with_adamw():
  """Params after 4 off-policy mini-batch steps (2 epochs x 2) equal the plain reference's, to 1e-5 of each
  parameter's norm (float32 rounding amplified by Adam is ~1e-6; a wrong schedule or denominator moves ~1e-3).

  Adam is invariant to a constant gradient scale and clipping to any scale it binds on, so a wrong loss
  denominator shows only because the mini-batches' token counts differ and clipping binds on some steps only."""
  model = _model(1)
  batch = _dapo_batch(model)
  want, norms = _dapo_reference(_model(1), batch, DAPO_CFG, seed=4)
  assert 0 < sum(n > DAPO_CFG.optim.grad_clip for n in norms) < len(norms)
  lrn = learner_lib.Learner(model, DAPO_CFG)
  hist = lrn.update(dict(batch), seed=4)
  assert len(hist) == 4 and all(h["clip_low"] > 0 or h["clip_high"] > 0 for h in hist)
  assert any(h["clip_dual"] > 0 for h in hist)
  for (path, got), ref in zip(jax.tree.leaves_with_path(jax.device_get(lrn.params)), jax.tree.leaves(want)):
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{jax.tree_util.keystr(path)}: relative error {err:.2e}"


def _rel_errors(got, want):
  return {jax.tree_util.keystr(path): np.linalg.norm(a - b) / np.linalg.norm(b)
          for (path, a), b in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want))}


RAGGED = (32, 14, 20, 16, 27, 18, 24, 19)


def test_length_bucketed_update_is_the_same_objective_on_ragged_rows():
  """Sorted, per-bucket micro-batches (widths 16/24/32 instead of 32 for every row) train exactly what the
  unbucketed learner trains, which matches the plain whole-mini-batch DAPO reference: params after 4 off-policy
  steps within 10x the unbucketed learner's own float32 distance to the reference (~1e-5 of each parameter's
  norm here, through Adam; a per-micro-batch denominator moves them 6e-3 to 0.26), the same losses, and the
  same old log-probs at every trained position."""
  model = _model(1)
  batch = _dapo_batch(model, RAGGED)
  want, norms = _dapo_reference(_model(1), batch, DAPO_CFG, seed=4)
  assert 0 < sum(n > DAPO_CFG.optim.grad_clip for n in norms) < len(norms)
  bucketed = learner_lib.Learner(model, dataclasses.replace(DAPO_CFG, length_bucket=8))
  plain = learner_lib.Learner(_model(1), DAPO_CFG)
  calls = bucketed._micro_batches(batch["lengths"], np.arange(N), max(RAGGED), batch["mask"])
  assert sorted(w for _, w in calls) == [16, 24, 24, 32] and sorted(np.concatenate(
      [i.ravel() for i, _ in calls])) == list(range(N))
  _assert_trains_like_plain(bucketed, plain, batch, want, max_noise=1e-4)


def _assert_trains_like_plain(learner, plain, batch, want, max_noise):
  """`learner` gives `plain`'s log-probs and entropies at trained positions and its losses, and its params after
  `update` are within 10x of plain's own float32 distance to the reference params `want` (at most `max_noise`)."""
  m = batch["mask"] > 0
  for got, ref in zip(learner.logprobs(batch), plain.logprobs(batch)):  # log-probs, entropies
    np.testing.assert_allclose(got[m], ref[m], rtol=1e-5, atol=1e-6 * np.abs(ref[m]).max())
  hist, hist_p = learner.update(dict(batch), seed=4), plain.update(dict(batch), seed=4)
  np.testing.assert_allclose([h["loss"] for h in hist], [h["loss"] for h in hist_p], rtol=1e-5)
  got, ref = jax.device_get(learner.params), jax.device_get(plain.params)
  noise = max(_rel_errors(ref, want).values())  # the plain learner's float32 distance to the reference
  assert noise < max_noise
  for name, err in _rel_errors(got, ref).items():
    assert err < max(10 * noise, 1e-6), f"{name}: vs the plain learner, relative error {err:.2e} ({noise=:.1e})"


def test_micro_batches_of_padding_rows_are_not_run():
  """A rollout batch whose dynamic sampling kept fewer groups than its rows holds padding rows (length 1, nothing
  trained, as `rollout.build_batch` pads): the bucketed learner leaves their micro-batch out, and trains what the
  unbucketed learner, which runs every row, trains (params within 10x its float32 distance to itself run with
  another micro-batch order)."""
  model = _model(1)
  batch = _dapo_batch(model, RAGGED)
  for k in ("tokens", "mask", "advantages", "old_logp"):
    batch[k][[1, 3]] = 0
  batch["lengths"][[1, 3]] = 1
  cfg = dataclasses.replace(DAPO_CFG, mini_batches=1, epochs=1)
  bucketed = learner_lib.Learner(model, dataclasses.replace(cfg, length_bucket=8))
  calls = bucketed._micro_batches(batch["lengths"], np.arange(N), max(RAGGED), batch["mask"])
  assert len(calls) == 3 and not {1, 3} & set(np.concatenate([i.ravel() for i, _ in calls]))
  plain, strided = (learner_lib.Learner(_model(1), dataclasses.replace(cfg, micro_batch=m)) for m in (2, 4))
  hist_b, hist_p = bucketed.update(dict(batch), seed=4), plain.update(dict(batch), seed=4)
  strided.update(dict(batch), seed=4)
  np.testing.assert_allclose([h["loss"] for h in hist_b], [h["loss"] for h in hist_p], rtol=1e-5)
  got, ref = jax.device_get(bucketed.params), jax.device_get(plain.params)
  noise = max(_rel_errors(jax.device_get(strided.params), ref).values())
  assert 0 < noise < 1e-4
  for name, err in _rel_errors(got, ref).items():
    assert err < 10 * noise, f"{name}: padding rows left out vs run, relative error {err:.2e} ({noise=:.1e})"
  assert len(bucketed._micro_batches(batch["lengths"], np.arange(N), max(RAGGED), 0 * batch["mask"])) == 1


@pytest.mark.parametrize("loop,chunk", [("unroll", 0), ("scan", 4)])
def test_shared_prefix_calls_train_the_same_objective(loop, chunk):
  """Rows sorted by their tokens, in calls of 2 whose common prefix runs once and is broadcast (groups sharing 13
  and 12 tokens, two rows 22; trained positions inside the shared prefixes too) train what the plain learner
  trains: params after 4 off-policy steps within 10x the plain learner's own float32 distance to the reference,
  the same losses, and the same log-probs at every trained position, while computing fewer positions. With
  `attention_chunk` the rows' remainders attend to the prefix in query blocks (linear memory)."""
  model = _model(1, chunk)
  batch = _dapo_batch(model, RAGGED, prefixes=(((0, 2, 4, 6), 13), ((1, 3, 5, 7), 12), ((0, 6), 22)))
  want, _ = _dapo_reference(_model(1, chunk), batch, DAPO_CFG, seed=4)
  shared = learner_lib.Learner(model, dataclasses.replace(DAPO_CFG, length_bucket=4, share_prefix=2,
                                                          layer_loop=loop))
  plain = learner_lib.Learner(_model(1, chunk), DAPO_CFG)
  calls = shared._calls(batch, np.arange(N))
  assert sorted(np.concatenate([i.ravel() for i, _, _ in calls])) == list(range(N))
  assert sorted(p for _, _, p in calls) == [12, 12, 12, 20]  # rows 0+6 (22 -> 20), 2+4 (13), 1+3 and 5+7 (12)
  assert sum(p + 2 * (w - p) for _, w, p in calls) < sum(RAGGED)
  # plain's distance to the reference is 2e-4 on this batch, through Adam; a wrong denominator moves >= 6e-3
  _assert_trains_like_plain(shared, plain, batch, want, max_noise=1e-3)


def test_share_prefix_needs_whole_calls_and_a_length_bucket():
  with pytest.raises(learner_lib.LearnerConfigError, match="share_prefix needs length_bucket"):
    dataclasses.replace(DAPO_CFG, share_prefix=2)
  lrn = learner_lib.Learner(_model(1), dataclasses.replace(DAPO_CFG, length_bucket=4, share_prefix=3))
  with pytest.raises(learner_lib.LearnerConfigError, match="calls of share_prefix=3"):
    lrn._calls(_dapo_batch(_model(1), RAGGED), np.arange(4))


def test_a_trained_position_past_a_rows_length_is_rejected():
  lrn, _ = _learner(dataclasses.replace(LCFG, length_bucket=4))
  b = _batch()
  b["old_logp"] = np.zeros((N, T), np.float32)
  b["mask"][1, b["lengths"][1]:] = 1.0
  with pytest.raises(learner_lib.LearnerConfigError, match="past a row's length"):
    lrn.update(b, seed=0)


def test_bfloat16_compute_stays_close_to_float32():
  """compute_dtype="bfloat16": params and optimizer state stay float32 and the caller's model keeps its policy;
  the log-probs of trained tokens differ from float32 compute (the setting is not ignored) by at most 2·2⁻⁸ of
  their spread (bfloat16 matmul inputs; a bfloat16 log-softmax rounds values near -6 by up to 2⁻⁶); after 4
  DAPO steps every parameter is within 25% of its float32 update of the float32 run's (measured 3-10%)."""
  model = _model(1)
  batch = _dapo_batch(model, RAGGED)
  f32 = learner_lib.Learner(_model(1), DAPO_CFG)
  bf16 = learner_lib.Learner(model, dataclasses.replace(DAPO_CFG, compute_dtype="bfloat16", length_bucket=8))
  m = batch["mask"] > 0
  want, got = f32.logprobs(batch)[0][m], bf16.logprobs(batch)[0][m]
  err = np.abs(got - want).max()
  assert 1e-4 * np.ptp(want) < err < 2 * 2.0**-8 * np.ptp(want), (err, np.ptp(want))
  init = jax.device_get(f32.params)
  f32.update(dict(batch), seed=4)
  bf16.update(dict(batch), seed=4)
  assert model.cfg.compute_dtype == "float32"
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves((bf16.params, bf16.opt_state)) if
             jnp.issubdtype(x.dtype, jnp.floating))
  for (path, ref), x, x0 in zip(jax.tree.leaves_with_path(jax.device_get(f32.params)),
                                jax.tree.leaves(jax.device_get(bf16.params)), jax.tree.leaves(init)):
    rel = np.linalg.norm(x - ref) / np.linalg.norm(ref - x0)
    assert rel < 0.25, f"{jax.tree_util.keystr(path)}: {rel:.3f} of the float32 update"
  with pytest.raises(learner_lib.LearnerConfigError, match="compute_dtype"):
    learner_lib.LearnerConfig(compute_dtype="float16")
