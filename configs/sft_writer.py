"""python train.py sft --config configs/sft_writer.py

LoRA SFT of the shipped SmolLM2-135M-Instruct as the text memory writer, on real perception (rendered episodes,
faces, voices, Whisper) paired with the episodes' gold memories (m3jax.sft.writer_data). Sized for a 2-core CPU
(timings: the "Training log" section of m3jax/data/writer/MODEL_CARD.md): 20 training episodes of 3 x 20-s clips
(60 pairs, perceived once and cached under data_dir), 150 steps of batch 2. The adapter file lands in
runs/sft_writer/writer.npz:

  m3jax memorize VIDEO --memory DIR --writer llm --writer-adapter runs/sft_writer/writer.npz
  python -m bench.writer_eval --adapter runs/sft_writer/writer.npz

Re-running the same command resumes from the last checkpoint in out_dir.
"""

from m3jax.data.episodes import EpisodeConfig
from m3jax.sft.run import SFTConfig
from m3jax.sft.trainer import TrainConfig

# the episodes bench/writer_eval.py evaluates on by default (there with held-out seeds)
WRITER_EPISODE = EpisodeConfig(num_clips=3, num_characters=2, clip_seconds=20.0, utterances_per_clip=(2, 3))


def get_config() -> SFTConfig:
  return SFTConfig(
      out_dir="runs/sft_writer",
      data_dir="runs/sft_writer_data",
      writer_llm="smollm2-135m-instruct",
      episode=WRITER_EPISODE,
      train_seeds=tuple(range(1, 21)),
      eval_seeds=(900, 901),
      batch=2,
      length_buckets=(256, 384, 512, 640, 768, 1024),
      lora_rank=16,
      lora_alpha=32.0,
      train=TrainConfig(steps=150, accum=1, learning_rate=2e-3, warmup_steps=10, loss_chunk=128, eval_every=50,
                        checkpoint_every=25),
      progress=True,
  )
