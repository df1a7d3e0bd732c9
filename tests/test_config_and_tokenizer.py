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
