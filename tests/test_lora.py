"""LoRA adapters: zero adapters are the base model bitwise, a LoRA learner step is the full DAPO step restricted
to the adapters of the explicitly merged model, adapter files load exactly or refuse, and config values are validated."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import test_rl_learner as rl_tests
from m3jax import checkpoint
from m3jax.models import lora
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.rl import learner as learner_lib

# biases on every projection, so the adapter is added to the biased output
CFG = DecoderConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, qkv_bias=True, o_bias=True, mlp_bias=True)
TOKENS = jnp.asarray(np.random.default_rng(0).integers(1, 300, (2, 9)), jnp.int32)


def _randomise_b(model, seed=1):
  """Nonzero B (a trained adapter): the model's logits move."""
  state = nnx.state(model, lora.LoRAParam)
  pure = nnx.to_pure_dict(state)
  for i, name in enumerate(sorted(k for k in pure["lora"] if k.endswith("_b"))):
    b = pure["lora"][name]
    pure["lora"][name] = 0.1 * jax.random.normal(jax.random.key(seed * 100 + i), b.shape, b.dtype)
  nnx.replace_by_pure_dict(state, pure)
  nnx.update(model, state)
  return model


def _merge_by_hand(w, a, b, scale):
  """W + scale·A·B per layer, with A [L, *in, r] and B [L, r, *out] flattened to matrices."""
  ab = jnp.einsum("lir,lro->lio", a.reshape(a.shape[0], -1, a.shape[-1]), b.reshape(b.shape[0], b.shape[1], -1))
  return w + scale * ab.reshape(w.shape)


def test_zero_adapters_give_the_base_logits_bitwise_and_the_base_decode():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  base = jax.jit(lambda m, t: m(t)[0])(model, TOKENS)
  prompt = [[5, 6, 7], [8, 9]]
  greedy = SamplingConfig(max_new_tokens=6, greedy=True)
  base_out = Sampler(model, greedy).generate(prompt)
  lora.attach(model, lora.LoRAConfig(rank=4, alpha=8.0))
  np.testing.assert_array_equal(jax.jit(lambda m, t: m(t)[0])(model, TOKENS), base)
  out = Sampler(model, greedy).generate(prompt)
  assert out.tokens == base_out.tokens
  for a, b in zip(out.logprobs, base_out.logprobs):  # the sampler's log-softmax of the adapted graph: XLA at -O0
    np.testing.assert_array_max_ulp(a, b, maxulp=1)   # (the suite's compiles) rounds one of them an ulp apart
  assert not np.allclose(_randomise_b(model)(TOKENS)[0], base, atol=1e-3)


def test_zero_adapters_with_qk_norm_and_biases_match_the_base_to_float_rounding():
  """With q/k norms XLA:CPU fuses the k path differently once it is adapted (see
  `lora.add_delta`): equal to a few float32 ulps of the logits' scale, not bitwise."""
  cfg = dataclasses.replace(CFG, qk_norm=True)
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  base = jax.jit(lambda m, t: m(t)[0])(model, TOKENS)
  got = jax.jit(lambda m, t: m(t)[0])(lora.attach(model, lora.LoRAConfig(rank=4)), TOKENS)
  assert np.abs(got - base).max() <= 8 * np.finfo(np.float32).eps * np.abs(base).max()


def test_adapted_projection_equals_the_merged_weights_and_merged_decoding():
  """W + (alpha/r)·A·B written out by hand equals the adapted forward, and `lora.merged` decodes alike."""
  model = _randomise_b(lora.attach(Decoder(CFG, rngs=nnx.Rngs(0)), lora.LoRAConfig(rank=4, alpha=8.0)))
  hand = Decoder(CFG, rngs=nnx.Rngs(0))
  for name in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"):
    w = getattr(hand, name)
    w[...] = _merge_by_hand(w[...], getattr(model.lora, f"{name}_a")[...], getattr(model.lora, f"{name}_b")[...], 2.0)
  np.testing.assert_allclose(model(TOKENS)[0], hand(TOKENS)[0], atol=1e-5)
  greedy = SamplingConfig(max_new_tokens=6, greedy=True)
  got, want = Sampler(model, greedy).generate([[5, 6, 7]]), Sampler(lora.merged(model), greedy).generate([[5, 6, 7]])
  assert got.tokens == want.tokens
  np.testing.assert_allclose(got.logprobs[0], want.logprobs[0], atol=1e-5)


