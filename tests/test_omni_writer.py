"""The `omni` memory writer end to end: `make_writer("omni", omni_model=DIR)` on a tiny random Qwen2.5-Omni thinker
saved as a local Hugging Face directory (weights + tokenizer), run by the Memorizer on a generated episode clip
with the real perception models. The untrained thinker replies noise -> the clip gets the template memories; with
a test double for the completion step only (the prompt is still built, tokenized and collated for real), a valid
JSON reply is parsed and its memories are inserted into the graph, invented ids dropped."""

import json
import re
import types

import pytest
import torch
from transformers import PreTrainedTokenizerFast
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniThinkerConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniThinkerForConditionalGeneration

from m3jax.memorize.pipeline import MemorizeConfig, Memorizer, load_memory, read_manifest
from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
from m3jax.memorize.pipeline import make_writer
from m3jax.data.episode_render import render_episode
from m3jax.data.episodes import EpisodeConfig, make_episode
from m3jax.models.omni.processor import ProcessorConfig
from m3jax.memorize.omni_writer import OmniWriter

SPECIAL = ["<|im_start|>", "<|im_end|>", "<|IMAGE|>", "<|VIDEO|>", "<|AUDIO|>", "<|vision_bos|>", "<|vision_eos|>",
           "<|audio_bos|>", "<|audio_eos|>"]  # ids 256.. after the 256 byte tokens
IDS = {t: 256 + i for i, t in enumerate(SPECIAL)}
PROC = ProcessorConfig(video_min_pixels=28 * 28 * 4, video_max_pixels=28 * 28 * 6, image_min_pixels=28 * 28,
                       image_max_pixels=28 * 28 * 4)
CONFIG = MemorizeConfig(clip_seconds=12.0, perception=PerceptionConfig(face_fps=0.5, split_speakers=False),
                        writer="omni")


def _byte_tokenizer() -> PreTrainedTokenizerFast:
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  b2u = bytes_to_unicode()
  tok = Tokenizer(models.BPE(vocab={b2u[b]: b for b in range(256)}, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(SPECIAL)
  return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory):
  return save_tiny_omni(tmp_path_factory.mktemp("tiny_omni"))


def save_tiny_omni(d) -> str:
  """A tiny random Qwen2.5-Omni thinker with a byte tokenizer, saved as a local HF directory `d`."""
  torch.manual_seed(0)
  cfg = Qwen2_5OmniThinkerConfig(
      audio_config=dict(num_mel_bins=128, encoder_layers=1, encoder_attention_heads=2, encoder_ffn_dim=32,
                        d_model=16, output_dim=32),
      vision_config=dict(depth=1, hidden_size=16, intermediate_size=24, num_heads=2, patch_size=14,
                         temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=32, fullatt_block_indexes=[0]),
      text_config=dict(vocab_size=272, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                       num_attention_heads=2, num_key_value_heads=1,
                       rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3]}),
      audio_token_index=IDS["<|AUDIO|>"], image_token_index=IDS["<|IMAGE|>"], video_token_index=IDS["<|VIDEO|>"],
      audio_start_token_id=IDS["<|audio_bos|>"], audio_end_token_id=IDS["<|audio_eos|>"],
      vision_start_token_id=IDS["<|vision_bos|>"], vision_end_token_id=IDS["<|vision_eos|>"])
  Qwen2_5OmniThinkerForConditionalGeneration(cfg).save_pretrained(str(d))
  tok = _byte_tokenizer()
  assert tok.convert_tokens_to_ids("<|im_end|>") == IDS["<|im_end|>"]
  tok.save_pretrained(str(d))
  return str(d)


@pytest.fixture(scope="module")
def episode(tmp_path_factory):
  ep = make_episode(EpisodeConfig(seed=3, num_clips=1, num_characters=1, clip_seconds=12.0,
                                  utterances_per_clip=(1, 2)))
  return ep, render_episode(ep, tmp_path_factory.mktemp("episode"))["video"]


