"""Multimodal generation: thinker prefill + sampler decode with rope deltas gives the same greedy tokens as
re-running the full thinker (TMRoPE positions recomputed) over prompt + generated text."""

import dataclasses

import jax
import numpy as np
from flax import nnx

from m3jax.memorize.observations import ClipObservation, FaceObservation, SpeechObservation
from m3jax.engine.omni_generate import generate
from m3jax.models.omni.processor import ProcessorConfig
from m3jax.models.omni.thinker import Thinker
from m3jax.engine.sampling import SamplingConfig
from m3jax.models.omni.chat import ByteTokenizer, MemoryExample, collate, encode_example
from m3jax.memorize.omni_writer import ClipMedia, OmniWriter
from m3jax.sft.run import TinyThinker

PROC = ProcessorConfig(video_min_pixels=28 * 28, video_max_pixels=56 * 56, image_min_pixels=28 * 28,
                       image_max_pixels=28 * 28 * 4)
TINY = TinyThinker(hidden=32, layers=2, heads=2, kv_heads=1, vision_hidden=16, vision_depth=1, audio_hidden=16,
                   audio_layers=1)


def test_greedy_generation_matches_full_forward():
  rng = np.random.default_rng(0)
  cfg = TINY.thinker_config()
  model = Thinker(cfg, rngs=nnx.Rngs(3))
  chat = TINY.chat_tokens()
  exs = [MemoryExample(rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8),
                       (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32),
                       ((4, rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)),), {"<voice_5>": []}),
         MemoryExample(rng.integers(0, 256, (2, 56, 56, 3), dtype=np.uint8),
                       (0.1 * rng.standard_normal(16000 * 5)).astype(np.float32), (), {})]
  enc = [encode_example(e, "Memories?", ByteTokenizer(), chat, PROC, with_target=False) for e in exs]
  batch = collate(cfg, enc, max(len(e.ids) for e in enc))
  n_new = 6
  out = generate(model, batch.inputs, SamplingConfig(max_new_tokens=n_new, greedy=True,
                                                     length_buckets=(512, 1024, 2048)))
  assert all(len(t) == n_new for t in out.tokens) and out.finish_reason == ["length", "length"]
  # teacher-forced re-run over prompt + generated tokens (TMRoPE positions recomputed from scratch), both rows at once
  full = [dataclasses.replace(e, ids=np.concatenate([e.ids, out.tokens[b]]).astype(np.int32),
                              loss_mask=np.zeros(len(e.ids) + n_new, bool)) for b, e in enumerate(enc)]
  rerun = collate(cfg, full, max(len(f.ids) for f in full))
  logits, _ = jax.jit(lambda m, i: m.forward_inputs(i))(model, rerun.inputs)
  for b, e in enumerate(enc):
    pred = np.asarray(logits)[b, len(e.ids) - 1:len(e.ids) - 1 + n_new].argmax(-1)
    np.testing.assert_array_equal(pred, out.tokens[b])
  # row 0 stops on its first token while row 1 goes on: each row keeps its own continuation (and entropies).
  # Sampled (an untrained model's greedy first token is the same for both rows); the first draw is the same
  # whatever stops, so row 0's first token is made the stop token
  sampled = SamplingConfig(max_new_tokens=n_new, temperature=1.0, seed=5, length_buckets=(512, 1024, 2048))
  first = [t[0] for t in generate(model, batch.inputs, sampled).tokens]
  assert first[0] != first[1]
  cut = generate(model, batch.inputs, dataclasses.replace(sampled, stop_token_ids=(first[0],), entropy=True))
  assert cut.tokens[0] == [first[0]] and cut.tokens[1][0] == first[1] and cut.finish_reason[0] == "stop"
  assert [len(e) for e in cut.entropies] == [len(t) for t in cut.tokens] == [len(p) for p in cut.logprobs]
  assert len(cut.tokens[1]) > 1 and all(np.all(e > 0) for e in cut.entropies)

def test_omni_writer_falls_back_to_template_when_the_reply_is_not_json():
  """An untrained thinker replies bytes noise: the clip gets the template memories and the failure is counted."""
  rng = np.random.default_rng(0)
  cfg = TINY.thinker_config()
  model = Thinker(cfg, rngs=nnx.Rngs(3))
  media = ClipMedia(rng.integers(0, 256, (4, 56, 84, 3), dtype=np.uint8),
                    (0.1 * rng.standard_normal(16000 * 3)).astype(np.float32),
                    {4: rng.integers(0, 256, (40, 30, 3), dtype=np.uint8)})
  clip = ClipObservation(0, 0.0, 3.0, faces=(FaceObservation(4, 10, 0.0, 3.0),),
                         speech=(SpeechObservation(5, 0.0, 2.0, "Hi, my name is Lily."),))
  writer = OmniWriter(model, ByteTokenizer(), TINY.chat_tokens(), lambda c: media, prompt="Memories?",
                      processor=PROC, sampling=SamplingConfig(max_new_tokens=6, greedy=True,
                                                              length_buckets=(512, 1024, 2048)))
  assert len(writer.replies([clip])[0]) > 0
  mem = writer.write([clip, ClipObservation(1, 3.0, 3.0)])
  assert writer.failures == 1 and mem[1].episodic == () and mem[1].semantic == ()
  assert "<face_4> is present." in mem[0].episodic and "<voice_5>'s name is Lily." in mem[0].semantic
  assert writer.state()["failures"] == 1
