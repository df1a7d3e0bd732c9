"""Talking faces in rendered episodes and the active-speaker cue (issue 44, part 2).

The renderer's default must not change a byte (every cached entry and published number rests on it): the frame
digests and pool key below were computed with main's code before `talking_faces` existed.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from m3jax.data.episode_render import _clip_frames, episode_audio
from m3jax.data.episodes import EpisodeConfig, make_episode
from m3jax.perception.active_speaker import (ActiveSpeakerConfig, FaceTrack, SpeakerScores, VoiceSegment,
                                             confident_pairs, speaking_scores, tracks_from_detections)

# (config, id, sha256 of every frame of every clip), from main at 5ea477f
PINNED = [
    (EpisodeConfig(seed=3, num_clips=1, num_characters=3, clip_seconds=12.0, utterances_per_clip=(2, 2), width=160,
                   height=96), "episode_0003", "7144492223171767c2e396bc70d36680b53d85c878395722ef87adc101d26fe8"),
    (EpisodeConfig(seed=7, num_clips=2, num_characters=2, clip_seconds=6.0, utterances_per_clip=(1, 1), width=128,
                   height=72), "episode_0007", "bede81bb931f5f6fa92097347f862fb4880f46b35c54e789b04639086f25c753"),
]


def _digest(ep) -> str:
  h = hashlib.sha256()
  for c in range(ep.config.num_clips):
    for frame in _clip_frames(ep, c):
      h.update(frame.tobytes())
  return h.hexdigest()


@pytest.mark.parametrize("cfg,ep_id,digest", PINNED)
def test_default_rendering_is_unchanged(cfg, ep_id, digest):
  ep = make_episode(cfg)
  assert ep.id == ep_id
  assert _digest(ep) == digest
  talking = make_episode(dataclasses.replace(cfg, talking_faces=True))
  assert talking.id == ep_id + "_talking"  # caches keyed by episode id keep both renderings apart
  assert talking.clips == ep.clips and talking.qa_list != ()  # the same script


def test_pool_keys_are_unchanged_by_default_and_change_with_the_flag():
  from m3jax.memorize.pipeline import MemorizeConfig
  from m3jax.memorize.perception_pool import entry_key
  assert entry_key(EpisodeConfig(), MemorizeConfig()) == "ac8f38da1d3d"  # main at 5ea477f
  assert entry_key(EpisodeConfig(seed=5, num_clips=4), MemorizeConfig()) == "b1139b915ad1"
  cfg = EpisodeConfig(num_clips=2, num_characters=2)
  assert cfg.settings_dict() == {k: v for k, v in dataclasses.asdict(cfg).items() if k != "talking_faces"}
  assert dataclasses.replace(cfg, talking_faces=True).settings_dict()["talking_faces"] is True
  assert entry_key(EpisodeConfig(talking_faces=True), MemorizeConfig()) != "ac8f38da1d3d"


# A short 2-face clip at the default resolution (dlib needs ~80-px faces): 12 s, two utterances, one per person.
CLIP = EpisodeConfig(seed=1_000_000, num_clips=1, num_characters=2, clip_seconds=12.0, utterances_per_clip=(2, 2),
                     talking_faces=True)


def _perceive(ep):
  """(frames at 5 fps, times, face tracks from dlib at 1 fps, voice segments from the script: voice id = the
  speaker's index in the cast, track -> name by screen order)."""
  from m3jax.perception.faces import cluster_faces
  from m3jax.perception.faces import DlibFaceBackend, detect_faces
  cfg = ep.config
  frames = np.stack(list(_clip_frames(ep, 0)))
  times = np.arange(len(frames)) / cfg.fps
  idx = np.arange(0, len(frames), cfg.fps)
  found = detect_faces([frames[i] for i in idx], min_det_score=0.5, min_face_size=40, min_quality=20.0,
                       backend=DlibFaceBackend(upsample=0))
  tracks = tracks_from_detections(found, cluster_faces(np.stack([f.embedding for f in found]), 0.94), times[idx])
  order = sorted(tracks, key=lambda t: t.boxes[:, 0].mean())
  present = ep.clips[0].present
  who = {t.track_id: present[i] for i, t in enumerate(order)} if len(order) == len(present) else {}
  _, spans = episode_audio(ep)
  cast = [c.name for c in ep.characters]
  segs = [VoiceSegment(cast.index(u.speaker), a, b) for u, (a, b) in zip(ep.clips[0].utterances, spans)]
  return frames, times, tracks, segs, who, cast


@pytest.fixture(scope="module")
def talking_clip():
  ep = make_episode(CLIP)
  assert len(ep.clips[0].present) == 2 and len({u.speaker for u in ep.clips[0].utterances}) == 2
  return ep


def test_only_the_speakers_mouth_moves(talking_clip):
  still = make_episode(dataclasses.replace(CLIP, talking_faces=False))
  a, b = np.stack(list(_clip_frames(talking_clip, 0))), np.stack(list(_clip_frames(still, 0)))
  diff = np.abs(a.astype(int) - b).max(axis=(2, 3))  # (frame, row)
  _, spans = episode_audio(talking_clip)
  t = np.arange(len(a)) / CLIP.fps
  speaking = np.zeros(len(a), bool)
  for s, e in spans:
    speaking |= (t >= s) & (t < e)
  assert diff[~speaking].max() == 0  # silent frames are the still rendering
  assert (diff[speaking].max(axis=1) > 40).mean() > 0.5  # most speaking frames show an open mouth
  rows = np.flatnonzero(diff.max(axis=0))
  assert rows.min() > CLIP.height * 0.3 and rows.max() < CLIP.height * 0.9  # the mouth/jaw rows only


def test_the_cue_picks_the_speaking_face(talking_clip):
  frames, times, tracks, segs, who, cast = _perceive(talking_clip)
  assert len(tracks) == 2 and who
  scores = speaking_scores(frames, times, tracks, segs)
  pairs = confident_pairs(scores)
  assert sorted((who[t], cast[v]) for t, v, _ in pairs) == sorted((n, n) for n in talking_clip.clips[0].present)
  for t, v, s in pairs:
    assert s >= ActiveSpeakerConfig().threshold
  # per segment too: the speaker's face scores highest on each of its segments
  for i, seg in enumerate(segs):
    best = max(scores.segment, key=lambda t: scores.segment[t][i])
    assert who[best] == cast[seg.voice_id]


def test_the_cue_declines_when_the_speakers_face_is_not_visible(talking_clip):
  script = talking_clip.clips[0]
  off, on = script.utterances[0].speaker, script.utterances[1].speaker
  hidden = dataclasses.replace(talking_clip, clips=(dataclasses.replace(script, present=(on,)),))
  frames, times, tracks, segs, who, cast = _perceive(hidden)
  pairs = confident_pairs(speaking_scores(frames, times, tracks, segs))
  assert [(who[t], cast[v]) for t, v, _ in pairs] == [(on, on)]  # nothing for the voice whose face is off screen


def test_the_cue_declines_on_still_photos():
  ep = make_episode(dataclasses.replace(CLIP, talking_faces=False))
  frames, times, tracks, segs, who, cast = _perceive(ep)
  assert len(tracks) == 2
  scores = speaking_scores(frames, times, tracks, segs)
  assert confident_pairs(scores) == []
  assert max(s for per in scores.pair.values() for s in per.values()) < ActiveSpeakerConfig().threshold


def test_a_confident_pair_needs_the_threshold_and_the_margin():
  def scores(pair):
    return SpeakerScores(pair, {}, {})
  cfg = ActiveSpeakerConfig(threshold=0.5, margin=0.2)
  assert confident_pairs(scores({0: {7: 0.8}, 1: {7: 0.1}}), cfg) == [(0, 7, 0.8)]
  assert confident_pairs(scores({0: {7: 0.8}, 1: {7: 0.65}}), cfg) == []  # two faces move alike: ambiguous
  assert confident_pairs(scores({0: {7: 0.45}, 1: {7: 0.0}}), cfg) == []  # below the threshold
  assert confident_pairs(scores({0: {7: 0.6}}), cfg) == [(0, 7, 0.6)]  # one face: the threshold alone


def test_motion_is_measured_where_the_mouth_moves():
  """A synthetic face: a textured square swaying by whole pixels, its lower part changing only while the voice is
  on. The mouth motion follows the voice; a still copy of the face scores about 0."""
  rng = np.random.default_rng(0)
  tex = rng.uniform(0, 255, (80, 80)).astype(np.float32)
  num, fps = 60, 5
  frames = np.full((num, 200, 300), 128, np.float32)
  on = (np.arange(num) // 10) % 2 == 1
  for f in range(num):
    dx = int(round(2 * np.sin(f / 3)))
    face = tex.copy()
    if on[f]:
      face[50:70, 20:60] = rng.uniform(0, 255, (20, 40))
    frames[f, 60:140, 40 + dx:120 + dx] = face
    frames[f, 60:140, 180 + dx:260 + dx] = tex
  times = np.arange(num) / fps
  box = lambda x: np.tile([[x, 60, x + 80, 130]], (num // fps, 1)).astype(float)  # noqa: E731
  tracks = [FaceTrack(0, times[::fps], box(40)), FaceTrack(1, times[::fps], box(180))]
  segs = [VoiceSegment(3, s / fps, (s + 10) / fps) for s in range(10, num, 20)]
  scores = speaking_scores(frames, times, tracks, segs)
  assert scores.pair[0][3] > 0.8 and abs(scores.pair[1][3]) < 0.3
  assert confident_pairs(scores) == [(0, 3, pytest.approx(scores.pair[0][3], abs=1e-4))]


# ------------------------------------------------------------------------- the cue in memorization (issue 44, 2)
def _memorize(ep, tmp_path, speaker_fps: float):
  """(observations, face/voice node -> character) of `ep` memorized with the cue at `speaker_fps` (0 = off)."""
  from m3jax.data.episode_render import render_episode
  from m3jax.eval.scoring import load_observations
  from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
  from m3jax.memorize.pipeline import MemorizeConfig, Memorizer
  paths = render_episode(ep, tmp_path / "video")
  cfg = MemorizeConfig(perception=PerceptionConfig(speaker_fps=speaker_fps))
  mem = Memorizer(tmp_path / f"mem_{speaker_fps}", cfg, models=PerceptionModels.load())
  mem.memorize(paths["video"], progress=False)
  return load_observations(tmp_path / f"mem_{speaker_fps}"), mem.graph.characters().reverse


def _joined(obs, reverse, ep) -> set[tuple[str, str]]:
  """(the face's person, the voice's person) for every face and voice node one character joins."""
  from m3jax.eval.scoring import face_person, speech_person, utterance_spans
  said = utterance_spans(ep)
  face = {f"face_{f.node_id}": face_person(ep, o, f) for o in obs for f in o.faces}
  voice = {f"voice_{s.node_id}": speech_person(said, o, s) for o in obs for s in o.speech}
  return {(pf, pv) for f, pf in face.items() for v, pv in voice.items()
          if f in reverse and reverse[f] == reverse.get(v)}


def test_memorized_equivalences_come_from_the_cue(talking_clip, tmp_path):
  """Two faces, two voices: the cue joins each face to its own voice (the one-face-one-voice rule joins none)."""
  obs, reverse = _memorize(talking_clip, tmp_path, speaker_fps=5.0)
  present = talking_clip.clips[0].present
  assert obs[0].speakers is not None and len(obs[0].speakers) == 2
  assert _joined(obs, reverse, talking_clip) == {(p, p) for p in present}


def test_no_equivalence_from_a_clip_whose_cue_is_not_sure(talking_clip, tmp_path):
  """One face on screen, and the voice is someone off screen: the one-face-one-voice rule merges two people; the
  cue, sure of nobody, writes no equivalence."""
  script = talking_clip.clips[0]
  listener, speaker = script.present
  utts = tuple(u for u in script.utterances if u.speaker == speaker)
  ep = dataclasses.replace(talking_clip, clips=(dataclasses.replace(script, present=(listener,), utterances=utts),))
  obs, reverse = _memorize(ep, tmp_path, speaker_fps=0.0)
  assert obs[0].speakers is None and _joined(obs, reverse, ep) == {(listener, speaker)}  # the old rule's mistake
  obs, reverse = _memorize(ep, tmp_path, speaker_fps=5.0)
  assert obs[0].speakers == () and _joined(obs, reverse, ep) == set()
