"""GE2E speaker encoder: torch-free checkpoint reader, Resemblyzer-equal features and embeddings, speaker ID."""

import collections
import copy
import io
import pathlib
import pickle
import zipfile

import numpy as np
import pytest
import torch

from m3jax.models.weights.torch_zip import (CheckpointFormatError, UnsafeCheckpointError, load_torch_checkpoint,
                                            load_torchscript_tensors)
from m3jax.perception import audio as A
from m3jax.perception.voices import SilentSegmentError, SpeakerEncoder

from espeak_voices import SENTENCES, VOICES, say
from parity import assert_close_to_reference, torch_f32_f64

PRETRAINED = pathlib.Path(__import__("resemblyzer").__file__).parent / "pretrained.pt"


@pytest.fixture(scope="session")
def speech(tmp_path_factory):
  out = tmp_path_factory.mktemp("ge2e_speech")
  return {(v, i): say(s, v, out, f"{v}_{i}") for v in VOICES for i, s in enumerate(SENTENCES)}


@pytest.fixture(scope="session")
def encoder():
  return SpeakerEncoder.load()


@pytest.fixture(scope="session")
def resemblyzer_encoder():
  from resemblyzer import VoiceEncoder

  return VoiceEncoder(device="cpu", verbose=False)


def test_legacy_checkpoint_equals_torch_load():
  ours = load_torch_checkpoint(PRETRAINED)
  ref = torch.load(PRETRAINED, map_location="cpu", weights_only=True)
  assert ours["step"] == ref["step"]
  assert set(ours["model_state"]) == set(ref["model_state"])
  for k, v in ref["model_state"].items():
    np.testing.assert_array_equal(ours["model_state"][k], v.numpy())


def test_zip_checkpoint_with_strided_tensor(tmp_path):
  base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
  torch.save({"t": base.T[1:], "i": torch.tensor([3, 4], dtype=torch.int64)}, tmp_path / "x.pt")
  out = load_torch_checkpoint(tmp_path / "x.pt")
  np.testing.assert_array_equal(out["t"], base.T[1:].numpy())
  np.testing.assert_array_equal(out["i"], [3, 4])


def test_unpickler_refuses_code_and_garbage(tmp_path):
  class Evil:
    def __reduce__(self):
      return (print, ("pwned",))

  path = tmp_path / "evil.pt"
  with zipfile.ZipFile(path, "w") as z:
    z.writestr("archive/data.pkl", pickle.dumps({"x": Evil()}, protocol=2))
  with pytest.raises(UnsafeCheckpointError, match="forbidden global .*print"):
    load_torch_checkpoint(path)
  # A tensor whose size/stride reach past its storage must not read foreign memory.
  marker = object()

  class Pickler(pickle.Pickler):
    def persistent_id(self, obj):
      return ("storage", torch.FloatStorage, "0", "cpu", 4) if obj is marker else None

  class Huge:
    def __reduce__(self):
      return (torch._utils._rebuild_tensor_v2, (marker, 0, (1000,), (1,), False, collections.OrderedDict()))

  buf = io.BytesIO()
  Pickler(buf, protocol=2).dump({"t": Huge()})
  with zipfile.ZipFile(tmp_path / "huge.pt", "w") as z:
    z.writestr("archive/data.pkl", buf.getvalue())
    z.writestr("archive/data/0", np.zeros(4, np.float32).tobytes())
  with pytest.raises(CheckpointFormatError, match="exceeds its storage"):
    load_torch_checkpoint(tmp_path / "huge.pt")
  (tmp_path / "junk.pt").write_bytes(b"not a checkpoint at all")
  with pytest.raises(CheckpointFormatError):
    load_torch_checkpoint(tmp_path / "junk.pt")
  (tmp_path / "cut.pt").write_bytes(PRETRAINED.read_bytes()[:100_000])
  with pytest.raises(CheckpointFormatError, match="truncated"):
    load_torch_checkpoint(tmp_path / "cut.pt")


def test_torchscript_tensors_equal_jit_state_dict(tmp_path):
  import silero_vad

  path = pathlib.Path(silero_vad.__file__).parent / "data" / "silero_vad.jit"
  ours = load_torchscript_tensors(path)
  ref = torch.jit.load(str(path), map_location="cpu").state_dict()
  for k, v in ref.items():
    np.testing.assert_array_equal(ours[k], v.numpy())

  class Evil:
    def __reduce__(self):
      return (eval, ("1+1",))

  evil = tmp_path / "evil.jit"
  with zipfile.ZipFile(evil, "w") as z:
    z.writestr("m/data.pkl", pickle.dumps(Evil(), protocol=2))
  with pytest.raises(UnsafeCheckpointError, match="eval"):
    load_torchscript_tensors(evil)


