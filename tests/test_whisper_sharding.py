"""Whisper on a (data, fsdp, tensor) mesh of 8 fake CPU devices (conftest.py) equals the single-device model."""

import pathlib
import subprocess
import tempfile

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import soundfile as sf
import torch
from flax import nnx
from jax.sharding import PartitionSpec as P
from transformers import WhisperForConditionalGeneration

from m3jax.models.decoder import logical_axes
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.weights.whisper_weights import load_whisper
from m3jax.parallel import make_mesh
from m3jax.perception.asr import Transcriber

from parity import assert_close_to_reference, assert_close_to_scale, torch_f32_f64


@pytest.fixture(scope="module")
def mesh():
  assert len(jax.devices()) >= 8, "conftest.py sets --xla_force_host_platform_device_count=8"
  return make_mesh(data=1, fsdp=4, tensor=2)


def test_every_parameter_has_logical_axes(tiny_whisper_dir):
  model = load_whisper(tiny_whisper_dir)
  names = jax.tree.leaves(logical_axes(model), is_leaf=lambda x: isinstance(x, tuple))
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  assert len(names) == len(params) > 50
  assert all(isinstance(n, tuple) and len(n) == p.ndim for n, p in zip(names, params))


def test_sharded_forward_and_greedy_decode_equal_single_device(tiny_whisper_dir, mesh):
  single, sharded = load_whisper(tiny_whisper_dir), load_whisper(tiny_whisper_dir, mesh=mesh)
  layer = sharded.encoder.layers[0]
  assert layer.attn.wqkv[...].sharding.spec == P("fsdp", None, "tensor", None)
  assert layer.mlp.w1[...].sharding.spec == P("fsdp", "tensor")
  assert sharded.decoder.embed[...].sharding.spec == P("tensor", "fsdp")
  assert len(sharded.decoder.layers[1].cross_attn.wkv[...].sharding.device_set) == 8

  rng = np.random.RandomState(0)
  feats = jnp.asarray(rng.randn(4, 16, 60).astype(np.float32))
  tokens = jnp.asarray(rng.randint(0, 96, (4, 9)))
  forward = nnx.jit(lambda m, f, t: m.teacher_forced_logits(f, t))
  a, b = forward(single, feats, tokens), forward(sharded, feats, tokens)
  assert len(b.sharding.device_set) == 8
  hf = WhisperForConditionalGeneration.from_pretrained(tiny_whisper_dir).eval()
  ref32, ref64 = torch_f32_f64(hf, lambda m, dt: m(input_features=torch.from_numpy(np.asarray(feats)).to(dt),
                                                  decoder_input_ids=torch.from_numpy(np.asarray(tokens))).logits)
  assert_close_to_reference(a, ref32, ref64, what="single-device logits")
  assert_close_to_reference(b, ref32, ref64, what="sharded logits")

  # Greedy decoding through the sampler on a cache built from each model's own (sharded) encoder output.
  cfg = SamplingConfig(max_new_tokens=12, greedy=True)
  encode = nnx.jit(lambda m, f: m.init_cache(4, 16, encoder_out=m.encode(f)))
  prompts = [[2], [2, 5], [2, 7, 9], [2, 11]]
  one = Sampler(single, cfg).generate(prompts, cache=encode(single, feats))
  many = Sampler(sharded, cfg, mesh=mesh).generate(prompts, cache=encode(sharded, feats))
  assert one.tokens == many.tokens and all(len(t) == 12 for t in one.tokens)
  for x, y in zip(one.logprobs, many.logprobs):  # log-probs of the same tokens: a few float32 roundings apart
    assert_close_to_scale(y, x, rel=1e-5, what="sharded greedy log-probs")


def test_sharded_transcriber_matches_single_device(mesh):
  """The shipped tiny.en (6 heads: 3 per tensor shard) transcribes the same on the mesh."""
  with tempfile.TemporaryDirectory() as tmp:
    raw, wav = pathlib.Path(tmp) / "a.wav", pathlib.Path(tmp) / "a16.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(raw), "The quick brown fox jumps over the lazy dog."],
                   check=True, capture_output=True)
    subprocess.run(["sox", str(raw), "-r", "16000", str(wav)], check=True, capture_output=True)
    speech = sf.read(wav, dtype="float32")[0]
  single = Transcriber.load(max_new_tokens=32)
  sharded = Transcriber.load(max_new_tokens=32, mesh=mesh)
  assert sharded.model.decoder.layers[0].self_attn.wqkv[...].sharding.spec == P("fsdp", None, "tensor", None)
  cache = sharded.encode_to_cache([speech, speech[:20000]])
  assert cache.cross_k[0].sharding.spec == P(None, "tensor")  # 2 rows: batch not divisible by 4
  text = single.transcribe([speech, speech[:20000]])
  assert sharded.transcribe([speech, speech[:20000]]) == text
  assert "quick brown fox" in text[0].lower()
