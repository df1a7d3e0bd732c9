"""Decoder parity with transformers (tiny random Llama/Qwen2/Qwen3 and the real SmolLM2 weights), weights I/O."""

import copy
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from m3jax.models.decoder import DecoderConfig, KVCache
from m3jax.models.weights.hf import WeightLoadError, load_hf, save_hf

from conftest import CONFIGS
from parity import assert_close_to_reference, torch_f32_f64


def _tokens(b=2, t=17, seed=0):
  return np.random.RandomState(seed).randint(0, 320, (b, t))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_tiny_logits_match_transformers(tiny_dirs, name):
  path, ref_model = tiny_dirs[name]
  model = load_hf(path)
  toks = _tokens()
  ref32, ref64 = torch_f32_f64(ref_model, lambda m, _: m(torch.tensor(toks)).logits)
  logits, _ = model(jnp.asarray(toks))
  assert_close_to_reference(logits, ref32, ref64, what=f"{name} logits")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_fused_split_layers_match_transformers(tiny_dirs, name):
  """The decode step's per-layer weights with q/k/v and gate/up fused (biases and q/k norms included)."""
  path, ref_model = tiny_dirs[name]
  model = load_hf(path)
  fused = model.split_layers()
  assert "w_qkv" in fused[0] and "wq" not in fused[0] and "w_gate_up" in fused[0]
  toks = _tokens()
  ref32, ref64 = torch_f32_f64(ref_model, lambda m, _: m(torch.tensor(toks)).logits)
  logits, _ = model(jnp.asarray(toks), layers=fused)
  assert_close_to_reference(logits, ref32, ref64, what=f"{name} fused-layer logits")
  assert "wq" in model.split_layers(fuse=False)[0]


def test_padded_rows_and_cache_chunks_match_full_forward(tiny_dirs):
  model = load_hf(tiny_dirs["qwen3"][0])
  toks = _tokens(2, 12)
  full, _ = model(jnp.asarray(toks))
  # right-padded ragged rows: the real prefix of each row gives the same logits as the unpadded forward
  padded, _ = model(jnp.asarray(toks), chunk_len=jnp.asarray([12, 7]))
  np.testing.assert_allclose(np.asarray(padded)[1, :7], np.asarray(full)[1, :7], atol=1e-5)
  # the same sequence fed through the cache in chunks of 5 + 7 gives the same logits
  cache = model.init_cache(2, 32)
  a, cache = model(jnp.asarray(toks[:, :5]), cache)
  b, cache = model(jnp.asarray(toks[:, 5:]), cache)
  np.testing.assert_allclose(np.concatenate([a, b], axis=1), np.asarray(full), atol=1e-5)
  assert np.asarray(cache.length).tolist() == [12, 12]


@pytest.mark.parametrize("loop,chunk", [("scan", 0), ("unroll", 0), ("scan", 3)])
def test_a_prefix_s_returned_keys_and_values_continue_it_like_the_full_forward(tiny_dirs, loop, chunk):
  """The learner's shared prefixes: `return_kv` of the first 5 tokens, broadcast to 2 rows, as `prefix_kv` of each
  row's own next tokens (ragged), gives the full forward's hidden states, gradients through the keys included;
  with `attention_chunk` the tails attend in blocks (`causal_attention`'s offset)."""
  model = load_hf(tiny_dirs["qwen3"][0], **({"attention_chunk": chunk} if chunk else {}))
  toks = _tokens(2, 12)
  toks[1, :5] = toks[0, :5]
  lengths = jnp.asarray([12, 9])
  full, _ = model.hidden(jnp.asarray(toks), chunk_len=lengths, layer_loop=loop)

  def shared(scale):
    head, (k, v) = model.hidden(jnp.asarray(toks[:1, :5]), return_kv=True, layer_loop=loop)
    k, v = (jnp.broadcast_to(a, (a.shape[0], 2, *a.shape[2:])) * scale for a in (k, v))
    tail, _ = model.hidden(jnp.asarray(toks[:, 5:]), chunk_len=lengths - 5, prefix_kv=(k, v), layer_loop=loop)
    return jnp.concatenate([jnp.broadcast_to(head, (2, *head.shape[1:])), tail], axis=1)

  got = np.asarray(shared(1.0))
  for row, n in enumerate([12, 9]):
    np.testing.assert_allclose(got[row, :n], np.asarray(full)[row, :n], atol=1e-5)
  assert abs(float(jax.grad(lambda s: shared(s)[:, 5:].sum())(1.0))) > 0  # the tails read the prefix's keys
  with pytest.raises(ValueError, match="cache-free"):
    model.hidden(jnp.asarray(toks), model.init_cache(2, 16), return_kv=True)


