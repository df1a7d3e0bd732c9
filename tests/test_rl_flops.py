"""The learner's model-FLOP count against the parameters a real Decoder holds (counted from its arrays)."""

import jax
import numpy as np
from flax import nnx

from m3jax.models import lora
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.rl.flops import learner_step_flops

CFG = DecoderConfig(vocab_size=97, hidden_size=24, intermediate_size=40, num_layers=3, num_heads=3, num_kv_heads=1,
                    head_dim=8, tie_embeddings=True)


def _matrix_params(model) -> int:
  """Weights used as matmul operands: every parameter but the norms' scales (this config has no biases)."""
  leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
  return int(sum(x.size for path, x in leaves if "norm" not in jax.tree_util.keystr(path)))


def test_forward_is_two_flops_per_weight_per_token_plus_attention():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  lengths = [5, 11, 2]
  tokens = sum(lengths)
  out = learner_step_flops(CFG, lengths, trained_tokens=tokens)
  weights = _matrix_params(model)  # the layers' projections + the (tied) embedding used as the vocabulary head
  attended = sum(t + 1 for n in lengths for t in range(n))  # causal: position t attends to t + 1 keys
  attention = 4 * CFG.num_heads * CFG.head_dim * CFG.num_layers * attended
  assert out["forward"] == 2 * weights * tokens + attention
  assert out["backward"] == 2 * out["forward"] and out["total"] == 3 * out["forward"]
  # the vocabulary head counts at trained tokens only
  fewer = learner_step_flops(CFG, lengths, trained_tokens=4)
  assert out["forward"] - fewer["forward"] == 2 * CFG.hidden_size * CFG.vocab_size * (tokens - 4)


def test_lora_counts_adapters_and_input_gradients_of_the_frozen_weights():
  lengths = [7, 3]
  targets = ("q", "v", "down")
  model = lora.attach(Decoder(CFG, rngs=nnx.Rngs(0)), lora.LoRAConfig(rank=4, targets=targets))
  adapters = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, lora.LoRAParam)))
  full = learner_step_flops(CFG, lengths, trained_tokens=6)
  out = learner_step_flops(CFG, lengths, trained_tokens=6, lora_rank=4, lora_targets=targets)
  assert out["forward"] - full["forward"] == 2 * adapters * sum(lengths)
  attention = 4 * CFG.num_heads * CFG.head_dim * CFG.num_layers * sum(t + 1 for n in lengths for t in range(n))
  frozen = full["forward"] - attention
  assert out["backward"] == frozen + 2 * attention + 2 * (2 * adapters * sum(lengths))