def _merged_logits_fn(base_model, scale):
  """Logits of the base model with W + scale·A·B for every adapted weight, from the adapter pytree."""
  graphdef, base, rest = nnx.split(base_model, nnx.Param, ...)

  def logits(adapters, tokens):
    pure = nnx.to_pure_dict(base)
    for key in [k[:-2] for k in adapters["lora"] if k.endswith("_a")]:
      pure[key] = _merge_by_hand(pure[key], adapters["lora"][f"{key}_a"], adapters["lora"][f"{key}_b"], scale)
    params = nnx.clone(base)
    nnx.replace_by_pure_dict(params, pure)
    return nnx.merge(graphdef, params, rest)(tokens)[0]

  return logits


def test_lora_step_equals_the_full_dapo_step_restricted_to_the_adapters_of_the_merged_model():
  """4 off-policy DAPO steps: the learner's adapters equal plain jax.grad + AdamW on (A, B) through the
  explicitly merged model W + (alpha/r)·A·B, the base weights do not move, and AdamW holds adapter state only."""
  cfg = lora.LoRAConfig(rank=4, alpha=8.0, targets=("q", "v", "o", "down"))
  model = lora.attach(rl_tests._model(1), cfg, seed=3)
  base_before = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Not(lora.LoRAParam))))
  adapters = nnx.to_pure_dict(nnx.state(model, lora.LoRAParam))
  batch = rl_tests._dapo_batch(model)
  want, _ = rl_tests._dapo_reference(rl_tests._model(1), batch, rl_tests.DAPO_CFG, seed=4, params=adapters,
                                     logits_fn=_merged_logits_fn(rl_tests._model(1), cfg.scale))
  lrn = learner_lib.Learner(model, rl_tests.DAPO_CFG)
  lrn.update(dict(batch), seed=4)
  got = nnx.to_pure_dict(jax.device_get(lrn.params))
  assert jax.tree.structure(got) == jax.tree.structure(want)
  for (path, g), ref in zip(jax.tree.leaves_with_path(got), jax.tree.leaves(want)):
    err = np.linalg.norm(g - ref) / np.linalg.norm(ref)
    assert err < 1e-5, f"{jax.tree_util.keystr(path)}: relative error {err:.2e}"
  assert not np.array_equal(got["lora"]["wq_b"], adapters["lora"]["wq_b"])  # the adapters did train
  base_after = jax.device_get(nnx.to_pure_dict(nnx.state(model, nnx.Not(lora.LoRAParam))))
  jax.tree.map(np.testing.assert_array_equal, base_after, base_before)
  n_adapter = sum(x.size for x in jax.tree.leaves(got))
  assert sum(x.size for x in jax.tree.leaves(lrn.opt_state)) < 3 * n_adapter + 16  # mu, nu, counters


def test_the_frozen_base_is_the_kl_reference_policy():
  loss = learner_lib.losses.LossConfig(kl_coef=0.1)
  model = _randomise_b(lora.attach(rl_tests._model(1), lora.LoRAConfig(rank=4)))
  lrn = learner_lib.Learner(model, learner_lib.LearnerConfig(loss=loss, seq_chunk=8, vocab_chunk=128))
  batch = rl_tests._batch()
  plain = learner_lib.Learner(rl_tests._model(1), learner_lib.LearnerConfig(seq_chunk=8, vocab_chunk=128))
  np.testing.assert_array_equal(lrn.logprobs(batch, reference=True)[0], plain.logprobs(batch)[0])
  assert not np.allclose(lrn.logprobs(batch)[0], plain.logprobs(batch)[0], atol=1e-4)
  with pytest.raises(learner_lib.LearnerConfigError, match="reference"):
    learner_lib.Learner(model, learner_lib.LearnerConfig(loss=loss), ref_model=rl_tests._model(1))


SMOLLM2 = DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                        num_kv_heads=3, head_dim=64, tie_embeddings=True)


