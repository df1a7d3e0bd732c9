"""`m3jax memorize --videos` with several videos in lock-step (m3jax.memorize.lockstep): the model calls are batched
across videos, yet each video's memory directory holds what memorizing it alone gives."""

import json

import numpy as np
import pytest
from memory_dirs import assert_same_memory

from m3jax import cli
from m3jax.data.episode_render import render_episode
from m3jax.data.episodes import EpisodeConfig, make_episode

SET = ["--no-progress", "--set", "clip_seconds=6.0"]


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
  """Three 2-clip episodes (two people each, so ids carry across clips) and a corrupt file sorted among them."""
  out = tmp_path_factory.mktemp("videos")
  for seed in range(3):
    render_episode(make_episode(EpisodeConfig(seed=seed, num_clips=2, num_characters=2, clip_seconds=6.0,
                                              utterances_per_clip=(1, 1), fps=2, width=320, height=240)), out)
  good = sorted(out.glob("*.mp4"))
  (out / f"{good[0].stem}_broken.mp4").write_bytes(b"not a video at all")
  return out, good


def test_videos_in_lockstep_memorize_as_alone_and_a_corrupt_one_fails_alone(videos, tmp_path, capsys):
  """3 videos + 1 corrupt file, 2 in flight (so a finished video's place is refilled), first 1 clip each, then
  resumed to the end: every good video's directory equals memorizing it alone in one go; the corrupt one gets
  its one-line error (exit 2) and costs the others nothing; the batched calls served more than one video."""
  folder, good = videos
  for v in good:
    assert cli.main(["memorize", str(v), "--memory", str(tmp_path / "alone" / v.stem), *SET]) == 0
  capsys.readouterr()
  batched = ["memorize", "--videos", str(folder / "*.mp4"), "--memory", str(tmp_path / "many"), *SET,
             "--set", "videos_in_flight=2"]
  assert cli.main([*batched, "--max-clips", "1"]) == 2
  first = capsys.readouterr()
  assert first.err.count("\n") == 1 and first.err.startswith(f"m3jax: error: {folder / good[0].stem}_broken.mp4: ")
  assert "memorized 3 videos" in first.out and "1 failed" in first.out
  for v in good:
    assert json.loads((tmp_path / "many" / v.stem / "manifest.json").read_text())["next_clip"] == 1
  assert cli.main(batched) == 2
  out = capsys.readouterr().out
  per_call = dict(item.split() for item in out.split("videos per batched call: ")[1].splitlines()[0].split(", "))
  assert all(float(per_call[m]) > 1 for m in ("faces", "vad", "ge2e", "asr", "text")), per_call
  for v in good:
    assert_same_memory(tmp_path / "alone" / v.stem, tmp_path / "many" / v.stem)
  assert cli.main([*batched]) == 2  # all memorized: nothing new, nothing rewritten
  assert out.count("memorized clips") == 3 and capsys.readouterr().out.count("none new") == 3


def test_videos_in_flight_is_validated():
  from m3jax.memorize.pipeline import MemorizeConfig
  with pytest.raises(ValueError, match="videos_in_flight must be >= 1"):
    MemorizeConfig(videos_in_flight=0)


def test_a_failing_batch_is_rerun_per_video_so_the_error_reaches_its_video():
  """Two videos call the text model in one batch, one with a bad input: only that video gets the error."""
  from m3jax.memorize.lockstep import LockstepStats, run_lockstep
  from m3jax.memorize.perceive import PerceptionModels

  def text(texts):
    if any(not isinstance(t, str) for t in texts):
      raise TypeError("not a string")
    return np.array([[len(t)] for t in texts], np.float32)

  models = PerceptionModels(faces=None, vad=None, encoder=None, asr=None, text=text)
  jobs = [lambda b: b.models.text(["ab", "c"]).tolist(), lambda b: b.models.text([3])]
  stats = LockstepStats()
  good, bad = run_lockstep(jobs, models, 2, stats=stats)
  assert good == [[2.0], [1.0]] and isinstance(bad, TypeError)
  assert (stats.calls["text"], stats.requests["text"]) == (1, 2)


def test_ctrl_c_stops_every_video_at_its_next_model_call():
  """A KeyboardInterrupt (here raised inside one video) reaches every other live video at the call it is parked
  at, so each rolls back as it would alone, and then leaves run_lockstep; a video not yet started never starts."""
  from m3jax.memorize.lockstep import run_lockstep
  from m3jax.memorize.perceive import PerceptionModels

  models = PerceptionModels(faces=None, vad=None, encoder=None, asr=None,
                            text=lambda texts: np.zeros((len(texts), 1), np.float32))
  seen = []

  def interrupted(b):
    b.models.text(["a"])
    raise KeyboardInterrupt

  def parked(b):
    try:
      while True:
        b.models.text(["b"])
    except KeyboardInterrupt:
      seen.append("parked")
      raise

  with pytest.raises(KeyboardInterrupt):
    run_lockstep([interrupted, parked, lambda b: seen.append("started")], models, 2)
  assert seen == ["parked"]
