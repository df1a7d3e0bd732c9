"""Hugging Face decoder `config.json` -> DecoderConfig keyword arguments, exact or refused.

Every field of the dict is accounted for: neutral fields (ids, names, dtype, initialiser, cache switches) are
ignored, fields that change the computation are mapped, fields that only have a neutral value here (dropout 0,
`pretraining_tp` 1, ...) must hold it, and any other field — or a mapped field with a value the decoder does not
implement — raises `UnsupportedConfig` naming it. A new transformers field therefore fails loudly at load time
instead of silently giving different logits.

Semantics follow transformers v5 (the reference the tests compare against):
  * attention biases: Qwen2 (and the Qwen2.5-Omni LM) always bias q/k/v and never o; Llama / Qwen3 / SmolLM3
    `attention_bias` biases q, k, v and o; Mistral has none;
  * `mlp_bias` (Llama, SmolLM3) biases gate, up and down;
  * sliding windows: query t sees keys s with t - window < s <= t. Qwen2-style configs window layer i iff
    `layer_types[i] == "sliding_attention"` and `use_sliding_window` (without `layer_types`: i >= max_window_layers);
    Mistral windows every layer when `sliding_window` is set;
  * RoPE: `rope_parameters` (v5) or `rope_scaling` (v4), with `rope_theta` inside or at the top level.
"""

from __future__ import annotations

from typing import Any


class UnsupportedConfig(ValueError):
  """A Hugging Face config field (or value) this decoder does not implement."""


MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "smollm3", "qwen2_5_omni_text", "qwen2_5_omni_thinker")
ACTIVATIONS = ("silu", "swish", "gelu", "gelu_new", "gelu_pytorch_tanh")
ROPE_TYPES = {  # rope_type -> the parameters it reads (rope.py implements each)
    "default": (),
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
             "mscale_all_dim", "truncate"),
}

# Fields that never change the forward pass (identity, bookkeeping, generation defaults, initialisation).
_NEUTRAL = {
    "architectures", "model_type", "dtype", "torch_dtype", "transformers_version", "_name_or_path", "name_or_path",
    "initializer_range", "init_std", "use_cache", "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id",
    "decoder_start_token_id", "output_hidden_states", "output_attentions", "return_dict", "id2label", "label2id",
    "problem_type", "tokenizer_class", "prefix", "task_specific_params", "finetuning_task", "torchscript",
    "use_bfloat16", "tf_legacy_loss", "_attn_implementation", "_attn_implementation_autoset", "attn_implementation",
    "transformers.js_config", "is_llama_config",
}
# Fields accepted only at the value that makes them a no-op (transformers v5 semantics).
_NEUTRAL_VALUE = {
    "attention_dropout": 0.0,  # training-time dropout; the decoder has none
    "pretraining_tp": 1,  # v5 ignores it; other values meant a (numerically equal) sliced matmul in old versions
    "rope_interleaved": False,  # SmolLM2 configs spell out the rotate-half layout
    "is_encoder_decoder": False, "is_decoder": False, "add_cross_attention": False, "tie_encoder_decoder": False,
    "chunk_size_feed_forward": 0, "pruned_heads": {},
}
# Family -> the fields (beyond the common shape fields) that the family's transformers model reads.
_SHAPE = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
          "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
          "rope_scaling", "rope_theta", "max_position_embeddings"}
_QWEN_WINDOW = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
_FAMILY = {
    "llama": _SHAPE | {"attention_bias", "mlp_bias"},
    "mistral": _SHAPE | {"sliding_window"},
    "qwen2": _SHAPE | _QWEN_WINDOW,
    "qwen3": _SHAPE | _QWEN_WINDOW | {"attention_bias"},
    "smollm3": _SHAPE | {"attention_bias", "mlp_bias", "use_sliding_window", "sliding_window", "layer_types",
                         "no_rope_layers", "no_rope_layer_interval"},
    "qwen2_5_omni_text": _SHAPE | _QWEN_WINDOW,
}
_FAMILY["qwen2_5_omni_thinker"] = _FAMILY["qwen2_5_omni_text"]


