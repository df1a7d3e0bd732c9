"""Whisper in Flax vs transformers: logits (tiny random + real tiny.en), log-mels, greedy transcripts, bad input."""

import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import WhisperConfig as HFConfig
from flax import nnx
from transformers import GenerationConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

from m3jax.models.weights.ct2 import CT2FormatError, ct2_whisper_to_hf, read_ct2
from m3jax.models.weights.whisper_weights import WhisperWeightsError, load_whisper
from m3jax.models.whisper import sinusoids
from m3jax.perception.asr import ENGLISH_PROMPT, Transcriber, shipped_model_dir
from m3jax.perception.audio import AudioInputError
from m3jax.models.logmel import log_mel_spectrogram, mel_filters, pad_or_trim

from parity import LOG_SPECTRUM_FLOOR, assert_close_to_reference, torch_f32_f64

SENTENCES = [
    ("en-us", "Please call Stella and ask her to bring these things with her from the store."),
    ("en-gb+m3", "The quick brown fox jumps over the lazy dog near the river bank."),
    ("en-us+f2", "Meeting notes: we agreed to ship the new release on Friday afternoon."),
]


@nnx.jit
def _logits(model, feats, tokens):
  return model.teacher_forced_logits(feats, tokens)


@nnx.jit
def _encode_cache(model, feats, max_len: int = 16):
  return model.init_cache(feats.shape[0], max_len, encoder_out=model.encode(feats))


@nnx.jit
def _step(model, tokens, cache, chunk_len):
  return model(tokens, cache, chunk_len)


def _hf_model(config: dict, state: dict) -> WhisperForConditionalGeneration:
  model = WhisperForConditionalGeneration(HFConfig(**config)).eval()
  model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
  return model


@pytest.fixture(scope="session")
def speech(tmp_path_factory) -> list[np.ndarray]:
  """espeak-ng utterances resampled to 16 kHz with sox."""
  out = tmp_path_factory.mktemp("speech")
  waves = []
  for i, (voice, text) in enumerate(SENTENCES):
    raw, wav = out / f"{i}.wav", out / f"{i}_16k.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(["sox", str(raw), "-r", "16000", str(wav)], check=True, capture_output=True)
    audio, sr = sf.read(wav, dtype="float32")
    assert sr == 16000
    waves.append(audio)
  return waves


@pytest.fixture(scope="session")
def real():
  """The shipped tiny.en: m3jax Transcriber and a transformers model built from the same CT2 tensors."""
  config, state = ct2_whisper_to_hf(read_ct2(shipped_model_dir())[1])
  return Transcriber.load(), _hf_model(config, state)


def test_tiny_random_logits_and_ragged_cache(tiny_whisper_dir):
  hf = WhisperForConditionalGeneration.from_pretrained(tiny_whisper_dir).eval()
  model = load_whisper(tiny_whisper_dir)
  rng = np.random.RandomState(0)
  feats = rng.randn(2, 16, 60).astype(np.float32)
  tokens = rng.randint(0, 96, (2, 9))
  ref32, ref64 = torch_f32_f64(hf, lambda m, dt: m(input_features=torch.from_numpy(feats).to(dt),
                                                  decoder_input_ids=torch.from_numpy(tokens)).logits)
  assert_close_to_reference(_logits(model, jnp.asarray(feats), jnp.asarray(tokens)), ref32, ref64, what="logits")
  # Incremental decoding with ragged chunks (row 0 feeds 4 then 5 tokens, row 1 feeds 2 then 7).
  cache = _encode_cache(model, jnp.asarray(feats))
  first = np.zeros((2, 4), np.int32)
  first[0], first[1, :2] = tokens[0, :4], tokens[1, :2]
  l1, cache = _step(model, jnp.asarray(first), cache, jnp.asarray([4, 2]))
  second = np.zeros((2, 7), np.int32)
  second[0, :5], second[1] = tokens[0, 4:], tokens[1, 2:]
  l2, cache = _step(model, jnp.asarray(second), cache, jnp.asarray([5, 7]))
  np.testing.assert_array_equal(np.asarray(cache.length), [9, 9])
  row0 = np.concatenate([np.asarray(l1[0]), np.asarray(l2[0, :5])])
  row1 = np.concatenate([np.asarray(l1[1, :2]), np.asarray(l2[1])])
  for b, row in enumerate((row0, row1)):
    assert_close_to_reference(row, ref32[b], ref64[b], what=f"cached logits row {b}")
  # Freshly initialised models start from Whisper's sinusoidal encoder positions, as in transformers.
  np.testing.assert_allclose(np.asarray(sinusoids(30, 32)), hf.model.encoder.embed_positions.weight.detach().numpy(),
                             atol=1e-5)


def test_real_tiny_en_logits(real, speech):
  transcriber, hf = real
  feats = WhisperFeatureExtractor()(speech[0], sampling_rate=16000, return_tensors="np").input_features
  tokens = np.array([[*ENGLISH_PROMPT, 4222, 869, 25041, 290, 1265]])
  ref32, ref64 = torch_f32_f64(hf, lambda m, dt: m(input_features=torch.from_numpy(feats).to(dt),
                                                  decoder_input_ids=torch.from_numpy(tokens)).logits)
  out = _logits(transcriber.model, jnp.asarray(feats), jnp.asarray(tokens))
  assert_close_to_reference(out, ref32, ref64, what="tiny.en logits")


