"""Memorized people scored against the episode script: which character a face or speech observation shows
(`face_person`, `speech_person`, from the script's screen slots and utterance times) and the identity purity /
completeness of a memory (`identity_scores`). Shared by the demo, `sft/` (the writer's data and metrics) and the
bench scripts.
"""

from __future__ import annotations

import json
import pathlib
from collections import Counter, defaultdict

from m3jax.data.episode_render import episode_audio
from m3jax.data.episodes import Episode
from m3jax.memorize.observations import ClipObservation
from m3jax.memory.graph import MemoryGraph


def load_observations(memory_dir: str | pathlib.Path) -> list[ClipObservation]:
  files = sorted(pathlib.Path(memory_dir, "clips").glob("clip_*.json"))
  return [ClipObservation.from_json(json.loads(f.read_text())["observation"]) for f in files]


def utterance_spans(ep: Episode) -> dict[int, list[tuple[float, float, str]]]:
  """Per clip, each utterance's (start, end, speaker) in seconds of the video, in script order."""
  spans = iter(episode_audio(ep)[1])
  return {c.clip: [(*next(spans), u.speaker) for u in c.utterances] for c in ep.clips}


def face_person(ep: Episode, obs: ClipObservation, face) -> str:
  """The character a face observation shows: the script lists the people on screen left to right."""
  present = ep.clips[obs.clip].present
  return present[min(len(present) - 1, int(face.x_center * len(present)))]


def speech_person(spans: dict[int, list[tuple[float, float, str]]], obs: ClipObservation, speech) -> str | None:
  """The speaker of the utterance a speech segment overlaps most (None when it overlaps none)."""
  a, b = obs.start + speech.start, obs.start + speech.end
  best = max(((min(b, end) - max(a, start), who) for start, end, who in spans[obs.clip]), default=(0.0, None))
  return best[1] if best[0] > 0 else None


def identity_scores(ep: Episode, observations: list[ClipObservation], graph: MemoryGraph) -> dict[str, float]:
  """Purity and completeness of predicted people (characters after equivalences, else lone face/voice nodes)
  over every face and speech observation, each labelled with the true character from the script: faces by
  screen slot (`face_person`), speech by the utterance it overlaps most (`speech_person`). Missed
  detections are not in these two scores: `face_recall` is the share of (clip, person on screen) pairs for which
  a face was memorized."""
  reverse = graph.characters().reverse
  said = utterance_spans(ep)
  pairs: list[tuple[str, str]] = []
  seen = shown = 0
  for obs in observations:
    shown += len(ep.clips[obs.clip].present)
    seen += len({face_person(ep, obs, f) for f in obs.faces})
    for f in obs.faces:
      pairs.append((reverse.get(f"face_{f.node_id}", f"face_{f.node_id}"), face_person(ep, obs, f)))
    for s in obs.speech:
      who = speech_person(said, obs, s)
      if who is not None:
        pairs.append((reverse.get(f"voice_{s.node_id}", f"voice_{s.node_id}"), who))
  face_recall = seen / shown if shown else 0.0
  if not pairs:
    return {"purity": 0.0, "completeness": 0.0, "observations": 0, "face_recall": face_recall}
  by_pred, by_true = defaultdict(Counter), defaultdict(Counter)
  for pred, true in pairs:
    by_pred[pred][true] += 1
    by_true[true][pred] += 1
  n = len(pairs)
  return {"purity": sum(max(c.values()) for c in by_pred.values()) / n,
          "completeness": sum(max(c.values()) for c in by_true.values()) / n, "observations": n,
          "face_recall": face_recall}
