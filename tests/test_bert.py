"""Flax BERT sentence encoder vs sentence-transformers / transformers on real and tiny random weights."""

import copy
import json
import shutil

import numpy as np
import pytest

from m3jax.models.bert import TextEmbedder, TextInputError, default_model_dir

from parity import assert_close_to_reference

TEXTS = [
    "A man is playing a guitar.",
    "Someone plays an instrument.",
    "The stock market fell sharply today after the announcement.",
    "",
    "x",
    "Anna hands the red cup to Ben, who puts it on the kitchen shelf. " * 30,  # > 256 tokens: truncated
    "Ünïcödé and emoji 🙂 survive tokenization.",
]


@pytest.fixture(scope="session")
def minilm():
  return TextEmbedder.from_pretrained()


def test_minilm_matches_sentence_transformers(minilm):
  from sentence_transformers import SentenceTransformer

  st = SentenceTransformer(str(default_model_dir()), device="cpu")
  ref32, ref64 = (m.encode(TEXTS, convert_to_numpy=True) for m in (st, copy.deepcopy(st).double()))
  ours = minilm(TEXTS)
  assert ours.shape == (len(TEXTS), 384) and ours.dtype == np.float32
  assert_close_to_reference(ours, ref32, ref64, what="MiniLM embeddings")
  np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
  assert ours[0] @ ours[1] > ours[0] @ ours[2] + 0.3  # paraphrase much closer than an unrelated sentence


def test_batching_and_buckets_do_not_change_results(minilm):
  together = minilm(TEXTS[:3] * 5)
  alone = np.concatenate([minilm([t]) for t in TEXTS[:3]])
  assert np.abs(together[:3] - alone).max() <= 1e-5
  assert np.abs(together[3:6] - together[:3]).max() <= 1e-6


def test_any_bert_directory_loads(tmp_path):
  import torch
  from tokenizers import Tokenizer
  from transformers import AutoModel, BertConfig, BertModel

  torch.manual_seed(0)
  cfg = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                   intermediate_size=64, max_position_embeddings=64)
  BertModel(cfg).eval().save_pretrained(tmp_path)
  for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(default_model_dir() / name, tmp_path / name)
  (tmp_path / "1_Pooling").mkdir()
  (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
  ours = TextEmbedder.from_pretrained(tmp_path)(TEXTS[:3])
  model = AutoModel.from_pretrained(tmp_path).eval()
  enc = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
  enc.no_padding()  # the shipped tokenizer.json pads to 128 by default
  refs = []
  with torch.no_grad():
    for m in (model, copy.deepcopy(model).double()):
      cls = np.stack([m(input_ids=torch.tensor([enc.encode(t).ids])).last_hidden_state[0, 0].numpy()
                      for t in TEXTS[:3]])
      refs.append(cls / np.linalg.norm(cls, axis=1, keepdims=True))
  assert ours.shape == (3, 32)
  assert_close_to_reference(ours, *refs, what="CLS embeddings")


def test_bad_inputs(minilm, tmp_path):
  assert minilm([]).shape == (0, 384)
  with pytest.raises(TextInputError, match="text 1 is int"):
    minilm(["fine", 3])
  with pytest.raises(TextInputError, match="single string"):
    minilm("not a list")
  with pytest.raises(FileNotFoundError, match="config.json"):
    TextEmbedder.from_pretrained(tmp_path)