@pytest.mark.parametrize("n_mels", [80, 128])
def test_log_mel_matches_feature_extractor(speech, n_mels):
  fe = WhisperFeatureExtractor(feature_size=n_mels)
  np.testing.assert_allclose(mel_filters(n_mels), fe.mel_filters, atol=1e-7)
  quiet = speech[1][:7000] * 0.05
  ref = fe([speech[0], quiet], sampling_rate=16000, return_tensors="np").input_features  # torch.stft, float32
  padded = np.zeros((2, speech[0].size), np.float32)
  padded[0], padded[1, :quiet.size] = speech[0], quiet
  # The extractor's numpy path is the float64 analogue: float64 frames, FFT and mel projection (its FFT output is
  # only stored as complex64, a per-bin rounding far below a float32 FFT's error in the quiet bins).
  ref64 = fe._np_extract_fbank_features(pad_or_trim(padded).astype(np.float64), "cpu")
  out = np.asarray(log_mel_spectrogram(padded, n_mels=n_mels))
  assert out.shape == ref.shape == (2, n_mels, 3000)
  assert_close_to_reference(out, ref, ref64, floor=LOG_SPECTRUM_FLOOR, what=f"{n_mels}-bin log-mels")


def test_transcripts_match_transformers_greedy(real, speech):
  transcriber, hf = real
  feats = WhisperFeatureExtractor()(speech, sampling_rate=16000, return_tensors="pt").input_features
  gen = GenerationConfig(decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256, max_new_tokens=100,
                         do_sample=False, num_beams=1)
  with torch.no_grad():
    ref = hf.generate(feats, decoder_input_ids=torch.tensor([list(ENGLISH_PROMPT)] * len(speech)),
                      generation_config=gen).numpy()
  ref_texts = [transcriber.tokenizer.decode([t for t in row.tolist() if t < 50256], skip_special_tokens=True).strip()
               for row in ref]
  # One batch of four windows: utterances 1 and 2, and a 31-s segment (utterance 3, silence to 30 s, utterance 3
  # again) that is cut into two windows whose texts are joined.
  long = np.concatenate([speech[2], np.zeros(30 * 16000 - speech[2].size, np.float32), speech[2]])
  texts = transcriber.transcribe([speech[0], speech[1], long])
  assert texts == [ref_texts[0], ref_texts[1], f"{ref_texts[2]} {ref_texts[2]}"]
  assert "lazy dog" in texts[1].lower() and "friday" in texts[2].lower()
  # Three windows: the encoder runs on chunks of 2 and 1 rows, assembled into one 4-row cache (one idle row).
  cache = transcriber.encode_to_cache(speech)
  assert cache.cross_k[0].shape[0] == 4 and not np.asarray(cache.cross_k[0][3]).any()
  assert transcriber.transcribe(speech) == ref_texts


def test_empty_silent_and_corrupt_audio(real):
  transcriber, _ = real
  assert transcriber.transcribe([]) == []
  assert transcriber.transcribe([np.zeros(0, np.float32), np.zeros(32000, np.float32)]) == ["", ""]
  with pytest.raises(AudioInputError, match="segment 1.*NaN"):
    transcriber.transcribe([np.zeros(100, np.float32), np.full(100, np.nan, np.float32)])
  with pytest.raises(AudioInputError, match="1-D"):
    transcriber.transcribe([np.zeros((2, 100), np.float32)])
  with pytest.raises(AudioInputError, match="floating"):
    transcriber.transcribe([np.zeros(100, np.int16)])
  with pytest.raises(ValueError, match="NaN"):
    log_mel_spectrogram(np.full(10, np.inf, np.float32))


def test_ct2_reader_errors(tmp_path):
  data = (shipped_model_dir() / "model.bin").read_bytes()
  (tmp_path / "model.bin").write_bytes(data[:5000])
  with pytest.raises(CT2FormatError, match="truncated"):
    read_ct2(tmp_path)
  (tmp_path / "model.bin").write_bytes((99).to_bytes(4, "little") + data[4:200])
  with pytest.raises(CT2FormatError, match="version 99"):
    read_ct2(tmp_path / "model.bin")
  with pytest.raises(FileNotFoundError):
    read_ct2(tmp_path / "missing")
  _, tensors = read_ct2(shipped_model_dir())
  assert tensors["decoder/embeddings/weight"].dtype == np.float16
  with pytest.raises(CT2FormatError, match="missing"):
    ct2_whisper_to_hf({k: v for k, v in tensors.items() if not k.startswith("encoder/conv1")})


def test_hf_dir_shape_mismatch(tiny_whisper_dir, tmp_path):
  from safetensors.numpy import load_file, save_file

  state = load_file(str(tiny_whisper_dir / "model.safetensors"))
  state["model.decoder.embed_positions.weight"] = state["model.decoder.embed_positions.weight"][:5]
  save_file(state, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text((tiny_whisper_dir / "config.json").read_text())
  with pytest.raises(WhisperWeightsError, match="embed_positions"):
    load_whisper(tmp_path)


def test_hf_directory_of_real_weights_loads_like_ct2(real, tmp_path):
  transcriber, hf = real
  hf.save_pretrained(tmp_path)
  from_dir = load_whisper(tmp_path)
  ref, got = nnx.state(transcriber.model, nnx.Param), nnx.state(from_dir, nnx.Param)
  pairs = list(zip(jax.tree.leaves(ref), jax.tree.leaves(got)))
  assert len(pairs) == len(jax.tree.leaves(ref)) > 100
  assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in pairs)
