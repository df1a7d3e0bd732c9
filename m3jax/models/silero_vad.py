"""Silero VAD v6 (16 kHz) in JAX, weights from the `silero-vad` package.

The package's default model is the TorchScript `silero_vad.jit` (v6); its tensors are read without torch.
The package also ships `silero_vad_16k.safetensors` (same architecture, different - older - weights), which
loads too when passed explicitly.

Per 32 ms chunk (512 samples plus the previous chunk's last 64 as context): a learned STFT (a strided conv
whose 258 filters are the real and imaginary parts of 129 bins) -> magnitude -> 4 convs -> an LSTM cell
carried across chunks -> 1x1 conv -> sigmoid = probability of speech.

Throughput: the convolutional encoder has no state, so it runs on all chunks of a clip at once; only the
128-wide LSTM cell runs in `lax.scan` over chunks. Clips are padded to a power-of-two number of chunks so a
few shapes compile; padded chunks come after the real ones and cannot influence them.
"""

from __future__ import annotations

import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Float

from m3jax.models.weights.torch_zip import CheckpointFormatError, load_torchscript_tensors
from m3jax.models.weights.tracking import TensorSource

CHUNK = 512
CONTEXT = 64
_KEYS = ("stft_conv.weight", "conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "conv3.weight",
         "conv3.bias", "conv4.weight", "conv4.bias", "lstm_cell.weight_ih", "lstm_cell.weight_hh",
         "lstm_cell.bias_ih", "lstm_cell.bias_hh", "final_conv.weight", "final_conv.bias")


_JIT_NAMES = {"stft_conv.weight": "stft.forward_basis_buffer", "final_conv.weight": "decoder.decoder.2.weight",
              "final_conv.bias": "decoder.decoder.2.bias"}
_JIT_NAMES.update({f"conv{i + 1}.{p}": f"encoder.{i}.reparam_conv.{p}" for i in range(4) for p in ("weight", "bias")})
_JIT_NAMES.update({f"lstm_cell.{p}": f"decoder.rnn.{p}" for p in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")})


def load_silero_params(path: str | pathlib.Path | None = None) -> dict[str, jax.Array]:
  """Reads the 16 kHz weights from `silero_vad.jit` (default: the installed package's) or a safetensors file;
  a tensor of the file that is neither read nor named below as not needed fails the load naming it."""
  if path is None:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
      raise FileNotFoundError("package 'silero-vad' is not installed; pass a weights path")
    path = pathlib.Path(spec.origin).parent / "data" / "silero_vad.jit"
  path = pathlib.Path(path)
  if path.suffix == ".safetensors":
    from safetensors.numpy import load_file

    raw = load_file(str(path))
    get = TensorSource(raw.__getitem__, raw, CheckpointFormatError, path)
    name = lambda k: k
  else:
    tensors = load_torchscript_tensors(path)
    get = TensorSource(tensors.__getitem__, tensors, CheckpointFormatError, path)
    for key in get.names:
      if key.startswith("_model_8k."):
        get.skip(key, "the 8 kHz model of the same archive; m3jax runs the 16 kHz one")
    for key in ("_state", "_context"):
      get.skip(key, "the TorchScript module's streaming state buffers (empty when saved); speech_probs carries its own")
    name = lambda k: f"_model.{_JIT_NAMES[k]}"
  missing = [k for k in _KEYS if name(k) not in get]
  if missing:
    raise CheckpointFormatError(f"{path}: not a Silero VAD 16 kHz file (missing {missing})")
  params = {k: jnp.asarray(get(name(k))) for k in _KEYS}
  get.check_all_used()
  return params


def _conv(x_nwc: Float[Array, "N W C"], w_oik: Float[Array, "O I K"], b: Float[Array, "O"] | None,
          stride: int, pad: int) -> Float[Array, "N W2 O"]:
  y = jax.lax.conv_general_dilated(x_nwc, jnp.transpose(w_oik, (2, 1, 0)), (stride,), [(pad, pad)],
                                   dimension_numbers=("NWC", "WIO", "NWC"))
  return y if b is None else y + b


def speech_probs(params: dict[str, jax.Array], audio: Float[Array, "T"]) -> Float[Array, "N"]:
  """Speech probability of every 512-sample chunk of a 16 kHz clip whose length is a multiple of 512."""
  n_chunks = audio.shape[0] // CHUNK
  padded = jnp.concatenate([jnp.zeros((CONTEXT,), audio.dtype), audio])
  idx = np.arange(n_chunks)[:, None] * CHUNK + np.arange(CHUNK + CONTEXT)[None, :]
  x = padded[idx]  # [N, 576]: context + chunk
  x = jnp.concatenate([x, x[:, -2:-CONTEXT - 2:-1]], axis=1)  # reflect-pad 64 on the right -> [N, 640]
  spec = _conv(x[..., None], params["stft_conv.weight"], None, stride=128, pad=0)  # [N, 4, 258]
  half = spec.shape[-1] // 2
  x = jnp.sqrt(spec[..., :half] ** 2 + spec[..., half:] ** 2)
  x = jax.nn.relu(_conv(x, params["conv1.weight"], params["conv1.bias"], 1, 1))
  x = jax.nn.relu(_conv(x, params["conv2.weight"], params["conv2.bias"], 2, 1))
  x = jax.nn.relu(_conv(x, params["conv3.weight"], params["conv3.bias"], 2, 1))
  feats = jax.nn.relu(_conv(x, params["conv4.weight"], params["conv4.bias"], 1, 1))[:, 0]  # [N, 128]
  gates_in = feats @ params["lstm_cell.weight_ih"].T + params["lstm_cell.bias_ih"] + params["lstm_cell.bias_hh"]
  w_hh = params["lstm_cell.weight_hh"].T

  def step(carry, g_t):
    h, c = carry
    i, f, u, o = jnp.split(g_t + h @ w_hh, 4, axis=-1)
    c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
    h = jax.nn.sigmoid(o) * jnp.tanh(c)
    return (h, c), h

  zeros = jnp.zeros((w_hh.shape[0],), feats.dtype)
  _, h_seq = jax.lax.scan(step, (zeros, zeros), gates_in)
  logits = jax.nn.relu(h_seq) @ params["final_conv.weight"][0, :, 0] + params["final_conv.bias"][0]
  return jax.nn.sigmoid(logits)