def test_a_decode_window_writes_back_exactly_the_slots_its_loop_filled():
  """`KVCache.with_window` writes back only the slots [start, length) of each row (at most n), and gives the
  cache that writing the whole window back gives: a row that filled nothing, a row whose n slots run past the
  window, and unfilled slots inside the window that differ from the cache (never written back)."""
  rs = np.random.RandomState(0)
  L, B, K, S, D, W, n = 2, 3, 2, 64, 4, 32, 6
  cache = KVCache(jnp.asarray(rs.randn(L, B, K, S, D), jnp.float32), jnp.asarray(rs.randn(L, B, K, S, D), jnp.float32),
                  jnp.asarray([5, 20, 30], jnp.int32))
  end = np.array([9, 20, 32])  # row 0 filled 4 slots, row 1 none, row 2 the window's last 2
  kv = cache.layer_window(W)
  filled = np.zeros((B, W), bool)
  for b, (s0, e) in enumerate(zip([5, 20, 30], end)):
    filled[b, s0:e] = True
  def loop_writes(layers):  # new values in the slots the loop filled
    out = []
    for x in layers:
      x = np.asarray(x).copy()
      x[np.broadcast_to(filled[:, None], x.shape[:3])] = rs.randn(int(filled.sum()) * K, D)
      out.append(jnp.asarray(x))
    return tuple(out)
  kv = kv.replace(k=loop_writes(kv.k), v=loop_writes(kv.v), length=jnp.asarray(end, jnp.int32))
  got = cache.with_window(kv, cache.length, n)
  for full, layers, new in ((cache.k, kv.k, got.k), (cache.v, kv.v, got.v)):
    np.testing.assert_array_equal(new, full.at[:, :, :, :W].set(jnp.stack(layers)))
  np.testing.assert_array_equal(got.length, end)
  junk = kv.replace(k=tuple(x.at[1, :, 25].set(99.0) for x in kv.k))  # row 1, slot 25: not filled by the loop
  np.testing.assert_array_equal(cache.with_window(junk, cache.length, n).k, got.k)


def test_prefilled_rows_write_back_exactly_their_new_slots():
  """`KVCache.with_rows_filled` (a prefill of a subset of rows) gives the cache that writing the whole rows back
  gives, and moves nothing the prefill did not fill (a row fed nothing, slots past a row's feed)."""
  rs = np.random.RandomState(1)
  L, B, K, S, D, n = 2, 4, 2, 32, 4, 5
  cache = KVCache(jnp.asarray(rs.randn(L, B, K, S, D), jnp.float32), jnp.asarray(rs.randn(L, B, K, S, D), jnp.float32),
                  jnp.asarray([3, 10, 0, 29], jnp.int32))
  index = jnp.asarray([3, 1, 0], jnp.int32)
  start, end = np.array([29, 10, 3]), np.array([32, 10, 8])  # row 3 fills the cache's last 3, row 1 nothing
  sub = cache.take_rows(index)
  k, v = np.asarray(sub.k).copy(), np.asarray(sub.v).copy()
  for i, (s0, e) in enumerate(zip(start, end)):
    k[:, i, :, s0:e], v[:, i, :, s0:e] = rs.randn(L, K, e - s0, D), rs.randn(L, K, e - s0, D)
  filled = KVCache(jnp.asarray(k), jnp.asarray(v), jnp.asarray(end, jnp.int32))
  got = cache.with_rows_filled(filled, index, jnp.asarray(start, jnp.int32), n)
  np.testing.assert_array_equal(got.k, cache.k.at[:, index].set(filled.k))
  np.testing.assert_array_equal(got.v, cache.v.at[:, index].set(filled.v))
  np.testing.assert_array_equal(got.length, [8, 10, 0, 32])
  junk = filled.replace(k=filled.k.at[:, 1, :, 12].set(99.0))  # row 1 filled nothing: slot 12 is not its write
  np.testing.assert_array_equal(cache.with_rows_filled(junk, index, jnp.asarray(start, jnp.int32), n).k, got.k)


