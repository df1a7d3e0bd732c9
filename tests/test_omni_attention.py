"""Chunked attention for long multimodal prompts: the query-blocked paths of the LM (kv_attention.prefill_attention
with a KV cache, causal_attention without one) and of the vision tower (common.segment_attention with `chunk`) equal
the whole-sequence paths (values, and gradients where they train, <=1e-5), inside the thinker and its SFT loss too,
and the compiled program really holds less attention memory."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from m3jax.models.causal_attention import causal_attention
from m3jax.models.decoder import attention
from m3jax.models.kv_attention import prefill_attention
from m3jax.models.omni.common import SegmentLayout, segment_attention
from m3jax.engine.omni_generate import generate
from m3jax.models.omni.processor import ProcessorConfig
from m3jax.models.omni.thinker import Thinker
from m3jax.engine.sampling import SamplingConfig
from m3jax.models.omni.chat import ByteTokenizer, MemoryExample, collate, encode_example
from m3jax.sft.loss import thinker_loss
from m3jax.sft.run import TinyThinker

from parity import assert_close_to_reference

PROC = ProcessorConfig(video_min_pixels=28 * 28 * 16, video_max_pixels=28 * 28 * 16, image_min_pixels=28 * 28,
                       image_max_pixels=28 * 28 * 4)
TINY = TinyThinker(hidden=32, layers=1, heads=4, kv_heads=2, vision_hidden=16, vision_depth=1, audio_hidden=16,
                   audio_layers=1)


def _qkv(seed, B, T, S, H, K, Dh):
  rng = np.random.default_rng(seed)
  f = lambda *s: jnp.asarray(rng.standard_normal(s), jnp.float32)
  return f(B, T, H, Dh), f(B, S, K, Dh), f(B, S, K, Dh)


@pytest.mark.parametrize("chunk", [7, 16, 64])
@pytest.mark.parametrize("window", [None, 6])
def test_prefill_attention_equals_attention_with_cache_offsets(chunk, window):
  """Ragged rows written at different cache offsets (prefill after earlier turns), a chunk that does not divide T,
  a row fed nothing beside a long cached one (it must not change the others), with and without a sliding window.
  Forward only: the cache paths never train."""
  B, T, S, H, K, Dh = 4, 50, 384, 4, 2, 8
  q, k, v = _qkv(0, B, T, S, H, K, Dh)
  ck, cv = (jnp.stack([jnp.zeros_like(x), x]).swapaxes(2, 3) for x in (k, v))  # [L=2, B, K, S, Dh], layer 1 read
  start = jnp.asarray([0, 13, 30, 300])
  fed = jnp.asarray([50, 21, 44, 0])
  slots = start[:, None] + jnp.arange(T)[None]
  valid = start + fed
  w = None if window is None else jnp.int32(window)
  want = jax.jit(attention)(q, k, v, slots, valid, w)
  got = jax.jit(prefill_attention, static_argnums=6)(q, ck, cv, jnp.int32(1), slots, valid, chunk, w)
  real = (jnp.arange(T)[None] < fed[:, None])[..., None, None]  # padding queries' outputs are never read
  assert float(jnp.abs(jnp.where(real, want, 0.0)).max()) > 0.1
  np.testing.assert_allclose(np.asarray(jnp.where(real, got, 0.0)), np.asarray(jnp.where(real, want, 0.0)),
                             atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk,dtype", [(7, jnp.float32), (16, jnp.float32), (16, jnp.bfloat16)])
def test_causal_attention_equals_attention(chunk, dtype):
  """Training layout (no cache: query t in slot t, ragged valid lengths, T not a multiple of the chunk): the
  blocked causal attention and its flash-style VJP give the full attention's values and q/k/v gradients; in float32
  both are checked against torch (its float32 error from its float64 run bounds theirs)."""
  B, T, H, K, Dh = 2, 45, 4, 2, 8
  q, k, v = (x.astype(dtype) for x in _qkv(3, B, T, T, H, K, Dh))
  slots, valid = jnp.broadcast_to(jnp.arange(T), (B, T)), jnp.asarray([45, 30])
  w = jnp.asarray(np.random.default_rng(4).standard_normal((B, T, H, Dh)), jnp.float32)
  loss = lambda fn: jax.jit(jax.value_and_grad(lambda *a: jnp.sum(fn(*a).astype(jnp.float32) * w), argnums=(0, 1, 2)))
  got = loss(lambda q, k, v: causal_attention(q, k, v, valid, chunk))(q, k, v)
  want = loss(lambda q, k, v: attention(q, k, v, slots, valid))(q, k, v)
  assert got[1][0].dtype == dtype
  for b in jax.tree.leaves(want):
    assert float(jnp.abs(b.astype(jnp.float32)).max()) > 1e-3  # not trivially zero
  if dtype == jnp.bfloat16:  # a few bfloat16 roundings (eps 7.8e-3) apart
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=3e-2, rtol=3e-2)
    return
  refs = _torch_causal_loss_and_grads(q, k, v, valid, w)
  for name, a, b, r in zip(("loss", "dq", "dk", "dv"), jax.tree.leaves(got), jax.tree.leaves(want), refs):
    assert_close_to_reference(a, *r, what=f"causal_attention {name}")
    assert_close_to_reference(b, *r, what=f"attention {name}")


def _torch_causal_loss_and_grads(q, k, v, valid, w):
  """sum(causal GQA attention * w) and its q/k/v gradients by plain torch autograd, as (float32, float64) pairs."""
  import torch

  def run(dtype):
    q_, k_, v_ = (torch.tensor(np.asarray(x), dtype=dtype, requires_grad=True) for x in (q, k, v))
    T, H, Dh = q_.shape[1:]
    kk, vv = (x.repeat_interleave(H // k_.shape[2], dim=2) for x in (k_, v_))
    t = torch.arange(T)
    mask = (t[None, :] <= t[:, None])[None] & (t < torch.as_tensor(np.asarray(valid))[:, None])[:, None, :]
    scores = torch.einsum("bthd,bshd->bhts", q_, kk) * Dh ** -0.5
    out = torch.einsum("bhts,bshd->bthd", scores.masked_fill(~mask[:, None], -torch.inf).softmax(-1), vv)
    total = (out * torch.tensor(np.asarray(w), dtype=dtype)).sum()
    total.backward()
    return [x.detach().numpy() for x in (total, q_.grad, k_.grad, v_.grad)]

  return list(zip(run(torch.float32), run(torch.float64)))


def test_blocked_attention_compiles_to_less_memory():
  """The point of chunking: XLA's temp buffers for T=2048 drop well below the [B, H, T, T] score size, and the
  causal path's training step (forward + backward) grows linearly with T, not quadratically."""
  B, H, K, Dh = 1, 4, 2, 16

  def temps(T):
    q, k, v = (jnp.zeros((B, T, n, Dh)) for n in (H, K, K))
    slots, valid = jnp.arange(T)[None], jnp.asarray([T])
    temp = lambda f: jax.jit(f).lower(q, k, v).compile().memory_analysis().temp_size_in_bytes
    grad = lambda f: jax.grad(lambda q, k, v: jnp.sum(f(q, k, v)), argnums=(0, 1, 2))
    return (temp(lambda q, k, v: attention(q, k, v, slots, valid)),
            temp(lambda q, k, v: prefill_attention(q, k.swapaxes(1, 2)[None], v.swapaxes(1, 2)[None], 0, slots, valid,
                                                   128)),
            temp(grad(lambda q, k, v: causal_attention(q, k, v, valid, 128))))

  scores = B * H * 2048 * 2048 * 4
  (full, chunked, causal), (_, _, causal_4k) = temps(2048), temps(4096)
  assert full >= scores and chunked < scores / 4 and causal < scores / 2, (full, chunked, causal, scores)
  assert causal_4k < 2.5 * causal, (causal, causal_4k)


