"""Qwen2.5-Omni vision encoder: parity with transformers on a tiny random config (images + a video, windows with
padding, one full-attention block), plus the host plan's invariants."""

import jax
import numpy as np
import pytest
import torch
from transformers.models.qwen2_5_omni.configuration_qwen2_5_omni import Qwen2_5OmniVisionEncoderConfig
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import Qwen2_5OmniVisionEncoder

from m3jax.models.omni.vision import VisionConfig, VisionEncoder, plan_vision
from m3jax.models.omni.weights import place, vision_params
from m3jax.models.omni.vision import VISION_LOGICAL
from m3jax.parallel import make_mesh

from parity import assert_close_to_reference, torch_f32_f64

HF_CFG = dict(depth=3, hidden_size=32, intermediate_size=40, num_heads=4, patch_size=4, temporal_patch_size=2,
              spatial_merge_size=2, window_size=16, out_hidden_size=24, fullatt_block_indexes=[1],
              initializer_range=0.1)
GRID = np.array([[1, 8, 12], [2, 6, 10], [1, 2, 2]])


@pytest.fixture(scope="module")
def hf_model():
  torch.manual_seed(0)
  cfg = Qwen2_5OmniVisionEncoderConfig(**HF_CFG)
  cfg._attn_implementation = "eager"
  model = Qwen2_5OmniVisionEncoder(cfg).eval()
  with torch.no_grad():  # non-trivial norms and biases so that every weight matters
    for name, p in model.named_parameters():
      if "norm" in name or "ln_q" in name or name.endswith("bias"):
        p.add_(0.1 * torch.randn_like(p))
  return model


def _jax_model(hf_model, mesh=None):
  cfg = VisionConfig.from_hf(hf_model.config.to_dict())
  sd = {k: v.numpy() for k, v in hf_model.state_dict().items()}
  params = place(vision_params(sd.__getitem__, cfg, prefix=""), VISION_LOGICAL, "float32", mesh)
  return VisionEncoder(cfg, params=params)


def _inputs(cfg: VisionConfig):
  n = int(GRID.prod(-1).sum())
  return np.random.default_rng(0).standard_normal((n, cfg.patch_dim)).astype(np.float32)


def test_vision_parity_vs_transformers(hf_model):
  model = _jax_model(hf_model)
  x = _inputs(model.cfg)
  ref32, ref64 = torch_f32_f64(hf_model, lambda m, dt: m(torch.from_numpy(x).to(dt),
                                                        grid_thw=torch.from_numpy(GRID)).pooler_output)
  out = np.asarray(jax.jit(lambda m, x: m(x, plan_vision(GRID, m.cfg)))(model, x))
  assert out.shape == ref32.shape == (int(GRID.prod(-1).sum()) // 4, 24)
  assert_close_to_reference(out, ref32, ref64, what="vision encoder output")


def test_vision_sharded_matches_unsharded(hf_model):
  mesh = make_mesh(data=1, fsdp=2, tensor=4)
  plain, sharded = _jax_model(hf_model), _jax_model(hf_model, mesh)
  assert sharded.wq[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor")
  x = _inputs(plain.cfg)
  plan = plan_vision(GRID, plain.cfg)
  fwd = jax.jit(lambda m, x, p: m(x, p))
  np.testing.assert_allclose(np.asarray(fwd(sharded, x, plan)), np.asarray(fwd(plain, x, plan)), atol=1e-5)


def test_vision_plan_segments_cover_tokens_once():
  cfg = VisionConfig.from_hf(dict(HF_CFG))
  plan = plan_vision(GRID, cfg)
  n = int(GRID.prod(-1).sum())
  assert sorted(plan.token_perm.tolist()) == list(range(n))
  for layout in (plan.full, plan.window):
    flat = layout.index.reshape(-1)
    assert sorted(flat[flat >= 0].tolist()) == list(range(n))
    np.testing.assert_array_equal(flat[layout.inverse], np.arange(n))
  with pytest.raises(ValueError, match="divisible"):
    plan_vision(np.array([[1, 3, 4]]), cfg)