def decoder_kwargs(hf: dict[str, Any]) -> dict[str, Any]:
  """DecoderConfig keyword arguments for a transformers config dict; raises UnsupportedConfig naming a field."""
  model_type = hf.get("model_type", "llama")
  if model_type not in MODEL_TYPES:
    raise UnsupportedConfig(f"unsupported model_type {model_type!r}; supported: {sorted(MODEL_TYPES)}")
  family = _FAMILY[model_type]
  for key, value in hf.items():
    if key in _NEUTRAL or key in family:
      continue
    if key in _NEUTRAL_VALUE:
      if value != _NEUTRAL_VALUE[key] and value is not None:
        raise UnsupportedConfig(f"{key}={value!r} is not supported (only {_NEUTRAL_VALUE[key]!r})")
      continue
    raise UnsupportedConfig(f"config field {key!r} (= {value!r}) is not supported for model_type {model_type!r}")
  heads = hf["num_attention_heads"]
  layers = hf["num_hidden_layers"]
  act = hf.get("hidden_act", "silu")
  if act not in ACTIVATIONS:
    raise UnsupportedConfig(f"hidden_act={act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
  if model_type == "smollm3" and any(int(x) != 1 for x in hf.get("no_rope_layers") or []):
    raise UnsupportedConfig("no_rope_layers with NoPE layers (a 0 entry) is not supported")
  qwen2_like = model_type in ("qwen2", "qwen2_5_omni_text", "qwen2_5_omni_thinker")
  attention_bias = bool(hf.get("attention_bias", False))
  theta, scaling, mrope = _rope(hf)
  return dict(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], intermediate_size=hf["intermediate_size"],
      num_layers=layers, num_heads=heads, num_kv_heads=hf.get("num_key_value_heads") or heads,
      head_dim=hf.get("head_dim") or hf["hidden_size"] // heads, rope_theta=theta, rope_scaling=scaling,
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=qwen2_like or attention_bias, o_bias=attention_bias and not qwen2_like,
      mlp_bias=bool(hf.get("mlp_bias", False)), qk_norm=model_type == "qwen3", hidden_act=act,
      layer_windows=_layer_windows(hf, model_type, layers), mrope_section=mrope,
      max_position_embeddings=hf.get("max_position_embeddings", 8192), model_type=model_type)


def _rope(hf: dict[str, Any]) -> tuple[float, tuple | None, tuple[int, ...] | None]:
  """(theta, scaling items or None, mrope_section or None), refusing RoPE variants rope.py does not implement."""
  rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
  theta = rope.pop("rope_theta", None) or hf.get("rope_theta", 10000.0)
  mrope = rope.pop("mrope_section", None)
  rope_type = rope.get("rope_type", rope.get("type", "default")) or "default"
  if rope.get("type", rope_type) != rope_type:
    raise UnsupportedConfig(f"rope_scaling.type={rope['type']!r} contradicts rope_type={rope_type!r}")
  if rope_type not in ROPE_TYPES:
    raise UnsupportedConfig(f"rope_scaling.rope_type={rope_type!r} is not supported "
                            f"(supported: {', '.join(ROPE_TYPES)})")
  for key in rope:
    if key not in ("rope_type", "type") + ROPE_TYPES[rope_type]:
      raise UnsupportedConfig(f"rope_scaling.{key}={rope[key]!r} is not supported for rope_type={rope_type!r}")
  if mrope is not None and hf.get("model_type") not in ("qwen2_5_omni_text", "qwen2_5_omni_thinker"):
    raise UnsupportedConfig("rope_scaling.mrope_section is only supported for the Qwen2.5-Omni LM")
  scaling = None if rope_type == "default" else {"rope_type": rope_type,
                                                 **{k: rope[k] for k in ROPE_TYPES[rope_type] if k in rope}}
  return float(theta), scaling, tuple(mrope) if mrope else None


def _layer_windows(hf: dict[str, Any], model_type: str, layers: int) -> tuple[int, ...]:
  """Per-layer sliding window (0 = full attention), as the family's transformers model decides it."""
  window = hf.get("sliding_window")
  if model_type == "mistral":
    return (int(window),) * layers if window else ()
  if not hf.get("use_sliding_window", False):
    window = None  # transformers' __post_init__: sliding_window = sliding_window if use_sliding_window else None
  types = hf.get("layer_types")
  if types is None:
    limit = layers if model_type == "smollm3" else hf.get("max_window_layers", 28)
    types = ["sliding_attention" if window is not None and i >= limit else "full_attention" for i in range(layers)]
  if len(types) != layers or any(t not in ("full_attention", "sliding_attention") for t in types):
    raise UnsupportedConfig(f"layer_types={types!r} is not supported (one of full_attention / sliding_attention "
                            f"per layer)")
  if "sliding_attention" in types and not window:
    raise UnsupportedConfig(f"layer_types has sliding_attention layers but sliding_window={window!r} "
                            f"(use_sliding_window={hf.get('use_sliding_window')!r})")
  windows = tuple(int(window) if t == "sliding_attention" else 0 for t in types)
  return windows if any(windows) else ()