def test_mel_front_end_equals_librosa(speech):
  import librosa

  wav = speech[("f3", 0)]
  ref32, ref64 = (librosa.feature.melspectrogram(y=y, sr=16000, n_fft=400, hop_length=160, n_mels=40).T
                  for y in (wav, wav.astype(np.float64)))  # librosa computes in its input's precision
  ours = A.mel_spectrogram(wav)
  assert ours.shape == ref32.shape
  assert_close_to_reference(ours, ref32, ref64, what="mel power")


def test_embeddings_match_resemblyzer(speech, encoder, resemblyzer_encoder):
  wavs = [speech[("f3", 0)], speech[("klatt", 1)], speech[("m3", 2)][:20_000]]  # incl. a 1.25 s clip
  ours = encoder.embed(wavs)
  # resemblyzer's pipeline makes float32 mels; its float64 run feeds them to a float64 copy of the network
  double = copy.deepcopy(resemblyzer_encoder).double()
  double.forward = lambda mels, forward=double.forward: forward(mels.double())
  ref32, ref64 = (np.stack([e.embed_utterance(A.normalize_volume(w)) for w in wavs])
                  for e in (resemblyzer_encoder, double))
  assert ours.shape == (3, 256)
  assert_close_to_reference(ours, ref32, ref64, what="utterance embeddings")
  mels = A.utterance_partials(A.normalize_volume(wavs[0]))
  ref32, ref64 = torch_f32_f64(resemblyzer_encoder, lambda m, dt: m(torch.from_numpy(mels).to(dt)))
  assert_close_to_reference(encoder.embed_partials(mels), ref32, ref64, what="partial embeddings")


def test_speaker_identification_1nn(speech, encoder):
  keys = sorted(speech)
  emb = encoder.embed([speech[k] for k in keys])
  sim = emb @ emb.T
  np.fill_diagonal(sim, -np.inf)
  nearest = sim.argmax(1)
  accuracy = np.mean([keys[i][0] == keys[j][0] for i, j in enumerate(nearest)])
  assert accuracy >= 0.9, accuracy


def test_bad_segments(encoder):
  assert encoder.embed([]).shape == (0, 256)
  with pytest.raises(A.AudioInputError, match="segment 1 is empty"):
    encoder.embed([np.ones(16000, np.float32) * 0.1, np.zeros(0, np.float32)])
  with pytest.raises(SilentSegmentError, match="segment 0"):
    encoder.embed([np.zeros(16000, np.float32)])
  with pytest.raises(A.AudioInputError, match="NaN"):
    encoder.embed([np.full(16000, np.nan, np.float32)])
  with pytest.raises(A.AudioInputError, match="1-D"):
    encoder.embed([np.zeros((2, 16000), np.float32)])
  with pytest.raises(A.AudioInputError, match="floating"):
    encoder.embed([np.zeros(16000, np.int16)])


@pytest.mark.parametrize("layers", [1, 2, 3])
def test_wavefront_lstm_equals_torch_lstm(layers):
  """The layers-as-a-wavefront scan gives torch.nn.LSTM's last hidden state, for any depth (tiny random sizes)."""
  import jax.numpy as jnp
  from flax import nnx

  from m3jax.models.ge2e import GE2E, GE2EConfig

  model = GE2E(GE2EConfig(n_mels=8, hidden=16, layers=layers, embed=8), rngs=nnx.Rngs(layers))
  x = np.random.default_rng(layers).standard_normal((3, 11, 8)).astype(np.float32)
  lstm = torch.nn.LSTM(8, 16, layers, batch_first=True)
  with torch.no_grad():
    for i, layer in enumerate(model.lstm):
      getattr(lstm, f"weight_ih_l{i}").copy_(torch.tensor(np.asarray(layer.w_ih[...]).T))
      getattr(lstm, f"weight_hh_l{i}").copy_(torch.tensor(np.asarray(layer.w_hh[...]).T))
      getattr(lstm, f"bias_ih_l{i}").copy_(torch.tensor(np.asarray(layer.bias[...])))
      getattr(lstm, f"bias_hh_l{i}").zero_()
  ref32, ref64 = torch_f32_f64(lstm, lambda m, dt: m(torch.from_numpy(x).to(dt))[1][0][-1])
  got = model._last_hidden(jnp.swapaxes(jnp.asarray(x), 0, 1))
  assert_close_to_reference(got, ref32, ref64, what=f"{layers}-layer last hidden state")
