"""Omni pre-processing vs transformers: image patches (PIL backend), 128-bin log-mels + frame counts, and the
placeholder expansion of a video with its audio (Qwen2_5OmniProcessor.replace_video_with_audio_token)."""

import types

import numpy as np
import pytest
from transformers import WhisperFeatureExtractor
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from m3jax.models.omni.placeholders import SpecialTokens, video_ids
from m3jax.models.omni.processor import (MediaInputError, ProcessorConfig, process_audio, process_image,
                                         process_video, sample_frame_indices, smart_resize)
from m3jax.models.logmel import pad_or_trim

from parity import LOG_SPECTRUM_FLOOR, assert_close_to_reference, assert_close_to_scale


@pytest.mark.parametrize("hw", [(100, 173), (40, 700), (300, 260)])
def test_image_patches_match_transformers(hw):
  rng = np.random.default_rng(hw[0])
  img = rng.integers(0, 256, (*hw, 3), dtype=np.uint8)
  cfg = ProcessorConfig(image_max_pixels=28 * 28 * 64)  # small bound so the down-scaling branch is exercised
  ref = Qwen2VLImageProcessorPil(size={"shortest_edge": cfg.image_min_pixels, "longest_edge": cfg.image_max_pixels})
  out = ref(images=[img], return_tensors="np")
  patches, grid = process_image(img, cfg)
  np.testing.assert_array_equal(grid, out["image_grid_thw"][0])
  # Both resize with PIL to uint8 and then only rescale and normalise each value (no sums), so the reference has no
  # float64 mode worth running: the bound is a few float32 roundings of the normalised scale (~2).
  assert_close_to_scale(patches, out["pixel_values"], rel=1e-6, what="image patches")


def test_video_of_a_still_frame_and_sampling_rules():
  """A still video: same grid as the image, every temporal patch identical (the 3rd frame is padded with itself);
  pixels differ from the image's only by the resize (torchvision bicubic for videos, PIL for images, as in the
  reference: qwen-omni-utils resizes images with PIL and video tensors with torchvision)."""
  img = np.random.default_rng(0).integers(0, 256, (60, 90, 3), dtype=np.uint8)
  cfg = ProcessorConfig(video_min_pixels=56 * 56, video_max_pixels=28 * 28 * 16, image_max_pixels=28 * 28 * 16)
  vp, vgrid, spg = process_video(np.stack([img, img, img]), cfg)  # 3 frames -> padded to 4 -> grid_t 2
  ip, igrid = process_image(img, cfg)
  assert vgrid[0] == 2 and spg == 1.0 and tuple(vgrid[1:]) == tuple(igrid[1:])
  np.testing.assert_array_equal(vp[: len(ip)], vp[len(ip):])
  assert np.abs(vp[: len(ip)] - ip).mean() < 0.05  # same picture, a slightly different bicubic
  idx = sample_frame_indices(total_frames=150, video_fps=5.0)  # 30 s at 5 fps -> 60 frames at 2 fps
  assert len(idx) == 60 and idx[0] == 0 and idx[-1] == 149
  assert len(sample_frame_indices(3, 30.0)) == 2
  with pytest.raises(MediaInputError):
    smart_resize(10, 3000, 28, 56 * 56, 28 * 28 * 1280)


def test_audio_features_match_whisper_feature_extractor():
  rng = np.random.default_rng(0)
  wavs = [rng.standard_normal(16000 * 3 + 77).astype(np.float32) * 0.1, rng.standard_normal(4000).astype(np.float32)]
  fe = WhisperFeatureExtractor(feature_size=128)
  ref = fe(wavs, sampling_rate=16000, padding="max_length", return_attention_mask=True, return_tensors="np")
  feats, lens = process_audio(wavs)
  np.testing.assert_array_equal(lens, ref["attention_mask"].sum(-1))
  # the extractor's numpy path is its float64 analogue (as in test_whisper.test_log_mel_matches_feature_extractor)
  ref64 = fe._np_extract_fbank_features(np.stack([pad_or_trim(w) for w in wavs]).astype(np.float64), "cpu")
  real = lambda x: np.concatenate([x[i][:, :n] for i, n in enumerate(lens)], axis=1)
  assert_close_to_reference(feats, real(ref["input_features"]), real(ref64), floor=LOG_SPECTRUM_FLOOR,
                            what="128-bin log-mels")


def test_audio_in_video_placeholders_match_processor():
  names = dict(audio_bos_token="B", audio_eos_token="E", video_token="V", audio_token="A")
  fake = types.SimpleNamespace(video_processor=types.SimpleNamespace(merge_size=2), **names)
  fake.get_chunked_index = types.MethodType(Qwen2_5OmniProcessor.get_chunked_index, fake)
  tok = SpecialTokens(image=1, video=2, audio=3, vision_bos=4, vision_eos=5, audio_bos=6, audio_eos=7)
  to_str = {2: "V", 3: "A", 6: "B", 7: "E"}
  for grid, n_audio, spg in (([6, 4, 4], 130, 1.0), ([2, 2, 4], 20, 2.0), ([8, 2, 2], 50, 0.5)):
    ref = Qwen2_5OmniProcessor.replace_video_with_audio_token(
        fake, {"video_grid_thw": [np.array(grid)], "video_second_per_grid": [spg]}, 0,
        {"num_audio_tokens": [n_audio]}, 0, position_id_per_seconds=25, seconds_per_chunk=2.0)
    ids = video_ids(tok, grid, 2, n_audio, spg)
    assert ids[0] == tok.vision_bos and ids[-1] == tok.vision_eos
    assert "".join(to_str[i] for i in ids[1:-1]) == ref