@pytest.mark.parametrize("chunk", [3, 8])
def test_segment_attention_chunked_equals_whole_segments(chunk):
  rng = np.random.default_rng(2)
  n, H, K = 37, 2, 8
  layout = SegmentLayout.from_cu_seqlens(np.array([0, 5, 5, 21, 37]))  # segments of 5, 16, 16 (one empty)
  q, k, v = (jnp.asarray(rng.standard_normal((n, H, K)), jnp.float32) for _ in range(3))
  idx, inv = jnp.asarray(layout.index), jnp.asarray(layout.inverse)
  f = lambda c: (lambda q, k, v: segment_attention(q, k, v, idx, inv, K ** -0.5, c))
  np.testing.assert_allclose(np.asarray(jax.jit(f(chunk))(q, k, v)), np.asarray(jax.jit(f(0))(q, k, v)),
                             atol=1e-5, rtol=0)
  w = jnp.asarray(rng.standard_normal((n, H, K)), jnp.float32)
  grads = [jax.jit(jax.grad(lambda *a, c=c: jnp.sum(f(c)(*a) * w), argnums=(0, 1, 2)))(q, k, v)
           for c in (chunk, 0)]
  for a, b in zip(*grads):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def _batch(cfg):
  rng = np.random.default_rng(0)
  exs = [MemoryExample(rng.integers(0, 256, (4, 56, 56, 3), dtype=np.uint8),
                       (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32),
                       ((4, rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)),),
                       {"<voice_5>": [{"start_time": "00:00", "end_time": "00:02", "asr": "hi"}]}, target="{}"),
         MemoryExample(rng.integers(0, 256, (2, 56, 56, 3), dtype=np.uint8),
                       (0.1 * rng.standard_normal(16000 * 2)).astype(np.float32), (), {}, target='{"a": []}')]
  enc = [encode_example(e, "Memories?", ByteTokenizer(), TINY.chat_tokens(), PROC) for e in exs]
  return collate(cfg, enc, 512), enc


