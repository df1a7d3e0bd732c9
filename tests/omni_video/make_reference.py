"""Writes reference.npz: the reference pipeline's outputs on the clips of clips.py (run it where torch,
torchvision, decord, qwen-omni-utils and transformers are installed; m3jax itself is not needed):

  python tests/omni_video/make_reference.py

The pipeline is M3-Agent's (`mmagent/utils/chat_qwen.py`): `qwen_omni_utils.process_mm_info(messages,
use_audio_in_video=True)` (decord reader, 2 fps sampling, torchvision bicubic resize), then
`Qwen2_5OmniProcessor(text, audio, videos, use_audio_in_video=True)` without the sampling fps (so the processor's
default 2 fps gives video_second_per_grid = 1.0). A tiny word-level tokenizer carries the Omni special tokens, so
input_ids show the interleaved <|VIDEO|>/<|AUDIO|> placeholder runs. Per-clip pixel bounds keep the file small.
"""

import json
import os
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import clips  # noqa: E402

# per clip: (min_pixels, max_pixels) for both qwen-omni-utils and the processor's video size
BOUNDS = {"a": (28 * 28 * 4, 28 * 28 * 12), "b": (28 * 28 * 6, 28 * 28 * 12)}
SPECIAL = ["<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>", "<|vision_bos|>",
           "<|vision_eos|>", "<|IMAGE|>", "<|VIDEO|>", "x"]


def tokenizer():
  from tokenizers import Tokenizer, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  vocab = {t: i for i, t in enumerate(SPECIAL)}
  tok = Tokenizer(models.WordLevel(vocab, unk_token="x"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  return PreTrainedTokenizerFast(
      tokenizer_object=tok, unk_token="x", pad_token="x",
      additional_special_tokens=SPECIAL[:-1],
      extra_special_tokens={"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
                            "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
                            "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"})


def main():
  os.environ["FORCE_QWENVL_VIDEO_READER"] = "decord"
  import qwen_omni_utils
  from transformers import WhisperFeatureExtractor
  from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import Qwen2_5OmniProcessor
  from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
  from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

  out = {"special_tokens": np.asarray(json.dumps(SPECIAL))}
  with tempfile.TemporaryDirectory() as d:
    for name in clips.CLIPS:
      path = os.path.join(d, f"{name}.mkv")
      clips.write(name, path)
      lo, hi = BOUNDS[name]
      messages = [{"role": "user", "content": [{"type": "video", "video": path, "min_pixels": lo,
                                                "max_pixels": hi}]}]
      audios, images, videos = qwen_omni_utils.process_mm_info(messages, use_audio_in_video=True)
      _, meta = qwen_omni_utils.fetch_video(messages[0]["content"][0], return_video_metadata=True)
      processor = Qwen2_5OmniProcessor(
          image_processor=Qwen2VLImageProcessor(), video_processor=Qwen2VLVideoProcessor(),
          feature_extractor=WhisperFeatureExtractor(feature_size=128), tokenizer=tokenizer())
      res = processor(text=["<|vision_bos|><|VIDEO|><|vision_eos|>"], audio=audios, images=images, videos=videos,
                      audio_from_video_indices=[0],
                      return_tensors="np", padding=True, use_audio_in_video=True,
                      videos_kwargs={"size": {"shortest_edge": lo, "longest_edge": hi},
                                     "cap_pixels_per_frame": False})
      out[f"{name}_frame_indices"] = np.asarray(meta["frames_indices"], np.int64)
      pcm = np.asarray(audios[0], np.float64) * 32768  # librosa's s16 / 32768: exact as int16
      assert np.array_equal(pcm, np.round(pcm))
      out[f"{name}_waveform_s16"] = pcm.astype(np.int16)
      out[f"{name}_pixel_values_videos"] = np.asarray(res["pixel_values_videos"], np.float32)
      out[f"{name}_video_grid_thw"] = np.asarray(res["video_grid_thw"], np.int64)
      out[f"{name}_video_second_per_grid"] = np.asarray(res["video_second_per_grid"], np.float32)
      out[f"{name}_input_ids"] = np.asarray(res["input_ids"], np.int64)
      out[f"{name}_audio_frames"] = np.asarray(res["feature_attention_mask"].sum(-1), np.int64)
      feats = res["input_features"][0][:, :int(out[f"{name}_audio_frames"][0])]
      out[f"{name}_input_features_sum"] = np.asarray(feats.astype(np.float64).sum(0), np.float64)
      print(name, {k: v.shape for k, v in out.items() if k.startswith(name)})
  np.savez_compressed(HERE / "reference.npz", **out)
  print("wrote", HERE / "reference.npz", os.path.getsize(HERE / "reference.npz"), "bytes")


if __name__ == "__main__":
  main()
