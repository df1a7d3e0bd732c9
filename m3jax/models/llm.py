"""Load a causal LLM + tokenizer by name or path: the embedded default, a GGUF file, or an HF directory."""

from __future__ import annotations

import pathlib

from jax.sharding import Mesh

from m3jax.models.decoder import Decoder
from m3jax.models.tokenizer import load_tokenizer
from m3jax.models.weights.gguf import load_gguf, smollm2_path
from m3jax.models.weights.hf import load_hf

DEFAULT_LLM = "smollm2-135m-instruct"


def load_llm(name_or_path: str = DEFAULT_LLM, mesh: Mesh | None = None, **config_overrides) -> tuple[Decoder, object]:
  """(model, tokenizer). `smollm2-135m-instruct` is the shipped GGUF; else a .gguf file or an HF directory."""
  if name_or_path == DEFAULT_LLM:
    path = smollm2_path()
  else:
    path = pathlib.Path(name_or_path)
    if not path.exists():
      raise FileNotFoundError(f"no model at {path} (give an HF directory, a .gguf file, or {DEFAULT_LLM!r})")
  if path.suffix == ".gguf":
    return load_gguf(path, mesh=mesh, **config_overrides), load_tokenizer(path)
  return load_hf(path, mesh=mesh, **config_overrides), load_tokenizer(path)
