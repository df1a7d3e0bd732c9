"""SFT of a tiny from-scratch thinker: the tfds (array_record) + grain pipeline feeds the trainer, eval loss
drops substantially, and a run killed after a checkpoint resumes on exactly the same loss curve."""

import json
import shutil

import numpy as np
import pytest

from m3jax.models.omni.processor import ProcessorConfig
from m3jax.sft import data as sft_data
from m3jax.models.omni.chat import ByteTokenizer, MemoryExample, encode_example
from m3jax.sft.run import TinyThinker
from m3jax.sft.trainer import TrainConfig, Trainer

NAMES = ("Anna", "Boris", "Chen", "Dora", "Emil", "Fay")
PROC = ProcessorConfig(video_min_pixels=28 * 28, video_max_pixels=56 * 56, image_min_pixels=28 * 28,
                       image_max_pixels=28 * 28 * 4)
TINY = TinyThinker(hidden=32, layers=1, heads=2, kv_heads=1, vision_hidden=16, vision_depth=1, audio_hidden=16,
                   audio_layers=1)
PROMPT = "Write the memories as JSON."


def _source(n: int, offset: int):
  """Clips whose gold memories follow from the voices' transcripts and the face ids (learnable structure)."""
  def gen():
    for i in range(offset, offset + n):
      rng = np.random.default_rng(i)
      face, voice, name = 2 * (i % 3), 2 * (i % 3) + 1, NAMES[i % len(NAMES)]
      frames = np.repeat(rng.integers(0, 256, (1, 56, 56, 3), dtype=np.uint8), 4, axis=0)
      audio = (0.1 * np.sin(np.arange(16000 * 2) * (0.01 + 0.001 * i))).astype(np.float32)
      crop = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
      said = f"Hello, my name is {name}."
      voices = {f"<voice_{voice}>": [{"start_time": "00:00", "end_time": "00:02", "asr": said}]}
      target = json.dumps({"video_descriptions": [f"<face_{face}> is present.", f"<voice_{voice}> says: \"{said}\""],
                           "high_level_conclusions": [f"Equivalence: <face_{face}>, <voice_{voice}>",
                                                      f"<voice_{voice}>'s name is {name}."]})
      yield f"clip{i}", MemoryExample(frames, audio, ((face, crop),), voices, target)
  return gen


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
  d = tmp_path_factory.mktemp("sft_data")
  return sft_data.prepare(d, {"train": _source(8, 0), "eval": _source(4, 100)}, crop_size=32)


def _trainer(splits, out, steps=8):
  cfg = TINY.thinker_config()
  from flax import nnx

  from m3jax.models.omni.thinker import Thinker
  spec = sft_data.BatchSpec(batch=1, length_buckets=(640, 1024))
  chat = TINY.chat_tokens()
  train = sft_data.batches(splits["train"], cfg, PROMPT, ByteTokenizer(), chat, PROC, spec, seed=0)
  evals = sft_data.batches(splits["eval"], cfg, PROMPT, ByteTokenizer(), chat, PROC, spec, seed=None)
  tcfg = TrainConfig(steps=steps, accum=2, learning_rate=3e-2, warmup_steps=1, loss_chunk=128, eval_every=steps,
                     checkpoint_every=4)
  ev = [evals[i] for i in range(len(evals))]
  return Trainer(Thinker(cfg, rngs=nnx.Rngs(0)), tcfg, out, lambda k: train[k], lambda: ev, progress=False)


def test_dataset_roundtrip_and_prompt_layout(splits):
  rec = sft_data.to_example(splits["train"][0])
  orig = {ex.target: ex for _, ex in _source(8, 0)()}[rec.target]  # tfds shuffles records by key on writing
  assert rec.voices == orig.voices and rec.faces[0][0] == orig.faces[0][0]
  np.testing.assert_array_equal(rec.frames, orig.frames)
  enc = encode_example(rec, PROMPT, ByteTokenizer(), TINY.chat_tokens(), PROC)
  text = ByteTokenizer().decode(enc.ids[enc.loss_mask])
  assert text == rec.target  # loss only on the target (its <|im_end|> is outside the byte range)
  assert enc.loss_mask.sum() == len(rec.target.encode()) + 1


def test_sft_reduces_eval_loss_and_resumes_exactly(splits, tmp_path):
  full = _trainer(splits, tmp_path / "full").run()
  evals = [r["loss"] for r in full if r["kind"] == "eval"]
  assert evals[-1] < 0.7 * evals[0], evals
  train_full = {r["step"]: r["loss"] for r in full if r["kind"] == "train"}
  assert (tmp_path / "full" / "loss.png").stat().st_size > 0
  # "kill" after the step-4 checkpoint: a copy of the run without the step-8 checkpoint resumes from step 4
  shutil.copytree(tmp_path / "full", tmp_path / "resumed")
  shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "8")
  resumed = _trainer(splits, tmp_path / "resumed")
  assert resumed.step == 4
  rest = {r["step"]: r["loss"] for r in resumed.run() if r["kind"] == "train"}
  assert sorted(rest) == [5, 6, 7, 8]
  np.testing.assert_allclose([rest[s] for s in rest], [train_full[s] for s in rest], rtol=1e-5)
  lines = [json.loads(x) for x in open(tmp_path / "resumed" / "metrics.jsonl")]
  assert {"train", "eval"} <= {x["kind"] for x in lines}
