"""Video pre-processing vs the reference pipeline (qwen-omni-utils `process_mm_info(use_audio_in_video=True)` +
transformers' Qwen2_5OmniProcessor, recorded in tests/omni_video/reference.npz by make_reference.py, because
torchvision cannot be installed beside the CPU torch used here): sampled frame indices, pixel_values_videos,
video_grid_thw, second_per_grid, the clip's audio and its frame count, the interleaved <|VIDEO|>/<|AUDIO|>
placeholder ids, and their TMRoPE positions (against transformers' get_rope_index, run live). Plus the torch ops
the pipeline is built on (antialiased bicubic resize, linspace), checked against torch itself."""

import importlib.util
import json
import pathlib

import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

from m3jax.models.omni.audio import audio_output_lengths
from m3jax.models.omni.placeholders import SpecialTokens, video_ids
from m3jax.models.omni.processor import (MediaInputError, ProcessorConfig, process_audio, process_video, read_audio,
                                         read_video, resize_frames, smart_resize, torch_linspace,
                                         video_frame_size)
from m3jax.models.omni.rope import RopeIndexConfig, get_rope_index

from parity import assert_close_to_scale

HERE = pathlib.Path(__file__).parent / "omni_video"


def _module(name):
  spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


clips = _module("clips")
reference = _module("make_reference")
REF = np.load(HERE / "reference.npz")
SPECIAL = json.loads(str(REF["special_tokens"]))
TOK = SpecialTokens(image=SPECIAL.index("<|IMAGE|>"), video=SPECIAL.index("<|VIDEO|>"),
                    audio=SPECIAL.index("<|AUDIO|>"), vision_bos=SPECIAL.index("<|vision_bos|>"),
                    vision_eos=SPECIAL.index("<|vision_eos|>"), audio_bos=SPECIAL.index("<|audio_bos|>"),
                    audio_eos=SPECIAL.index("<|audio_eos|>"))


@pytest.mark.parametrize("name", sorted(clips.CLIPS))
def test_clip_file_matches_reference_pipeline(name, tmp_path):
  path = str(tmp_path / f"{name}.mkv")
  clips.write(name, path)
  lo, hi = reference.BOUNDS[name]
  cfg = ProcessorConfig(video_min_pixels=lo, video_max_pixels=hi)
  frames, idx, fps = read_video(path, cfg)
  np.testing.assert_array_equal(idx, REF[f"{name}_frame_indices"])
  np.testing.assert_array_equal(frames, clips.frames(name)[idx])  # lossless file: the decoded frames are exact
  patches, grid, spg = process_video(frames, cfg)
  np.testing.assert_array_equal(grid, REF[f"{name}_video_grid_thw"][0])
  assert spg == float(REF[f"{name}_video_second_per_grid"][0]) == 1.0
  want = REF[f"{name}_pixel_values_videos"]
  assert patches.shape == want.shape
  # The reference pipeline was recorded (float32, no float64 mode to rerun): bounds relative to the value scale.
  assert_close_to_scale(patches, want, rel=1e-6, what="video patches")

  wav = read_audio(path)
  np.testing.assert_array_equal(wav, REF[f"{name}_waveform_s16"].astype(np.float32) / 32768)
  feats, lens = process_audio([wav], cfg)
  assert int(lens[0]) == int(REF[f"{name}_audio_frames"][0])
  assert_close_to_scale(feats.sum(0), REF[f"{name}_input_features_sum"], rel=1e-5, what="log-mel sums")

  n_audio = int(audio_output_lengths(lens)[0])
  ids = video_ids(TOK, grid, cfg.merge_size, n_audio, spg)
  np.testing.assert_array_equal(ids, REF[f"{name}_input_ids"][0])

  # TMRoPE positions of the processor's ids: m3jax == transformers
  hf_tok = dict(audio_token_index=TOK.audio, image_token_index=TOK.image, video_token_index=TOK.video,
                audio_start_token_id=TOK.audio_bos, audio_end_token_id=TOK.audio_eos,
                vision_start_token_id=TOK.vision_bos, vision_end_token_id=TOK.vision_eos)
  model = Qwen2_5OmniThinkerForConditionalGeneration(Qwen2_5OmniThinkerConfig(
      audio_config=dict(num_mel_bins=8, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=8, d_model=8,
                        output_dim=16, n_window=4),
      vision_config=dict(depth=1, hidden_size=8, intermediate_size=8, num_heads=2, patch_size=2, out_hidden_size=16),
      text_config=dict(vocab_size=len(SPECIAL), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, 1, 2]}),
      **hf_tok)).eval()
  ids_b = REF[f"{name}_input_ids"]
  t = torch.from_numpy
  ref_pos, ref_delta = model.model.get_rope_index(
      t(ids_b), None, t(REF[f"{name}_video_grid_thw"]), t(np.ones_like(ids_b)), True, t(lens.astype(np.int64)),
      t(REF[f"{name}_video_second_per_grid"]))
  pos, delta = get_rope_index(ids_b, RopeIndexConfig.from_hf({**hf_tok, "vision_config": {"spatial_merge_size": 2}}),
                              None, grid[None], None, True, lens, np.asarray([spg], np.float32))
  np.testing.assert_array_equal(pos, ref_pos.numpy())
  np.testing.assert_array_equal(delta, ref_delta.numpy())


def test_resize_frames_is_torch_antialiased_bicubic():
  """torchvision resizes uint8 by float interpolate(bicubic, antialias) + clamp + round: bit-exact here, down- and
  up-scaling, odd sizes, one axis unchanged."""
  rng = np.random.default_rng(0)
  for (H, W, h, w) in [(90, 160, 56, 112), (30, 40, 84, 84), (37, 101, 37, 44), (64, 48, 140, 28), (199, 73, 61, 73)]:
    img = rng.integers(0, 256, (2, H, W, 3), dtype=np.uint8)
    img[1] = np.clip(np.cumsum(rng.integers(-9, 10, (H, W, 3)), axis=1) + 128, 0, 255)  # smooth rows too
    x = torch.from_numpy(img).permute(0, 3, 1, 2).float()
    ref = torch.nn.functional.interpolate(x, size=[h, w], mode="bicubic", align_corners=False, antialias=True)
    ref = ref.clamp(0, 255).round().to(torch.uint8).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(resize_frames(img, h, w), ref)


def test_torch_linspace_and_frame_budget():
  for total, n in [(150, 60), (899, 58), (1000, 768), (33, 6), (7, 2), (2, 2)]:
    np.testing.assert_array_equal(torch_linspace(0, total - 1, n), torch.linspace(0, total - 1, n).numpy())
  cfg = ProcessorConfig()
  assert video_frame_size(60, 720, 1280, cfg) == (560, 1008)  # 30-s clip: the per-frame cap (768*28*28) binds
  # 768 frames: qwen-omni-utils' whole-video budget (128000*28*28*0.9 pixels / 384 frame pairs) binds instead
  assert video_frame_size(768, 720, 1280, cfg) == smart_resize(720, 1280, 28, cfg.video_min_pixels, 235200)
  assert video_frame_size(768, 720, 1280, cfg) == (336, 644)
  with pytest.raises(MediaInputError):
    process_video(np.zeros((2, 56, 56, 3), np.uint8), cfg, fps=0.0)
