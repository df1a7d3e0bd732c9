"""Test session set-up: 8 fake CPU devices (sharding tests), float32 matmuls, offline hubs."""

import os

# Tests check what programs compute, not how fast: XLA's LLVM back end at -O0 compiles the suite's thousands of
# programs (most of its time is compiling) about a third faster, with results equal to the default level's to
# float32 rounding. Subprocesses inherit it. Benches compile at the default level (bench/accelerator.py --tiny, a
# CPU code-path check, also uses -O0).
FAST_COMPILE = "--xla_backend_optimization_level=0"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  # One XLA compilation cache for this run, shared by pytest's workers and every subprocess a test starts (they
  # inherit the environment): many files and the CLI subprocesses compile the same tiny models at the same shapes.
  # The process that made it (pytest's controller) removes it on exit, so every run starts cold, as CI does.
  import atexit
  import shutil
  import tempfile

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="m3jax-test-xla-")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")

import gc  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402

from m3jax.host_memory import release_executables  # noqa: E402


def _libc_malloc_trim():
  import ctypes
  import ctypes.util
  try:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
  except (OSError, AttributeError):  # not glibc
    return None


_malloc_trim = _libc_malloc_trim()


# The slowest files, slowest first (by their time in a 2-worker run on AMD Zen 2, AVX2 only, the slowest CPU kind
# seen; -O0 compiles). The workers take files in collection order (`./m3 test` turns off xdist's reordering by test
# count, which put the one-test 6-minute no-torch file last, alone on one worker, while the other idled): heaviest
# first leaves only short files for the end. Keep it in step with `--durations` when a file grows past ~60 s.
SLOW_FILES = ("test_no_torch.py", "test_multihost.py", "test_memorize.py", "test_rl_learner.py", "test_rl_train.py",
              "test_control_llm.py", "test_sampling.py", "test_ablate.py", "test_decoder.py", "test_rl_warm_start.py",
              "test_serve_durability.py", "test_writer_sft.py", "test_chunks.py", "test_chat.py",
              "test_accelerator_bench.py")


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(SLOW_FILES)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files and tests keep their order


@pytest.fixture(autouse=True)
def _bounded_memory_maps():
  """Drops jax's caches once the process holds half the kernel's memory-map limit (`release_executables`: 34
  decoder and sampler tests alone map 15k regions; the whole suite passed the 65530 default on Intel Xeon and AMD
  Zen 4). The tests that follow only recompile what they use."""
  yield
  release_executables()


@pytest.fixture(autouse=True, scope="module")
def _compile_caches_per_module():
  """Drops jax's in-memory executables after each test file: a worker otherwise holds every executable of every
  file it ran (several GB by the end of the suite), and the next file recompiles only what it uses, mostly from
  the shared compilation cache above."""
  yield
  jax.clear_caches()
  gc.collect()
  if _malloc_trim is not None:
    _malloc_trim(0)  # hand the freed heap back: in-process CLI calls raise glibc's trim threshold to 1 GiB


@pytest.fixture(scope="session")
def smollm2():
  """The shipped SmolLM2-135M-Instruct (float32) and its tokenizer, loaded once per test session."""
  from m3jax.models.llm import load_llm

  return load_llm()


# Tiny random decoder configs of every supported family (shared by the decoder, sampler and RL tests).
COMMON = dict(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256)
CONFIGS = {
    "llama3_rope": lambda: transformers.LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
    "llama_tied": lambda: transformers.LlamaConfig(**COMMON, tie_word_embeddings=True),
    "qwen2": lambda: transformers.Qwen2Config(**COMMON),
    "qwen3": lambda: transformers.Qwen3Config(**COMMON, head_dim=16),
    "qwen3_yarn": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, rope_parameters={
        "rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64}),
    "llama_linear_rope": lambda: transformers.LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    # initializer_range 0.1 below: pre-activations of order 1, where tanh and erf GELU differ visibly in the logits
    # q/k/v/o and MLP biases, exact (erf) GELU
    "llama_bias_gelu": lambda: transformers.LlamaConfig(**COMMON, attention_bias=True, mlp_bias=True,
                                                        hidden_act="gelu", initializer_range=0.1),
    # Qwen3's attention_bias also biases o_proj; tanh GELU
    "qwen3_bias_gelu_tanh": lambda: transformers.Qwen3Config(**COMMON, head_dim=16, attention_bias=True,
                                                             hidden_act="gelu_pytorch_tanh", initializer_range=0.1),
    # layer 0 full, layer 1 sliding (max_window_layers=1); prompts + generations are longer than the window
    "qwen2_window": lambda: transformers.Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=5,
                                                     max_window_layers=1),
    "mistral_window": lambda: transformers.MistralConfig(**COMMON, sliding_window=6, hidden_act="gelu_new",
                                                         initializer_range=0.1),
}


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
  """Each tiny random HF model saved with save_pretrained, plus its torch module for reference outputs.

  transformers initialises biases to zero, which a loader that drops them would reproduce; they are randomised so
  every bias moves the logits."""
  out = {}
  for name, make in CONFIGS.items():
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(make()).eval()
    with torch.no_grad():
      for param_name, p in model.named_parameters():
        if param_name.endswith(".bias"):
          p.normal_(0.0, 0.1)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = (path, model)
  return out




@pytest.fixture(scope="session")
def tiny_whisper_dir(tmp_path_factory):
  """A tiny random HF Whisper directory whose sizes also divide the test mesh (d_model 32 / fsdp 4, heads 4 /
  tensor 2, vocab 96 / 2)."""
  torch.manual_seed(0)
  config = transformers.WhisperConfig(
      vocab_size=96, num_mel_bins=16, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
      decoder_attention_heads=4, encoder_ffn_dim=48, decoder_ffn_dim=48, max_source_positions=30,
      max_target_positions=24, pad_token_id=1, bos_token_id=2, eos_token_id=1, decoder_start_token_id=2)
  path = tmp_path_factory.mktemp("tiny_whisper")
  transformers.WhisperForConditionalGeneration(config).eval().save_pretrained(path)
  return path

