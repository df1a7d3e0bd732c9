"""GE2E speaker encoder (Resemblyzer's VoiceEncoder) in Flax NNX.

3-layer LSTM over 40-band mel frames; the last layer's final hidden state goes through Linear -> ReLU -> L2 norm,
giving a 256-d embedding with non-negative entries. Weights come from Resemblyzer's `pretrained.pt`, read
without torch (`m3jax.models.weights.torch_zip`).

Throughput: each layer's input projection for all time steps is one big matmul; only the recurrent
`h @ W_hh` runs inside `lax.scan`, on the whole batch of partials at once.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jaxtyping import Array, Float

from m3jax.models.weights.torch_zip import CheckpointFormatError, load_torch_checkpoint


@dataclasses.dataclass(frozen=True)
class GE2EConfig:
  n_mels: int = 40
  hidden: int = 256
  layers: int = 3
  embed: int = 256

  def __post_init__(self):
    for f in dataclasses.fields(self):
      if getattr(self, f.name) <= 0:
        raise ValueError(f"GE2EConfig.{f.name} must be positive, got {getattr(self, f.name)}")


class LSTMLayer(nnx.Module):
  """One unidirectional LSTM layer with PyTorch's gate order (input, forget, cell, output)."""

  def __init__(self, d_in: int, hidden: int, *, rngs: nnx.Rngs):
    init = nnx.initializers.uniform(scale=2.0 / np.sqrt(hidden))
    self.hidden = hidden
    self.w_ih = nnx.Param(init(rngs.params(), (d_in, 4 * hidden)) - 1.0 / np.sqrt(hidden))
    self.w_hh = nnx.Param(init(rngs.params(), (hidden, 4 * hidden)) - 1.0 / np.sqrt(hidden))
    self.bias = nnx.Param(jnp.zeros((4 * hidden,)))

  def __call__(self, x_tbd: Float[Array, "T B D"]) -> tuple[Float[Array, "T B H"], Float[Array, "B H"]]:
    gates_in = x_tbd @ self.w_ih[...] + self.bias[...]  # all time steps in one matmul
    w_hh = self.w_hh[...]
    batch = x_tbd.shape[1]

    def step(carry, g_t):
      h, c = carry
      g = g_t + h @ w_hh
      i, f, u, o = jnp.split(g, 4, axis=-1)
      c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(u)
      h = jax.nn.sigmoid(o) * jnp.tanh(c)
      return (h, c), h

    zeros = jnp.zeros((batch, self.hidden), x_tbd.dtype)
    (h_last, _), h_seq = jax.lax.scan(step, (zeros, zeros), gates_in)
    return h_seq, h_last


class GE2E(nnx.Module):
  """Mel partials [B, T, 40] -> unit-norm speaker embeddings [B, 256]."""

  def __init__(self, config: GE2EConfig = GE2EConfig(), *, rngs: nnx.Rngs):
    self.config = config
    dims = [config.n_mels] + [config.hidden] * config.layers
    self.lstm = nnx.List([LSTMLayer(dims[i], config.hidden, rngs=rngs) for i in range(config.layers)])
    self.linear = nnx.Linear(config.hidden, config.embed, rngs=rngs)

  def __call__(self, mels_btf: Float[Array, "B T F"]) -> Float[Array, "B E"]:
    x = jnp.swapaxes(mels_btf, 0, 1)  # time-major for scan
    h_last = None
    for layer in self.lstm:
      x, h_last = layer(x)
    raw = jax.nn.relu(self.linear(h_last))
    return raw / jnp.linalg.norm(raw, axis=-1, keepdims=True)

  @classmethod
  def from_resemblyzer(cls, path: str | pathlib.Path | None = None) -> "GE2E":
    """Loads Resemblyzer's `pretrained.pt` (default: the one shipped in the installed package)."""
    if path is None:
      spec = importlib.util.find_spec("resemblyzer")
      if spec is None or spec.origin is None:
        raise FileNotFoundError("package 'resemblyzer' is not installed; pass the path to pretrained.pt")
      path = pathlib.Path(spec.origin).parent / "pretrained.pt"
    state = load_torch_checkpoint(path)
    state = state.get("model_state", state) if isinstance(state, dict) else state
    if not isinstance(state, dict):
      raise CheckpointFormatError(f"{path}: expected a state dict, got {type(state).__name__}")
    config = _config_from_state(state, path)
    model = nnx.eval_shape(lambda: cls(config, rngs=nnx.Rngs(0)))  # abstract: every weight is loaded below
    for i, layer in enumerate(model.lstm):
      layer.w_ih.value = jnp.asarray(state[f"lstm.weight_ih_l{i}"].T)
      layer.w_hh.value = jnp.asarray(state[f"lstm.weight_hh_l{i}"].T)
      layer.bias.value = jnp.asarray(state[f"lstm.bias_ih_l{i}"] + state[f"lstm.bias_hh_l{i}"])
    model.linear.kernel.value = jnp.asarray(state["linear.weight"].T)
    model.linear.bias.value = jnp.asarray(state["linear.bias"])
    return model


def _config_from_state(state: dict, path: object) -> GE2EConfig:
  """Infers sizes from the tensors so any GE2E checkpoint of this architecture loads."""
  try:
    w0 = state["lstm.weight_ih_l0"]
    layers = len([k for k in state if k.startswith("lstm.weight_ih_l")])
    return GE2EConfig(n_mels=w0.shape[1], hidden=w0.shape[0] // 4, layers=layers,
                      embed=state["linear.weight"].shape[0])
  except KeyError as e:
    raise CheckpointFormatError(f"{path}: not a GE2E state dict (missing {e})") from e
