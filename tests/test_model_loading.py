"""Model loading is exact or it refuses (issue 17):

* every tiny decoder config variant generates greedily token-for-token like transformers' `generate` (the Sampler
  jits with the model's graphdef as a static argument, so its config must hash);
* sliding windows hold in every attention path (cache-free blocked, KV-cache prefill in blocks, decode);
* a config field the decoder does not implement is refused at load time, by name, for every family;
* a checkpoint tensor a loader does not use fails the load, by name, for every loader.
"""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file

from m3jax.models.decoder import DecoderConfig, attention
from m3jax.models.causal_attention import causal_attention
from m3jax.models.hf_config import UnsupportedConfig
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.weights.hf import WeightLoadError, load_hf, save_hf

from conftest import CONFIGS

NEW_TOKENS = 12


def _prompts(seed=0):
  rng = np.random.RandomState(seed)
  return [rng.randint(0, 320, 9).tolist(), rng.randint(0, 320, 4).tolist()]


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sampler_greedy_matches_transformers_generate(tiny_dirs, name):
  path, ref = tiny_dirs[name]
  model = load_hf(path)
  hash(model.cfg)  # jit hashes the graphdef, and with it the config
  prompts = _prompts()
  out = Sampler(model, SamplingConfig(max_new_tokens=NEW_TOKENS, greedy=True)).generate(prompts)
  for p, got in zip(prompts, out.tokens):
    with torch.no_grad():
      want = ref.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                          max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False,
                          pad_token_id=0)[0, len(p):].tolist()
    assert got == want


@pytest.mark.parametrize("name", ["qwen2_window", "mistral_window"])
def test_sliding_window_in_blocked_paths(tiny_dirs, name):
  """attention_chunk < T: the cache-free forward runs causal_attention, a KV-cache prefill prefill_attention."""
  path, ref = tiny_dirs[name]
  toks = np.random.RandomState(1).randint(0, 320, (2, 19))
  with torch.no_grad():
    want = ref(torch.tensor(toks)).logits.numpy()
  model = load_hf(path, attention_chunk=4)
  no_cache, _ = model(jnp.asarray(toks))
  cached, _ = model(jnp.asarray(toks), model.init_cache(2, 32))
  scale = np.abs(want).max()
  assert np.abs(np.asarray(no_cache) - want).max() <= 1e-5 * scale
  assert np.abs(np.asarray(cached) - want).max() <= 1e-5 * scale


@pytest.mark.parametrize("window,offset", [(0, 0), (3, 0), (6, 0), (0, 7), (5, 7)])
def test_causal_attention_window_gradients_match_dense_attention(window, offset):
  """The flash-style VJP with a window equals autodiff through the dense masked attention; with an `offset`, the
  queries continue that many earlier keys (the learner's shared prefix), gradients into those keys included."""
  rng = np.random.RandomState(2)
  B, T, H, K, Dh = 2, 13, 4, 2, 8
  q = jnp.asarray(rng.randn(B, T, H, Dh), jnp.float32)
  k, v = (jnp.asarray(rng.randn(B, offset + T, K, Dh), jnp.float32) for _ in range(2))
  valid = offset + jnp.asarray([13, 9])
  w = jnp.int32(window)
  slots = jnp.broadcast_to(offset + jnp.arange(T), (B, T))
  live = (offset + jnp.arange(T)[None, :, None, None] < valid[:, None, None, None])
  loss = lambda f: lambda q, k, v: jnp.sum(jnp.where(live, f(q, k, v), 0.0) ** 2)
  grad = lambda f: jax.jit(jax.grad(loss(f), argnums=(0, 1, 2)))
  got = grad(lambda q, k, v: causal_attention(q, k, v, valid, 4, window=w, offset=offset))(q, k, v)
  want = grad(lambda q, k, v: attention(q, k, v, slots, valid, w))(q, k, v)
  assert np.abs(np.asarray(want[1][:, :offset])).max(initial=1.0) > 0  # the earlier keys get gradients
  for g, r in zip(got, want):
    assert np.abs(np.asarray(g) - np.asarray(r)).max() <= 1e-5 * np.abs(np.asarray(r)).max()