def test_thinker_and_sft_gradients_equal_with_chunked_attention():
  """Same weights, LM + vision attention in blocks of 24 queries (video frames are 64 patches, the prompt ~430
  tokens): logits, the SFT loss and every parameter gradient equal the unchunked model's."""
  cfg = TINY.thinker_config()
  batch, _ = _batch(cfg)
  base = Thinker(cfg, rngs=nnx.Rngs(1))
  chunked = Thinker(cfg.with_attention_chunk(24), rngs=nnx.Rngs(1))
  assert chunked.cfg.text.attention_chunk == 24 and chunked.cfg.vision.attention_chunk == 24
  assert max(batch.inputs.plans.vision.full.index.shape[1], int(batch.inputs.lengths.max())) > 24
  @nnx.jit
  def run(model, batch):  # one compilation per model: logits, SFT loss and its gradients
    def f(m):
      total, count = thinker_loss(m, batch.inputs, batch.labels, batch.weights, 64)
      return total / count
    return model.forward_inputs(batch.inputs)[0], nnx.value_and_grad(f)(model)

  (want, (lw, gw)), (got, (lg, gg)) = run(base, batch), run(chunked, batch)
  for b, n in enumerate(batch.inputs.lengths):
    np.testing.assert_allclose(np.asarray(got)[b, :n], np.asarray(want)[b, :n], atol=1e-5, rtol=0)
  np.testing.assert_allclose(float(lg), float(lw), rtol=1e-6)
  leaves_w, leaves_g = jax.tree.leaves(gw), jax.tree.leaves(gg)
  assert len(leaves_w) == len(leaves_g)
  for a, b in zip(leaves_g, leaves_w):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=0)


def test_generation_with_chunked_prefill_matches():
  """The chunked path also serves the KV-cache prefill: greedy continuations are token-identical."""
  cfg = TINY.thinker_config()
  batch, enc = _batch(cfg)
  prompt = [dataclasses.replace(e, ids=e.ids[~e.loss_mask], loss_mask=e.loss_mask[~e.loss_mask]) for e in enc]
  inputs = collate(cfg, prompt, 512).inputs
  sc = SamplingConfig(max_new_tokens=5, greedy=True, length_buckets=(1024,))
  a = generate(Thinker(cfg, rngs=nnx.Rngs(1)), inputs, sc)
  b = generate(Thinker(cfg.with_attention_chunk(24), rngs=nnx.Rngs(1)), inputs, sc)
  assert a.tokens == b.tokens
  np.testing.assert_allclose(np.concatenate(b.logprobs), np.concatenate(a.logprobs), atol=1e-5)
