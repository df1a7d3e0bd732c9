"""python train.py sft --config configs/sft_writer_cue.py

The text memory writer of configs/sft_writer.py, trained on the perception issue 44 measured best on dev:
episodes whose speaker's mouth moves (talking faces), heard by Whisper base, with the active-speaker cue at
5 fps writing the face-voice equivalences. Its data and run live apart from the still/tiny.en writer's:

  python -m bench.writer_eval --asr base --talking-faces --speaker-fps 5 --writers template,trained,ceiling \
      --adapter runs/sft_writer_cue/writer.npz

Re-running the same command resumes from the last checkpoint in out_dir.
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.memorize.perceive import PerceptionConfig
from m3jax.sft.run import SFTConfig


def get_config() -> SFTConfig:
  still = load_config(pathlib.Path(__file__).resolve().parent / "sft_writer.py")
  return dataclasses.replace(still, out_dir="runs/sft_writer_cue", data_dir="runs/sft_writer_cue_data",
                             episode=dataclasses.replace(still.episode, talking_faces=True),
                             perception=PerceptionConfig(speaker_fps=5.0), asr="base")
