"""Qwen2.5-Omni thinker: logits parity with transformers on a tiny random config (text + image + audio + video in a
right-padded batch; a video with its audio interleaved), and weight loading from a saved HF directory."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

from m3jax.models.omni.placeholders import audio_ids, image_ids, video_ids
from m3jax.models.omni.thinker import ThinkerConfig, ThinkerInputError, ThinkerInputs
from m3jax.models.omni.weights import load_thinker, thinker_from_tensors

from parity import assert_close_to_reference, torch_f32_f64

TOK = dict(audio_token_index=190, image_token_index=191, video_token_index=192, audio_start_token_id=193,
           audio_end_token_id=194, vision_start_token_id=195, vision_end_token_id=196)
HF_CFG = dict(
    audio_config=dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=32, d_model=16,
                      output_dim=32, n_window=4, max_source_positions=64),
    vision_config=dict(depth=2, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=4,
                       temporal_patch_size=2, spatial_merge_size=2, window_size=16, out_hidden_size=32,
                       fullatt_block_indexes=[1]),
    text_config=dict(vocab_size=200, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [1, 1, 2]}),
    initializer_range=0.1, **TOK)  # large enough weights that every medium moves the logits by >0.1
for _sub in ("audio_config", "vision_config", "text_config"):
  HF_CFG[_sub]["initializer_range"] = 0.1

_FORWARD = jax.jit(lambda m, i: m.forward_inputs(i))


@pytest.fixture(scope="module")
def hf_thinker():
  torch.manual_seed(0)
  cfg = Qwen2_5OmniThinkerConfig(**HF_CFG)
  cfg._attn_implementation = "eager"
  for sub in (cfg.audio_config, cfg.vision_config, cfg.text_config):
    sub._attn_implementation = "eager"
  model = Qwen2_5OmniThinkerForConditionalGeneration(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "ln_" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


@pytest.fixture(scope="module")
def thinker(hf_thinker):
  cfg = ThinkerConfig.from_hf(hf_thinker.config.to_dict())
  sd = {k: v.numpy() for k, v in hf_thinker.state_dict().items()}
  return thinker_from_tensors(cfg, sd.__getitem__, sd.keys())


def _n_audio(f):
  return ((f - 1) // 2 + 1 - 2) // 2 + 1


def _case(cfg: ThinkerConfig, use_aiv: bool):
  rng = np.random.default_rng(1)
  tok = cfg.tokens
  img = np.array([[1, 4, 6]])
  vid = np.array([[4, 4, 4]])
  alens = np.array([37, 160])
  spg = np.array([1.0])
  if use_aiv:
    rows = [[3, 4] + image_ids(tok, img[0], 2) + audio_ids(tok, _n_audio(37)) +
            video_ids(tok, vid[0], 2, _n_audio(160), 1.0) + [5, 6], [7, 8, 9]]
  else:
    rows = [[3, 4] + image_ids(tok, img[0], 2) + [10] + audio_ids(tok, _n_audio(37)) + [11, 12],
            [13] + video_ids(tok, vid[0], 2) + audio_ids(tok, _n_audio(160)) + [14]]
  T = 84  # both cases share every shape, so the second one reuses the first one's compilation
  ids = np.array([r + [0] * (T - len(r)) for r in rows], np.int32)
  lengths = np.array([len(r) for r in rows], np.int32)
  patch = cfg.vision.patch_dim
  pix = rng.standard_normal((int(img.prod(-1).sum()), patch)).astype(np.float32)
  pixv = rng.standard_normal((int(vid.prod(-1).sum()), patch)).astype(np.float32)
  feats = rng.standard_normal((16, int(alens.sum()))).astype(np.float32)
  return ids, lengths, img, vid, spg, pix, pixv, feats, alens


def _hf_logits(model, ids, lengths, img, vid, spg, pix, pixv, feats, alens, use_aiv):
  """transformers' logits in float32 and float64."""
  mask = (np.arange(ids.shape[1])[None] < lengths[:, None]).astype(np.int64)
  padded = np.zeros((len(alens), 16, alens.max()), np.float32)
  fmask = np.zeros((len(alens), alens.max()), np.int64)
  off = 0
  for i, n in enumerate(alens):
    padded[i, :, :n] = feats[:, off:off + n]
    fmask[i, :n] = 1
    off += n
  t = torch.from_numpy
  run = lambda m, dt: m(input_ids=t(ids.astype(np.int64)), attention_mask=t(mask), input_features=t(padded).to(dt),
                        feature_attention_mask=t(fmask), pixel_values=t(pix).to(dt), image_grid_thw=t(img),
                        pixel_values_videos=t(pixv).to(dt), video_grid_thw=t(vid),
                        video_second_per_grid=t(spg.astype(np.float32)), use_audio_in_video=use_aiv).logits
  return torch_f32_f64(model, run)