def test_save_load_round_trip_is_exact_and_loads_in_transformers(tiny_dirs, tmp_path):
  model = load_hf(tiny_dirs["qwen2"][0])
  save_hf(model, tmp_path / "rt", max_shard_bytes=64 << 10)  # force several shards + an index
  assert (tmp_path / "rt" / "model.safetensors.index.json").exists()
  again = load_hf(tmp_path / "rt")
  for a, b in zip(jax.tree.leaves(jax.tree.map(np.asarray, nnx_params(model))),
                  jax.tree.leaves(jax.tree.map(np.asarray, nnx_params(again)))):
    np.testing.assert_array_equal(a, b)
  hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "rt").eval()
  toks = _tokens()
  ref32, ref64 = torch_f32_f64(hf, lambda m, _: m(torch.tensor(toks)).logits)
  assert_close_to_reference(model(jnp.asarray(toks))[0], ref32, ref64, what="round-tripped logits")


def test_bfloat16_checkpoint_and_remat(tiny_dirs, tmp_path):
  path, ref = tiny_dirs["qwen3"]
  copy.deepcopy(ref).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
  model = load_hf(tmp_path / "bf16", remat=True)
  want = ref.model.layers[1].mlp.up_proj.weight.detach().to(torch.bfloat16).float().numpy().T
  np.testing.assert_array_equal(np.asarray(model.w_up[...][1]), want)
  loss = lambda m: jnp.mean(m(jnp.asarray(_tokens()))[0] ** 2)
  from flax import nnx
  g_remat = nnx.grad(loss)(model)
  g_plain = nnx.grad(loss)(load_hf(tmp_path / "bf16"))
  np.testing.assert_allclose(np.asarray(g_remat.wq[...]), np.asarray(g_plain.wq[...]), atol=1e-6)


def nnx_params(model):
  from flax import nnx
  return nnx.to_pure_dict(nnx.state(model, nnx.Param))


def test_missing_tensor_and_bad_shape_are_named(tiny_dirs, tmp_path):
  from safetensors.numpy import load_file, save_file
  src = tiny_dirs["llama_tied"][0]
  tensors = load_file(src / "model.safetensors")
  cfg = json.loads((src / "config.json").read_text())
  for case, edit in {
      "missing": lambda t: t.pop("model.layers.1.mlp.up_proj.weight"),
      "shape": lambda t: t.__setitem__("model.layers.0.self_attn.k_proj.weight", np.zeros((3, 64), np.float32)),
  }.items():
    d = tmp_path / case
    d.mkdir()
    t = dict(tensors)
    edit(t)
    save_file(t, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightLoadError, match="up_proj" if case == "missing" else "k_proj"):
      load_hf(d)


def test_config_validation_names_the_problem():
  with pytest.raises(ValueError, match="num_kv_heads"):
    DecoderConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=3, num_kv_heads=2,
                  head_dim=4)
  with pytest.raises(ValueError, match="model_type"):
    DecoderConfig.from_hf({"model_type": "gpt2", "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
                           "num_hidden_layers": 1, "num_attention_heads": 2})


@pytest.fixture(scope="session")
def hf_smollm2():
  """transformers' own GGUF dequantisation of the same file (the reference for the real-weight tests)."""
  from m3jax.models.weights.gguf import smollm2_path
  path = smollm2_path()
  return transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                           dtype=torch.float32).eval()


@pytest.mark.slow
def test_smollm2_real_weights_logits_and_greedy_match_transformers(smollm2, hf_smollm2):
  from m3jax.engine.sampling import Sampler, SamplingConfig
  from m3jax.models.tokenizer import chat_ids
  model, tok = smollm2
  prompts = [chat_ids(tok, [{"role": "user", "content": q}])
             for q in ("What is the capital of France?", "Name three colours of the rainbow, please.")]
  # Across 30 layers two float32 implementations drift ~1e-4 apart (both sit ~1e-4 from the exact value, how far
  # depends on the CPU's kernels), so m3jax's distance from transformers run in float64 on the same dequantised
  # weights is bounded by transformers' own float32 distance in this run.
  ref32, ref64 = torch_f32_f64(hf_smollm2, lambda m, _: m(torch.tensor([prompts[0]])).logits)
  logits, _ = model(jnp.asarray([prompts[0]]))
  assert_close_to_reference(logits, ref32, ref64, what="SmolLM2 logits")
  sampler = Sampler(model, SamplingConfig(max_new_tokens=32, greedy=True), tokenizer=tok)
  out = sampler.generate(prompts)
  for p, got in zip(prompts, out.tokens):
    with torch.no_grad():
      want = hf_smollm2.generate(torch.tensor([p]), max_new_tokens=32, do_sample=False, eos_token_id=None,
                                 pad_token_id=tok.pad_token_id)[0, len(p):].tolist()
    assert got == want
  assert out.text[0].startswith("The capital of France is Paris")
