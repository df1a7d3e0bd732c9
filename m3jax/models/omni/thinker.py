"""Qwen2.5-Omni thinker: audio + vision encoders whose outputs replace placeholder-token embeddings, and the
Qwen2.5 LM (m3jax.models.decoder.Decoder with mRoPE) over the merged sequence.

Host side (`ThinkerInputs.build`): media plans and TMRoPE ids from token ids + media shapes, plus the count checks
(placeholders vs encoder outputs), so the jitted forward only sees static-shaped arrays. Rows are right-padded
(`lengths` = real tokens per row), which is what the Decoder's `chunk_len` expects.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
import flax.struct
from flax import nnx
from jaxtyping import Array, Float, Int

from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.models.omni.audio import AudioConfig, AudioEncoder, AudioPlan, plan_audio
from m3jax.models.omni.placeholders import SpecialTokens
from m3jax.models.omni.rope import RopeIndexConfig, get_rope_index
from m3jax.models.omni.vision import VisionConfig, VisionEncoder, VisionPlan, plan_vision


class ThinkerInputError(ValueError):
  """Token ids and media do not fit together (placeholder counts, missing media)."""


@dataclass(frozen=True)
class ThinkerConfig:
  text: DecoderConfig
  vision: VisionConfig
  audio: AudioConfig
  rope: RopeIndexConfig
  tokens: SpecialTokens

  @staticmethod
  def from_hf(thinker: Mapping[str, Any], param_dtype: str = "float32", compute_dtype: str = "float32",
              attention_chunk: int = 0) -> "ThinkerConfig":
    """From the `thinker_config` dict of a Qwen2.5-Omni config.json (or a thinker-only config).

    `attention_chunk` > 0: the LM and the vision tower attend in query blocks of that size (long real prompts)."""
    text = dict(thinker["text_config"])
    text.setdefault("model_type", "qwen2_5_omni_text")
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    if "rope_theta" in text and "rope_theta" not in rope:
      rope["rope_theta"] = text["rope_theta"]
    rope.setdefault("mrope_section", [16, 24, 24])
    text["rope_parameters"] = rope
    text["tie_word_embeddings"] = thinker.get("tie_word_embeddings", False)
    dt = jnp.dtype(param_dtype).type
    return ThinkerConfig(
        text=DecoderConfig.from_hf(text, param_dtype=param_dtype, compute_dtype=compute_dtype),
        vision=VisionConfig.from_hf(thinker["vision_config"], param_dtype=dt),
        audio=AudioConfig.from_hf(thinker["audio_config"], param_dtype=dt),
        rope=RopeIndexConfig.from_hf(thinker), tokens=SpecialTokens.from_hf(thinker)
    ).with_attention_chunk(attention_chunk)

  def with_attention_chunk(self, chunk: int) -> "ThinkerConfig":
    """The same model attending in query blocks of `chunk` (0 = whole sequences) in the LM and the vision tower;
    the audio tower attends within 1-s chunks (<= 100 frames) anyway."""
    if chunk < 0:
      raise ValueError(f"attention_chunk={chunk} must be >= 0")
    return dataclasses.replace(self, text=dataclasses.replace(self.text, attention_chunk=chunk),
                               vision=dataclasses.replace(self.vision, attention_chunk=chunk))


@flax.struct.dataclass
class MediaPlans:
  """Host plans of a batch; a pytree whose index arrays are traced, so same shapes -> no recompilation.

  Images and videos go through the vision tower in ONE packed call (attention never crosses frames, so this equals
  two calls); the first `n_image_tokens` merged outputs are the images'.
  """
  vision: VisionPlan | None
  audio: AudioPlan | None
  n_image_tokens: int = flax.struct.field(pytree_node=False, default=0)


@flax.struct.dataclass
class ThinkerInputs:
  """One right-padded batch ready for the jitted forward (a pytree: pass it straight to jit)."""
  input_ids: np.ndarray  # int32 [B, T]
  lengths: np.ndarray  # int32 [B]
  positions: np.ndarray  # int32 [3, B, T]
  rope_deltas: np.ndarray  # int32 [B] (decode position = cache slot + delta)
  pixel_values: np.ndarray | None  # [image patches + video patches, patch_dim]
  audio_features: np.ndarray | None  # [mel, sum(frames)] packed real frames
  plans: MediaPlans

  @staticmethod
  def build(cfg: ThinkerConfig, input_ids: np.ndarray, lengths: np.ndarray | None = None,
            pixel_values: np.ndarray | None = None, image_grid_thw: np.ndarray | None = None,
            pixel_values_videos: np.ndarray | None = None, video_grid_thw: np.ndarray | None = None,
            video_second_per_grid: np.ndarray | None = None, audio_features: np.ndarray | None = None,
            audio_lengths: np.ndarray | None = None, use_audio_in_video: bool = False) -> "ThinkerInputs":
    """`audio_features` [mel, sum(audio_lengths)]: the real frames of all audios, concatenated."""
    ids = np.asarray(input_ids, np.int32)
    B, T = ids.shape
    lengths = np.full(B, T, np.int32) if lengths is None else np.asarray(lengths, np.int32)
    mask = np.arange(T)[None] < lengths[:, None]
    tok = cfg.tokens
    m2 = cfg.vision.spatial_merge_size ** 2
    image_grid = None if pixel_values is None else np.asarray(image_grid_thw).reshape(-1, 3)
    video_grid = None if pixel_values_videos is None else np.asarray(video_grid_thw).reshape(-1, 3)
    if video_grid is not None and video_second_per_grid is None:
      raise ThinkerInputError("video inputs need video_second_per_grid")
    n_img = 0 if image_grid is None else int(image_grid.prod(-1).sum()) // m2
    n_vid = 0 if video_grid is None else int(video_grid.prod(-1).sum()) // m2
    audio_plan = None
    n_aud = 0
    if audio_features is not None:
      audio_plan = plan_audio(audio_lengths, cfg.audio)
      n_aud = sum(audio_plan.output_lengths)
      if audio_features.shape[1] != int(np.sum(audio_lengths)):
        raise ThinkerInputError(f"audio_features has {audio_features.shape[1]} frames, lengths sum to "
                                f"{int(np.sum(audio_lengths))}")
    for name, token, expected in (("image", tok.image, n_img), ("video", tok.video, n_vid),
                                  ("audio", tok.audio, n_aud)):
      found = int(((ids == token) & mask).sum())
      if found != expected:
        raise ThinkerInputError(f"{found} {name} placeholder tokens but the {name} inputs give {expected}")
    grids = [g for g in (image_grid, video_grid) if g is not None]
    vision_plan = plan_vision(np.concatenate(grids), cfg.vision) if grids else None
    pixels = [p for p in (pixel_values, pixel_values_videos) if p is not None]
    pos, deltas = get_rope_index(ids, cfg.rope, image_grid, video_grid, mask.astype(np.int64), use_audio_in_video,
                                 audio_lengths, video_second_per_grid)
    return ThinkerInputs(ids, lengths, pos.astype(np.int32), deltas[:, 0].astype(np.int32),
                         np.concatenate(pixels) if pixels else None, audio_features,
                         MediaPlans(vision_plan, audio_plan, n_img))


def _scatter(embeds: Float[Array, "B T D"], ids: Int[Array, "B T"], token: int,
             feats: Float[Array, "N D"]) -> Float[Array, "B T D"]:
  """HF masked_scatter: the k-th placeholder (row-major over the batch) takes feature row k."""
  mask = ids == token
  idx = jnp.clip(jnp.cumsum(mask.reshape(-1)) - 1, 0, feats.shape[0] - 1).reshape(ids.shape)
  return jnp.where(mask[..., None], feats[idx].astype(embeds.dtype), embeds)


class Thinker(nnx.Module):
  """Qwen2_5OmniThinkerForConditionalGeneration without the talker."""

  def __init__(self, cfg: ThinkerConfig, *, rngs: nnx.Rngs | None = None, lm: Decoder | None = None,
               visual: VisionEncoder | None = None, audio_tower: AudioEncoder | None = None):
    """Random init from `rngs`, or assembled from already-loaded parts (weights.load_thinker)."""
    rngs = rngs or nnx.Rngs(0)
    self.cfg = cfg
    self.lm = lm if lm is not None else Decoder(cfg.text, rngs=rngs)
    self.visual = visual if visual is not None else VisionEncoder(cfg.vision, rngs=rngs)
    self.audio_tower = audio_tower if audio_tower is not None else AudioEncoder(cfg.audio, rngs=rngs)

  def embed(self, input_ids: Int[Array, "B T"], plans: MediaPlans, pixel_values=None,
            audio_features=None) -> Float[Array, "B T D"]:
    """Token embeddings with every media placeholder replaced by its encoder output."""
    x = self.lm.embed_tokens(input_ids)
    tok = self.cfg.tokens
    if plans.audio is not None:
      x = _scatter(x, input_ids, tok.audio, self.audio_tower(audio_features, plans.audio))
    if plans.vision is not None:
      v = self.visual(pixel_values, plans.vision)
      n = plans.n_image_tokens
      if n:
        x = _scatter(x, input_ids, tok.image, v[:n])
      if v.shape[0] > n:
        x = _scatter(x, input_ids, tok.video, v[n:])
    return x

  def hidden(self, input_ids, lengths, positions, plans: MediaPlans, pixel_values=None, audio_features=None,
             cache=None):
    x = self.embed(input_ids, plans, pixel_values, audio_features)
    return self.lm.hidden(None, cache, lengths, positions, inputs_embeds=x)

  def __call__(self, input_ids, lengths, positions, plans: MediaPlans, pixel_values=None, audio_features=None,
               cache=None):
    h, cache = self.hidden(input_ids, lengths, positions, plans, pixel_values, audio_features, cache)
    return self.lm.logits(h), cache

  def forward_inputs(self, inputs: ThinkerInputs, cache=None):
    """Convenience: run a ThinkerInputs batch (logits f32 [B, T, V], cache)."""
    return self(inputs.input_ids, inputs.lengths, inputs.positions, inputs.plans, inputs.pixel_values,
                inputs.audio_features, cache)
