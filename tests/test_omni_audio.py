"""Qwen2.5-Omni audio encoder: parity with transformers on a tiny random config (several audios, ragged chunk
tails, a chunk of exactly 2*n_window frames), plus length bookkeeping."""

import jax
import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniAudioEncoderConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniAudioEncoder

from m3jax.models.omni.audio import AUDIO_LOGICAL, AudioConfig, AudioEncoder, audio_output_lengths, plan_audio
from m3jax.models.omni.weights import audio_params, place

from parity import assert_close_to_reference, torch_f32_f64

HF_CFG = dict(num_mel_bins=16, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=48, d_model=32,
              output_dim=24, n_window=5, max_source_positions=64, initializer_range=0.1)
LENS = np.array([37, 10, 23, 4])


@pytest.fixture(scope="module")
def hf_model():
  torch.manual_seed(0)
  cfg = Qwen2_5OmniAudioEncoderConfig(**HF_CFG)
  cfg._attn_implementation = "eager"
  model = Qwen2_5OmniAudioEncoder(cfg).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      if "norm" in name or "ln_post" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def test_audio_parity_vs_transformers(hf_model):
  cfg = AudioConfig.from_hf(hf_model.config.to_dict())
  sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  model = AudioEncoder(cfg, params=place(audio_params(sd.__getitem__, cfg, prefix=""), AUDIO_LOGICAL, "float32", None))
  x = np.random.default_rng(0).standard_normal((16, int(LENS.sum()))).astype(np.float32)
  ref32, ref64 = torch_f32_f64(hf_model, lambda m, dt: m(torch.from_numpy(x).to(dt),
                                                        feature_lens=torch.from_numpy(LENS)).last_hidden_state)
  plan = plan_audio(LENS, cfg)
  out = np.asarray(jax.jit(lambda m, x: m(x, plan))(model, x))
  assert out.shape == ref32.shape == (int(audio_output_lengths(LENS).sum()), 24)
  assert plan.output_lengths == tuple(audio_output_lengths(LENS).tolist())
  assert_close_to_reference(out, ref32, ref64, what="audio encoder output")


def test_audio_plan_rejects_bad_lengths():
  cfg = AudioConfig.from_hf(HF_CFG)
  with pytest.raises(ValueError, match="positive"):
    plan_audio(np.array([5, 0]), cfg)
  with pytest.raises(ValueError, match="max_source_positions"):
    plan_audio(np.array([400]), AudioConfig.from_hf(HF_CFG, n_window=100))
