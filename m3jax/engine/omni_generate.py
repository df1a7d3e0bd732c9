"""Text generation from multimodal prompts: thinker prefill, then the m3jax Sampler's decode loop.

The prompt (with media) is prefilled by the thinker into the LM's KV cache with TMRoPE positions. The sampler then
drives `RopeDeltaLM`, which places each later token at `cache slot + rope_delta[row]` on all three rotary
streams — HF's decode rule (the delta is how far media pushed positions beyond the token count). The first new
token comes from the prefill logits, so the prompt's own positions are exactly `get_rope_index`'s.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from m3jax.models.decoder import Decoder, KVCache
from m3jax.models.omni.thinker import Thinker, ThinkerInputs
from m3jax.engine.decode import SamplingConfig, sample_token, token_entropy
from m3jax.engine.sampling import DecodeState, SampleOutput, Sampler


class RopeDeltaLM(nnx.Module):
  """The sampler-facing model: the thinker's LM with per-row rotary offsets (no media after the prompt)."""

  def __init__(self, lm: Decoder, rope_deltas: np.ndarray):
    self.lm = lm
    self.rope_deltas = nnx.Variable(jnp.asarray(rope_deltas, jnp.int32))

  def init_cache(self, batch: int, max_len: int, dtype=None) -> KVCache:
    return self.lm.init_cache(batch, max_len, dtype)

  def __call__(self, tokens, cache: KVCache, chunk_len=None):
    T = tokens.shape[1]
    pos = cache.length[:, None] + jnp.arange(T, dtype=jnp.int32)[None] + self.rope_deltas[...][:, None]
    return self.lm(tokens, cache, chunk_len, positions=pos)


@nnx.jit
def _prefill(model: Thinker, inputs: ThinkerInputs, cache: KVCache):
  h, cache = model.hidden(inputs.input_ids, inputs.lengths, inputs.positions, inputs.plans, inputs.pixel_values,
                          inputs.audio_features, cache)
  last = jnp.take_along_axis(h, (inputs.lengths - 1)[:, None, None], axis=1)
  return model.lm.logits(last)[:, 0], cache


def generate(model: Thinker, inputs: ThinkerInputs, config: SamplingConfig, tokenizer=None) -> SampleOutput:
  """Continuations of every row of a (right-padded) multimodal batch. Row count must be a sampler batch bucket."""
  B, T = inputs.input_ids.shape
  if B not in config.batch_buckets:
    raise ValueError(f"batch {B} is not one of the sampler's batch buckets {config.batch_buckets}")
  cap = next((b for b in config.length_buckets if b >= T + config.max_new_tokens), None)
  if cap is None:
    raise ValueError(f"{T} prompt + {config.max_new_tokens} new tokens exceed the largest length bucket")
  cache = model.lm.init_cache(B, cap)
  logits, cache = _prefill(model, inputs, cache)
  first, first_logp = sample_token(logits, jax.random.PRNGKey(config.seed), config)
  first, first_logp = np.asarray(first).tolist(), np.asarray(first_logp, np.float32)
  first_ent = np.asarray(token_entropy(logits, config), np.float32) if config.entropy else None
  history = [inputs.input_ids[b, :inputs.lengths[b]].tolist() for b in range(B)]
  sampler = Sampler(RopeDeltaLM(model.lm, inputs.rope_deltas), config, tokenizer)
  stops = set(config.stop_token_ids)
  if config.max_new_tokens == 1 or all(t in stops for t in first):
    rest_cfg = None
  else:
    rest_cfg = SamplingConfig(**{**config.__dict__, "max_new_tokens": config.max_new_tokens - 1})
  if rest_cfg is None:
    reasons = ["stop" if t in stops else "length" for t in first]
    return SampleOutput([[t] for t in first], [first_logp[b:b + 1] for b in range(B)], reasons,
                        DecodeState(cache, history, B), None,
                        None if first_ent is None else [first_ent[b:b + 1] for b in range(B)])
  rows = [None if t in stops else [t] for t in first]
  out = sampler.continue_(DecodeState(cache, history, B), rows, rest_cfg)
  at = {b: i for i, b in enumerate(b for b in range(B) if rows[b] is not None)}  # the sampler lists fed rows only

  def joined(head, rest):
    return [np.concatenate([head[b:b + 1], rest[at[b]]]) if b in at else head[b:b + 1] for b in range(B)]
  tokens = [[t] + (out.tokens[at[b]] if b in at else []) for b, t in enumerate(first)]
  reasons = [out.finish_reason[at[b]] if b in at else "stop" for b in range(B)]
  text = [tokenizer.decode(t) for t in tokens] if tokenizer is not None else None
  return SampleOutput(tokens, joined(first_logp, out.logprobs), reasons, out.state, text,
                      None if first_ent is None else joined(first_ent, out.entropies))