@pytest.fixture(scope="module")
def models():
  return PerceptionModels.load()


def _writer(omni_dir) -> OmniWriter:
  w = make_writer("omni", omni_model=omni_dir, processor=PROC, max_new_tokens=8, attention_chunk=256,
                  param_dtype="float32", compute_dtype="float32")
  assert isinstance(w, OmniWriter) and w.name == "omni" and w.model.cfg.text.attention_chunk == 256
  return w


def _clip_file(mem_dir):
  return json.loads((mem_dir / "clips" / "clip_00000.json").read_text())


def test_untrained_thinker_falls_back_to_template_memories(omni_dir, episode, models, tmp_path):
  _, video = episode
  writer = _writer(omni_dir)
  report = Memorizer(tmp_path / "mem", CONFIG, writer=writer, models=models).memorize(video, progress=False)
  assert report.clips_done == [0] and read_manifest(tmp_path / "mem")["writer"] == "omni"
  clip = _clip_file(tmp_path / "mem")
  obs = clip["observation"]
  assert obs["faces"] and obs["speech"]  # the model was asked (a clip without either is skipped)
  assert writer.failures == 1 and not writer._observed  # garbage reply -> template memories; media released
  face = obs["faces"][0]["node_id"]
  assert f"<face_{face}> is present." in clip["episodic"]
  graph = load_memory(tmp_path / "mem")
  assert f"<face_{face}> is present." in [c for cs in graph.contents for c in cs]


def test_valid_reply_is_parsed_and_inserted(omni_dir, episode, models, tmp_path):
  """Only the completion step is a double: it reads the real token ids of the prompt (bytes + special ids)."""
  _, video = episode
  writer = _writer(omni_dir)
  seen = {}

  def complete(model, inputs, sampling):
    ids = [int(t) for t in inputs.input_ids[0, :inputs.lengths[0]]]
    text = bytes(t for t in ids if t < 256).decode("utf-8", "replace")
    i_face, i_voice = text.index("Face features:"), text.index("Voice features:")
    faces = [int(x) for x in re.findall(r"<face_(\d+)>:", text[i_face:i_voice])]
    voices, _ = json.JSONDecoder().raw_decode(text[i_voice + len("Voice features:"):])  # then <|im_end|>\n...
    voice = int(next(iter(voices))[len("<voice_"):-1])
    assert ids.count(IDS["<|vision_bos|>"]) == 1 + len(faces)  # the clip, then one image per face crop
    assert ids.index(IDS["<|audio_bos|>"]) == ids.index(IDS["<|vision_bos|>"]) + 1  # audio interleaved in video
    seen.update(faces=faces, voice=voice, voices=voices)
    reply = json.dumps({"video_descriptions": [f"<face_{faces[0]}> talks to the camera."],
                        "high_level_conclusions": [f"Equivalence: <face_{faces[0]}>, <voice_{voice}>",
                                                   "<face_99> is someone else."]})
    return types.SimpleNamespace(tokens=[list(reply.encode()) + [IDS["<|im_end|>"]]])

  writer.generate_fn = complete
  Memorizer(tmp_path / "mem", CONFIG, writer=writer, models=models).memorize(video, progress=False)
  assert writer.failures == 0 and seen["faces"]
  clip = _clip_file(tmp_path / "mem")
  face, voice = seen["faces"][0], seen["voice"]
  assert [f["node_id"] for f in clip["observation"]["faces"]] == seen["faces"]
  assert {s["asr"] for s in seen["voices"][f"<voice_{voice}>"]} <= {s["text"] for s in clip["observation"]["speech"]}
  assert clip["episodic"] == [f"<face_{face}> talks to the camera."]
  assert clip["semantic"] == [f"Equivalence: <face_{face}>, <voice_{voice}>"]  # the invented <face_99> is dropped
  graph = load_memory(tmp_path / "mem")
  texts = [c for cs in graph.contents for c in cs]
  assert f"<face_{face}> talks to the camera." in texts