def test_adapters_are_sized_like_their_weights_and_ship_in_float16(tmp_path):
  # SmolLM2-135M-shaped, rank 8 on all seven projections: the base stays abstract (never allocated)
  smol = lora.attach(nnx.eval_shape(lambda: Decoder(SMOLLM2, rngs=nnx.Rngs(0))), lora.LoRAConfig(rank=8))
  adapter_bytes = sum(x.size * 4 for x in jax.tree.leaves(nnx.state(smol, lora.LoRAParam)))
  assert adapter_bytes == 30 * 8 * 4 * (576 * 9 + 192 * 2 + 1536 * 3)  # A and B of q k v o gate up down: 9.8 MB

  base = Decoder(CFG, rngs=nnx.Rngs(0))
  trained = _randomise_b(lora.attach(Decoder(CFG, rngs=nnx.Rngs(0)), lora.LoRAConfig(rank=4)))
  full = lora.export_adapter_file(tmp_path / "f32.npz", trained, "controller")
  half = lora.export_adapter_file(tmp_path / "f16.npz", trained, "controller", dtype="float16")
  assert half.stat().st_size < 0.6 * full.stat().st_size
  exact = lora.load_adapter_file(full, Decoder(CFG, rngs=nnx.Rngs(0)), "controller")[0](TOKENS)[0]
  rounded = lora.load_adapter_file(half, Decoder(CFG, rngs=nnx.Rngs(0)), "controller")[0](TOKENS)[0]
  np.testing.assert_array_equal(exact, trained(TOKENS)[0])
  # float16 keeps ~11 bits: the adapters' effect on the logits moves by well under 1% of itself
  effect = float(jnp.max(jnp.abs(trained(TOKENS)[0] - base(TOKENS)[0])))
  assert 0 < float(jnp.max(jnp.abs(rounded - exact))) < 0.01 * effect
  with pytest.raises(ValueError, match="dtype 'bfloat16'"):
    lora.export_adapter_file(tmp_path / "x.npz", trained, "controller", dtype="bfloat16")


@pytest.mark.parametrize("kwargs,field", [(dict(rank=-1), "lora_rank"), (dict(rank=2, alpha=0.0), "lora_alpha"),
                                          (dict(rank=2, targets=("q", "qkv")), "lora_targets"),
                                          (dict(rank=2, targets=()), "lora_targets")])
def test_bad_lora_settings_are_rejected_by_name(kwargs, field):
  from m3jax.rl.program import RLConfig
  from m3jax.sft.run import SFTConfig

  with pytest.raises(ValueError, match=field):
    lora.LoRAConfig(**kwargs)
  for config in (RLConfig, SFTConfig):
    with pytest.raises(ValueError, match=field):
      config(**{f"lora_{k}": v for k, v in kwargs.items()})


def test_adapter_file_round_trips_and_refuses_what_it_cannot_load(tmp_path):
  """The shippable one-file form: the loaded model gives the trained logits; metadata comes back; an adapter for
  another base, a file with an unknown array, and a non-adapter file are refused by name."""
  trained = _randomise_b(lora.attach(Decoder(CFG, rngs=nnx.Rngs(0)), lora.LoRAConfig(rank=4, alpha=8.0,
                                                                                      targets=("q", "down"))))
  path = lora.export_adapter_file(tmp_path / "a.npz", trained, "controller", {"max_rounds": 3})
  loaded, info = lora.load_adapter_file(path, Decoder(CFG, rngs=nnx.Rngs(0)), "controller", seed=5)
  assert info["max_rounds"] == 3 and info["rank"] == 4 and info["targets"] == ["q", "down"]
  np.testing.assert_array_equal(loaded(TOKENS)[0], trained(TOKENS)[0])
  wider = dataclasses.replace(CFG, intermediate_size=96)
  with pytest.raises(checkpoint.CheckpointError, match="w_down_a has shape"):
    lora.load_adapter_file(path, Decoder(wider, rngs=nnx.Rngs(0)), "controller")
  with pytest.raises(checkpoint.CheckpointError, match="is a controller adapter, not a writer adapter"):
    lora.load_adapter_file(path, Decoder(CFG, rngs=nnx.Rngs(0)), "writer")
  with np.load(path) as z:
    arrays = dict(z)
  np.savez(tmp_path / "extra.npz", **arrays, stray=np.zeros(2))
  with pytest.raises(checkpoint.CheckpointError, match="unused adapter arrays.*stray"):
    lora.load_adapter_file(tmp_path / "extra.npz", Decoder(CFG, rngs=nnx.Rngs(0)), "controller")
  np.savez(tmp_path / "plain.npz", x=np.zeros(2))
  with pytest.raises(checkpoint.CheckpointError, match="not an m3jax LoRA adapter"):
    lora.load_adapter_file(tmp_path / "plain.npz", Decoder(CFG, rngs=nnx.Rngs(0)), "controller")