def _real_tokens(x, lengths):
  return np.concatenate([np.asarray(x)[b, :n] for b, n in enumerate(lengths)])


@pytest.mark.parametrize("use_aiv", [False, True])
def test_thinker_logits_parity(hf_thinker, thinker, use_aiv):
  ids, lengths, img, vid, spg, pix, pixv, feats, alens = _case(thinker.cfg, use_aiv)
  inputs = ThinkerInputs.build(thinker.cfg, ids, lengths, pix, img, pixv, vid, spg, feats, alens, use_aiv)
  logits, _ = _FORWARD(thinker, inputs)
  refs = _hf_logits(hf_thinker, ids, lengths, img, vid, spg, pix, pixv, feats, alens, use_aiv)
  assert_close_to_reference(*(_real_tokens(x, lengths) for x in (logits, *refs)), what="thinker logits")


def test_chunked_attention_thinker_logits_parity(hf_thinker):
  """Query blocks of 5 in the LM (84 tokens) and the vision tower (frames of 16 and 24 patches) vs transformers."""
  cfg = ThinkerConfig.from_hf(hf_thinker.config.to_dict(), attention_chunk=5)
  assert cfg.text.attention_chunk == 5 and cfg.vision.attention_chunk == 5
  sd = {k: v.numpy() for k, v in hf_thinker.state_dict().items()}
  chunked = thinker_from_tensors(cfg, sd.__getitem__, sd.keys())
  ids, lengths, img, vid, spg, pix, pixv, feats, alens = _case(cfg, True)
  inputs = ThinkerInputs.build(cfg, ids, lengths, pix, img, pixv, vid, spg, feats, alens, True)
  logits, _ = _FORWARD(chunked, inputs)
  refs = _hf_logits(hf_thinker, ids, lengths, img, vid, spg, pix, pixv, feats, alens, True)
  assert_close_to_reference(*(_real_tokens(x, lengths) for x in (logits, *refs)), what="chunked thinker logits")


def test_thinker_inputs_reject_mismatched_media(thinker):
  ids, lengths, img, vid, spg, pix, pixv, feats, alens = _case(thinker.cfg, False)
  with pytest.raises(ThinkerInputError, match="image"):
    ThinkerInputs.build(thinker.cfg, ids, lengths, pix, np.array([[1, 4, 4]]), pixv, vid, spg, feats, alens)
  with pytest.raises(ThinkerInputError, match="audio"):
    ThinkerInputs.build(thinker.cfg, ids, lengths, pix, img, pixv, vid, spg, None, None)


def test_load_thinker_from_hub_style_directory(hf_thinker, thinker, tmp_path):
  """Original hub naming (thinker.model.layers.*) in bf16 safetensors, plus a talker tensor that must be skipped."""
  import json

  from safetensors.torch import save_file
  sd = {}
  for k, v in hf_thinker.state_dict().items():
    k = k.replace("model.language_model.", "model.").replace("model.visual.", "visual.")
    k = k.replace("model.audio_tower.", "audio_tower.")
    sd["thinker." + k] = v.to(torch.bfloat16).contiguous()
  sd["talker.codec_head.weight"] = torch.zeros(3, 3)
  save_file(sd, str(tmp_path / "model.safetensors"))
  (tmp_path / "config.json").write_text(json.dumps({"thinker_config": hf_thinker.config.to_dict()}))
  loaded = load_thinker(str(tmp_path), param_dtype="float32", compute_dtype="float32")
  assert loaded.cfg == thinker.cfg
  got, want = jax.tree.leaves(nnx.state(loaded, nnx.Param)), jax.tree.leaves(nnx.state(thinker, nnx.Param))
  assert len(got) == len(want)
  to_bf16 = lambda x: np.asarray(jnp.asarray(x).astype(jnp.bfloat16).astype(jnp.float32))
  for g, w in zip(got, want):
    np.testing.assert_array_equal(np.asarray(g), to_bf16(w))
