"""TMRoPE position ids: parity with transformers' `get_rope_index` (text, image, audio, video, audio-in-video with
ragged chunk counts, left padding)."""

import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

from m3jax.models.omni.placeholders import SpecialTokens, audio_ids, image_ids, video_ids
from m3jax.models.omni.rope import RopeIndexConfig, RopeIndexError, get_rope_index

TOK = dict(audio_token_index=190, image_token_index=191, video_token_index=192, audio_start_token_id=193,
           audio_end_token_id=194, vision_start_token_id=195, vision_end_token_id=196)


@pytest.fixture(scope="module")
def hf_thinker():
  cfg = Qwen2_5OmniThinkerConfig(
      audio_config=dict(num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8,
                        output_dim=16, n_window=4),
      vision_config=dict(depth=1, hidden_size=8, intermediate_size=8, num_heads=2, patch_size=2, out_hidden_size=16),
      text_config=dict(vocab_size=200, hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 1, 2]}),
      **TOK)
  return Qwen2_5OmniThinkerForConditionalGeneration(cfg).eval()


def _hf(model, ids, mask, image_grid, video_grid, use_aiv, audio_lens, spg):
  t = lambda a, dt=torch.long: None if a is None else torch.tensor(np.asarray(a), dtype=dt)
  pos, delta = model.model.get_rope_index(t(ids), t(image_grid), t(video_grid), t(mask), use_aiv, t(audio_lens),
                                          t(spg, torch.float32))
  return pos.numpy(), delta.numpy()


def _check(model, rows, image_grid=None, video_grid=None, use_aiv=False, audio_lens=None, spg=None):
  width = max(len(r) for r in rows)
  ids = np.array([[0] * (width - len(r)) + r for r in rows])  # left padding, like the processor
  mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
  cfg = RopeIndexConfig.from_hf({**TOK, "vision_config": {"spatial_merge_size": 2}})
  pos, delta = get_rope_index(ids, cfg, image_grid, video_grid, mask, use_aiv, audio_lens, spg)
  ref_pos, ref_delta = _hf(model, ids, mask, image_grid, video_grid, use_aiv, audio_lens, spg)
  np.testing.assert_array_equal(pos, ref_pos)
  np.testing.assert_array_equal(delta, ref_delta)
  return pos


def test_rope_index_mixed_media_batch(hf_thinker):
  tok = SpecialTokens.from_hf(TOK)
  n_aud = lambda f: ((f - 1) // 2 + 1 - 2) // 2 + 1
  img, vid, lens = np.array([[1, 4, 6], [1, 2, 2]]), np.array([[3, 4, 4]]), np.array([37, 12])
  row0 = [5, 6] + image_ids(tok, img[0], 2) + [7] + audio_ids(tok, n_aud(37)) + video_ids(tok, vid[0], 2) + [8, 9]
  row1 = [10] + image_ids(tok, img[1], 2) + audio_ids(tok, n_aud(12)) + [11]
  pos = _check(hf_thinker, [row0, row1], img, vid, False, lens, np.array([1.5]))
  assert pos[:, 0].max() > len(row0)  # the video's time stride makes row 0 span more ids than it has tokens


def test_rope_index_audio_in_video(hf_thinker):
  tok = SpecialTokens.from_hf(TOK)
  n_aud = lambda f: ((f - 1) // 2 + 1 - 2) // 2 + 1
  vid = np.array([[4, 2, 4], [2, 2, 2]])
  lens = np.array([420, 30, 16])  # 105 audio tokens -> 3 chunks vs 2 video chunks; then a short one
  spg = np.array([1.0, 2.0])
  row = ([1, 2] + video_ids(tok, vid[0], 2, n_aud(420), 1.0) + [3] + audio_ids(tok, n_aud(30)) +
         video_ids(tok, vid[1], 2, n_aud(16), 2.0) + [4])
  _check(hf_thinker, [row], None, vid, True, lens, spg)


def test_rope_index_text_only_and_errors(hf_thinker):
  _check(hf_thinker, [[1, 2, 3, 4], [5, 6]])
  cfg = RopeIndexConfig.from_hf({**TOK, "vision_config": {"spatial_merge_size": 2}})
  tok = SpecialTokens.from_hf(TOK)
  bad = np.array([[1] + image_ids(tok, [1, 2, 4], 2)])  # 2 placeholders, grid says 2 -> fine; grid 4x4 -> mismatch
  with pytest.raises(RopeIndexError):
    get_rope_index(bad, cfg, image_grid_thw=np.array([[1, 4, 4]]))
