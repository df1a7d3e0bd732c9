"""Config files + overrides, and tokenizers/chat templates (Qwen BPE ids, enable_thinking pass-through)."""

import dataclasses

import pytest

from m3jax.config import apply_overrides, load_config
from m3jax.engine.sampling import SamplingConfig
from m3jax.models.tokenizer import chat_ids, qwen_tokenizer


@dataclasses.dataclass(frozen=True)
class Inner:
  rate: float = 0.1
  names: tuple[str, ...] = ("a",)


@dataclasses.dataclass(frozen=True)
class Outer:
  steps: int = 3
  mode: str = "paper"
  flag: bool = False
  inner: Inner = Inner()
  sampling: SamplingConfig = SamplingConfig()


def test_config_file_and_typed_overrides(tmp_path):
  path = tmp_path / "c.py"
  path.write_text("from test_config_and_tokenizer import Outer\ndef get_config():\n  return Outer(steps=5)\n")
  cfg = load_config(path, ["inner.rate=2", "flag=true", "mode=reference", "inner.names=['x','y']",
                           "sampling.top_k=20"])
  assert (cfg.steps, cfg.flag, cfg.mode, cfg.inner.rate, cfg.inner.names) == (5, True, "reference", 2.0, ("x", "y"))
  assert isinstance(cfg.inner.rate, float) and cfg.sampling.top_k == 20


@pytest.mark.parametrize("override, message", [
    ("nope=1", "unknown config field 'nope'"), ("steps=abc", "steps"), ("flag=3", "flag"), ("steps", "key=value"),
    ("sampling.temperature=-1", "temperature"),
])
def test_bad_overrides_name_the_field(override, message):
  with pytest.raises(ValueError, match=message):
    apply_overrides(Outer(), [override])


def test_missing_config_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="config file not found"):
    load_config(tmp_path / "absent.py")


def test_qwen_bpe_ids_and_thinking_flag():
  tok = qwen_tokenizer()
  assert tok.encode("Hello, world! 12345 你好") == [9707, 11, 1879, 0, 220, 16, 17, 18, 19, 20, 220, 108386]
  assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
  tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                       "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined and "
                       "enable_thinking is false %}<think>\n\n</think>\n\n{% endif %}{% endif %}")
  msgs = [{"role": "user", "content": "hi"}]
  on, off = chat_ids(tok, msgs, enable_thinking=True), chat_ids(tok, msgs, enable_thinking=False)
  assert tok.decode(on).endswith("<|im_start|>assistant\n") and tok.decode(off).endswith("</think>\n\n")
  assert on[:3] == [151644, tok.encode("user")[0], 198]


def _strings(n: int, seed: int = 0) -> list[str]:
  """Random text over ASCII, whitespace runs, accents, CJK, emoji, the chat markers and other special tokens."""
  import random
  rng = random.Random(seed)
  alphabet = (list("abcdefghijklmnopqrstuvwxyz ABCXYZ0123456789.,!?'\"\n\t-:;()[]{}<>|/\\_")
              + ["é", "ü", "中", "文", "😀", "  ", "\n\n", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
                 "<file_sep>", "'s", "'ll", " The memory does not say."])
  return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 60))) for _ in range(n)]


def test_the_gguf_tokenizer_is_built_without_torch_exactly_as_transformers_converts_it(tmp_path, monkeypatch):
  """SmolLM2's tokenizer, built from its GGUF metadata with the `tokenizers` library, against transformers' own
  GGUF conversion (which imports torch): the same backend, ids, decodes, special tokens and chat template; then
  the same again from the cache directory `load_tokenizer` writes."""
  from transformers import AutoTokenizer

  from m3jax.models.tokenizer import gguf_tokenizer, load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path

  path = smollm2_path()
  ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  monkeypatch.setenv("M3JAX_CACHE", str(tmp_path))
  built = gguf_tokenizer(path)
  load_tokenizer(path)  # writes the cache
  cached = load_tokenizer(path)
  assert any((tmp_path / "tokenizers").iterdir())
  assert built.backend_tokenizer.to_str() == ref.backend_tokenizer.to_str()
  msgs = [{"role": "user", "content": "Where is the wallet?"}, {"role": "assistant", "content": "On the desk."},
          {"role": "user", "content": "Und jetzt? 😀"}]
  for tok in (built, cached):
    assert tok.get_vocab() == ref.get_vocab() and tok.all_special_tokens == ref.all_special_tokens
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "add_bos_token", "add_eos_token"):
      assert getattr(tok, attr) == getattr(ref, attr), attr
    for gen in (True, False):
      assert chat_ids(tok, msgs, add_generation_prompt=gen) == chat_ids(ref, msgs, add_generation_prompt=gen)
    for s in _strings(3000):
      ids = ref.encode(s, add_special_tokens=False)
      assert tok.encode(s, add_special_tokens=False) == ids and tok.encode(s) == ref.encode(s), s
      assert tok.decode(ids) == ref.decode(ids) and tok.decode(ids, skip_special_tokens=True) == ref.decode(
          ids, skip_special_tokens=True), s


def test_a_gguf_tokenizer_it_cannot_reproduce_is_refused_by_name(tmp_path):
  import gguf

  from m3jax.models.tokenizer import UnsupportedTokenizer, gguf_tokenizer

  for model, pre, needle in (("llama", None, "tokenizer.ggml.model='llama'"),
                             ("gpt2", "qwen2", "tokenizer.ggml.pre='qwen2'")):
    path = tmp_path / f"{model}.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model(model)
    if pre:
      w.add_tokenizer_pre(pre)
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedTokenizer, match=needle.replace("(", r"\(")):
      gguf_tokenizer(path)