@pytest.mark.parametrize("name", ["llama_bias_gelu", "qwen3_bias_gelu_tanh", "qwen2_window", "mistral_window"])
def test_save_hf_round_trip_of_new_fields(tiny_dirs, tmp_path, name):
  path, ref = tiny_dirs[name]
  model = load_hf(path)
  save_hf(model, tmp_path / "rt")
  again = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "rt").eval()
  toks = np.random.RandomState(3).randint(0, 320, (1, 15))
  with torch.no_grad():
    a, b = again(torch.tensor(toks)).logits.numpy(), ref(torch.tensor(toks)).logits.numpy()
  np.testing.assert_array_equal(a, b)


def test_save_hf_refuses_a_config_its_family_cannot_express(tiny_dirs, tmp_path):
  import dataclasses
  from flax import nnx
  from m3jax.models.decoder import Decoder
  cfg = json.loads((tiny_dirs["qwen2"][0] / "config.json").read_text())
  cfg = dataclasses.replace(DecoderConfig.from_hf(cfg), o_bias=True)  # Qwen2 never biases o_proj
  with pytest.raises(ValueError, match="no exact Hugging Face qwen2 form"):
    save_hf(nnx.eval_shape(lambda: Decoder(cfg)), tmp_path / "bad")
  assert not (tmp_path / "bad").exists()


# ------------------------------------------------------------------------------------------ config refusals
def _hf_dict(config):
  return config.to_dict()


_TINY = dict(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1)
FAMILIES = {
    "llama": lambda: transformers.LlamaConfig(**_TINY),
    "mistral": lambda: transformers.MistralConfig(**_TINY),
    "qwen2": lambda: transformers.Qwen2Config(**_TINY),
    "qwen3": lambda: transformers.Qwen3Config(**_TINY, head_dim=8),
    "smollm3": lambda: transformers.SmolLM3Config(**_TINY, no_rope_layers=[1, 1]),
    "qwen2_5_omni_text": lambda: transformers.models.qwen2_5_omni.configuration_qwen2_5_omni.Qwen2_5OmniTextConfig(
        **_TINY),
}
# (edit of the config dict, text the error must contain)
REFUSALS = [
    (lambda d: d["rope_parameters"].update(rope_type="dynamic", factor=2.0), "rope_type='dynamic'"),
    (lambda d: d["rope_parameters"].update(rope_type="longrope"), "rope_type='longrope'"),
    (lambda d: d["rope_parameters"].update(partial_rotary_factor=0.5), "partial_rotary_factor"),
    (lambda d: d.update(hidden_act="relu"), "hidden_act='relu'"),
    (lambda d: d.update(attention_dropout=0.1), "attention_dropout"),
    (lambda d: d.update(quantization_config={"quant_method": "gptq"}), "quantization_config"),
    (lambda d: d.update(some_future_field=3), "some_future_field"),
]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_family_loads_its_defaults_and_refuses_unsupported_fields_by_name(family):
  base = _hf_dict(FAMILIES[family]())
  hash(DecoderConfig.from_hf(base))
  for edit, text in REFUSALS:
    d = json.loads(json.dumps(base))
    edit(d)
    with pytest.raises(UnsupportedConfig, match=text.replace("(", r"\(")):
      DecoderConfig.from_hf(d)


@pytest.mark.parametrize("family, edit, text", [
    ("llama", lambda d: d.update(sliding_window=8), "sliding_window"),  # Llama has no windows: not a Llama field
    ("qwen2", lambda d: d.update(attention_bias=True), "attention_bias"),  # Qwen2 ignores it; refuse ambiguity
    ("qwen2", lambda d: d.update(layer_types=["sliding_attention", "full_attention"]), "sliding_window=None"),
    ("qwen3", lambda d: d.update(layer_types=["chunked_attention"] * 2), "layer_types"),
    ("mistral", lambda d: d.update(layer_types=["full_attention"] * 2), "layer_types"),
    ("smollm3", lambda d: d.update(no_rope_layers=[1, 0]), "no_rope_layers"),
    ("llama", lambda d: d["rope_parameters"].update(mrope_section=[2, 1, 1]), "mrope_section"),
])
def test_family_specific_fields_are_refused_by_name(family, edit, text):
  d = _hf_dict(FAMILIES[family]())
  edit(d)
  with pytest.raises(UnsupportedConfig, match=text):
    DecoderConfig.from_hf(d)


def test_dynamic_rope_is_refused_at_load_before_any_weight_is_read(tiny_dirs, tmp_path):
  src = tiny_dirs["llama_tied"][0]
  cfg = json.loads((src / "config.json").read_text())
  cfg["rope_parameters"] = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
  (tmp_path / "config.json").write_text(json.dumps(cfg))  # no weights at all: the config alone is refused
  with pytest.raises(UnsupportedConfig, match="rope_type='dynamic' is not supported"):
    load_hf(tmp_path)
  with pytest.raises(ValueError, match="dynamic"):  # also when a config is built directly
    DecoderConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=2,
                  head_dim=4, rope_scaling={"rope_type": "dynamic", "factor": 2.0})


# ------------------------------------------------------------------------------------------ unused tensors
def _with_extra(src_file, dst_file, extra):
  tensors = dict(load_file(str(src_file)))
  tensors.update(extra)
  save_file(tensors, str(dst_file))


@pytest.mark.parametrize("name, extra", [
    ("llama_tied", "model.layers.0.self_attn.o_proj.bias"),  # an o bias the config does not declare
    ("qwen2", "model.layers.1.mlp.down_proj.bias"),
    ("llama3_rope", "model.rotary_emb.inv_freq"),
])
def test_decoder_load_names_unused_tensors(tiny_dirs, tmp_path, name, extra):
  src = tiny_dirs[name][0]
  shutil.copy(src / "config.json", tmp_path / "config.json")
  _with_extra(src / "model.safetensors", tmp_path / "model.safetensors", {extra: np.zeros(64, np.float32)})
  with pytest.raises(WeightLoadError, match=f"not used by the model: '{extra}'"):
    load_hf(tmp_path)


def test_tied_decoder_accepts_an_equal_lm_head_and_refuses_a_different_one(tiny_dirs, tmp_path):
  src = tiny_dirs["llama_tied"][0]
  tensors = load_file(str(src / "model.safetensors"))
  for case, head in {"equal": tensors["model.embed_tokens.weight"],
                     "different": tensors["model.embed_tokens.weight"] + 1}.items():
    d = tmp_path / case
    d.mkdir()
    shutil.copy(src / "config.json", d / "config.json")
    _with_extra(src / "model.safetensors", d / "model.safetensors", {"lm_head.weight": head})
    if case == "equal":
      load_hf(d)
    else:
      with pytest.raises(WeightLoadError, match="lm_head.weight"):
        load_hf(d)


def _write_gguf(path, tensors, extra_key=None):
  import gguf
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(2)
  w.add_context_length(256)
  w.add_embedding_length(64)
  w.add_feed_forward_length(128)
  w.add_head_count(4)
  w.add_head_count_kv(2)
  w.add_layer_norm_rms_eps(1e-6)
  w.add_rope_freq_base(10000.0)
  w.add_vocab_size(320)
  if extra_key:
    w.add_string(extra_key, "yarn")
  for name, value in tensors.items():
    w.add_tensor(name, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def test_gguf_load_names_unused_tensors_and_unknown_metadata(tiny_dirs, tmp_path, monkeypatch):
  """Refusals hold on every load: a file is indexed (`$M3JAX_CACHE/gguf`) only once it has loaded. A second load of
  a good file reads its index instead of parsing the file and gives the same parameters."""
  import gguf
  from flax import nnx
  from m3jax.models.weights.gguf import _LAYER, _NAMES, load_gguf
  monkeypatch.setenv("M3JAX_CACHE", str(tmp_path / "cache"))
  hf = load_file(str(tiny_dirs["llama_tied"][0] / "model.safetensors"))
  tensors = {}
  for key, value in hf.items():
    if key in _NAMES:
      tensors[_NAMES[key]] = value
    else:
      i, rest = key.split(".", 3)[2:]
      tensors[f"blk.{i}.{_LAYER[rest]}"] = value
  _write_gguf(tmp_path / "ok.gguf", tensors)
  parsed = load_gguf(tmp_path / "ok.gguf")
  _write_gguf(tmp_path / "extra.gguf", {**tensors, "rope_freqs.weight": np.ones(8, np.float32)})
  _write_gguf(tmp_path / "meta.gguf", tensors, extra_key="llama.rope.scaling.type")
  for _ in range(2):
    with pytest.raises(WeightLoadError, match="'rope_freqs.weight'"):
      load_gguf(tmp_path / "extra.gguf")
    with pytest.raises(UnsupportedConfig, match="llama.rope.scaling.type"):
      load_gguf(tmp_path / "meta.gguf")
  assert [p.name.split("-")[0] for p in (tmp_path / "cache" / "gguf").iterdir()] == ["ok"]

  def no_parse(*_):
    raise AssertionError("an indexed file was parsed again")
  monkeypatch.setattr(gguf, "GGUFReader", no_parse)
  indexed = load_gguf(tmp_path / "ok.gguf")
  assert indexed.cfg == parsed.cfg
  for a, b in zip(jax.tree.leaves(nnx.state(parsed)), jax.tree.leaves(nnx.state(indexed))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  with open(tmp_path / "ok.gguf", "ab") as f:  # another file now (its size is in the key): parsed, not indexed
    f.write(b"\0" * 64)
  with pytest.raises(WeightLoadError, match="parsed again"):
    load_gguf(tmp_path / "ok.gguf")


def test_the_gguf_index_views_the_shipped_llm_s_tensors_as_the_gguf_reader_does():
  """The index records each tensor's type, dtype, shape and offset; its views of SmolLM2's file are the reader's
  bytes exactly, and a JSON round trip of the index gives the same config."""
  import gguf
  from m3jax.models.weights.gguf import _parse, _tensors, config_from_gguf, smollm2_path
  path = smollm2_path()
  index = _parse(path)
  stored = json.loads(json.dumps(index))
  views = _tensors(path, stored)
  reader = gguf.GGUFReader(str(path))
  assert sorted(views) == sorted(t.name for t in reader.tensors)
  for t in reader.tensors:
    assert views[t.name].tensor_type == t.tensor_type and views[t.name].data.dtype == t.data.dtype, t.name
    np.testing.assert_array_equal(views[t.name].data, t.data, err_msg=t.name)
  read = lambda i: config_from_gguf(i["fields"], i["tensors"], i["vocab_tokens"])
  assert read(stored) == read(index)
  assert index["vocab_tokens"] == 49152 and index["data_offset"] < 16 << 20


def test_whisper_loads_name_unused_tensors(tiny_whisper_dir, tmp_path):
  from m3jax.models.weights.ct2 import CT2FormatError, ct2_whisper_to_hf, read_ct2
  from m3jax.models.weights.whisper_weights import WhisperWeightsError, load_whisper
  from m3jax.perception.asr import shipped_model_dir
  shutil.copy(tiny_whisper_dir / "config.json", tmp_path / "config.json")
  _with_extra(tiny_whisper_dir / "model.safetensors", tmp_path / "model.safetensors",
              {"model.decoder.layers.0.self_attn.extra.weight": np.zeros(4, np.float32)})
  with pytest.raises(WhisperWeightsError, match="model.decoder.layers.0.self_attn.extra.weight"):
    load_whisper(tmp_path)
  _, tensors = read_ct2(shipped_model_dir())
  with pytest.raises(CT2FormatError, match="decoder/layer_0/extra/weight"):
    ct2_whisper_to_hf({**tensors, "decoder/layer_0/extra/weight": np.zeros(4, np.float32)})
  with pytest.raises(CT2FormatError, match="decoder/scale_embeddings"):
    ct2_whisper_to_hf({**tensors, "decoder/scale_embeddings": np.array(1, np.int8)})


def test_bert_load_names_unused_tensors(tmp_path):
  from m3jax.models.bert import TextEmbedder, default_model_dir
  from m3jax.models.weights.torch_zip import CheckpointFormatError
  for name in ("config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(default_model_dir() / name, tmp_path / name)
  _with_extra(default_model_dir() / "model.safetensors", tmp_path / "model.safetensors",
              {"encoder.layer.0.attention.self.relative_bias": np.zeros(4, np.float32)})
  with pytest.raises(CheckpointFormatError, match="encoder.layer.0.attention.self.relative_bias"):
    TextEmbedder.from_pretrained(tmp_path)


def test_ge2e_load_names_unused_tensors(tmp_path):
  from m3jax.models.ge2e import GE2E
  from m3jax.models.weights.torch_zip import CheckpointFormatError
  lstm, linear = torch.nn.LSTM(8, 12, num_layers=2), torch.nn.Linear(12, 6)
  state = {f"lstm.{k}": v for k, v in lstm.state_dict().items()}
  state.update({f"linear.{k}": v for k, v in linear.state_dict().items()})
  state.update(similarity_weight=torch.tensor([10.0]), similarity_bias=torch.tensor([-5.0]))
  torch.save({"model_state": state}, tmp_path / "ok.pt")
  GE2E.from_resemblyzer(tmp_path / "ok.pt")
  torch.save({"model_state": {**state, "projection.weight": torch.zeros(3)}}, tmp_path / "extra.pt")
  with pytest.raises(CheckpointFormatError, match="projection.weight"):
    GE2E.from_resemblyzer(tmp_path / "extra.pt")


def test_silero_load_names_unused_tensors(tmp_path):
  import importlib.util
  import pathlib
  from m3jax.models.silero_vad import load_silero_params
  from m3jax.models.weights.torch_zip import CheckpointFormatError
  src = pathlib.Path(importlib.util.find_spec("silero_vad").origin).parent / "data" / "silero_vad_16k.safetensors"
  _with_extra(src, tmp_path / "vad.safetensors", {"conv5.weight": np.zeros(4, np.float32)})
  with pytest.raises(CheckpointFormatError, match="conv5.weight"):
    load_silero_params(tmp_path / "vad.safetensors")


def test_omni_thinker_load_names_unused_tensors():
  from test_omni_thinker import HF_CFG
  from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
  from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

  from m3jax.models.omni.thinker import ThinkerConfig
  from m3jax.models.omni.weights import OmniWeightsError, thinker_from_tensors
  hf = Qwen2_5OmniThinkerForConditionalGeneration(Qwen2_5OmniThinkerConfig(**HF_CFG))
  sd = {k: v.numpy() for k, v in hf.state_dict().items()}
  sd["model.visual.blocks.0.attn.q_norm.weight"] = np.ones(8, np.float32)
  with pytest.raises(OmniWeightsError, match="model.visual.blocks.0.attn.q_norm.weight"):
    thinker_from_tensors(ThinkerConfig.from_hf(hf.config.to_dict()), sd.__getitem__, sd.keys())


def test_whisper_and_bert_refuse_architecture_switches_they_do_not_implement(tmp_path):
  from m3jax.models.bert import BertConfig
  from m3jax.models.whisper import WhisperConfig
  hf = transformers.WhisperConfig(vocab_size=96, d_model=32, encoder_layers=1, decoder_layers=1,
                                  encoder_attention_heads=4, decoder_attention_heads=4).to_dict()
  WhisperConfig.from_hf(hf)
  for key, value in (("activation_function", "relu"), ("scale_embedding", True)):
    with pytest.raises(ValueError, match=key):
      WhisperConfig.from_hf({**hf, key: value})
  path = tmp_path / "config.json"
  path.write_text(json.dumps({"model_type": "bert", "position_embedding_type": "relative_key"}))
  with pytest.raises(ValueError, match="position_embedding_type"):
    BertConfig.from_json(path)


def test_transformers_v4_rope_scaling_spelling_maps_like_v5(tiny_dirs):
  """Released Llama-3.x config.json files spell RoPE as v4 did: `rope_scaling` plus a top-level `rope_theta`."""
  v5 = json.loads((tiny_dirs["llama3_rope"][0] / "config.json").read_text())
  v4 = {k: v for k, v in v5.items() if k != "rope_parameters"}
  rope = dict(v5["rope_parameters"])
  v4["rope_theta"] = rope.pop("rope_theta")
  v4["rope_scaling"] = rope
  assert DecoderConfig.from_hf(v4) == DecoderConfig.from_hf(v5)
  assert dict(DecoderConfig.from_hf(v4).rope_scaling)["rope_type"] == "llama3"
