"""Graph journals: a clip's insertions saved in O(clip) and replayed on a snapshot rebuild the same graph."""

import json

import numpy as np
import pytest

from m3jax.memorize.pipeline import FORMAT, VERSION, load_memory
from m3jax.memory import journal
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.graph import FACE, GraphConfig, GraphError, MemoryGraph
from m3jax.memory.store import _columns
from m3jax.memory.store import load_graph, save_graph

EMBED = HashedBowEmbedder((), (), 32)
CONFIG = GraphConfig(text_dim=32, face_dim=8, voice_dim=6, face_threshold=0.9, voice_threshold=0.9,
                     max_face_embeddings=3, initial_capacity=4)


def _unit(rng, n, dim):
  return _norm(rng.normal(size=(n, dim)).astype(np.float32))


def _norm(x):
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _clip(g: MemoryGraph, rng, clip: int, people: np.ndarray, voices: np.ndarray) -> None:
  """One clip as memorization makes it: faces and voices matched (new, merged, merged twice in one call), then
  memories naming them, semantic ones repeated so consolidation reinforces existing nodes."""
  who = rng.choice(len(people), size=3)
  faces = g.add_faces([_norm(people[w] + 0.05 * _unit(rng, 4, people.shape[1])) for w in who],
                      crops=[[f"crop{clip}_{i}"] for i in range(3)])
  spoken = g.add_voices(_norm(voices[who[:2]] + 0.05 * _unit(rng, 2, voices.shape[1])), asr=[f"line {clip}", "hi"])
  g.add_clip(clip, [f"<face_{faces[0]}> walks in clip {clip}.", f"<voice_{spoken[0]}> says hello."],
             [f"<face_{faces[0]}> likes tea.", f"Equivalence: <face_{faces[1]}>, <voice_{spoken[1]}>"], EMBED)


def _state(g: MemoryGraph) -> dict:
  return {"columns": {k: c.valid.tolist() for k, c in _columns(g).items()}, "contents": g.contents,
          "entities": g.text_entities, "clips": g.clip_texts, "characters": g.characters().mappings,
          "json": g.to_json()}


def test_replayed_journals_rebuild_the_graph_exactly(tmp_path):
  rng = np.random.default_rng(0)
  people, voices = _unit(rng, 5, CONFIG.face_dim), _unit(rng, 5, CONFIG.voice_dim)
  live = MemoryGraph(CONFIG)
  live.add_entity("face", _unit(rng, 2, CONFIG.face_dim), ["seed crop"])
  for clip in range(3):
    _clip(live, rng, clip, people, voices)
  save_graph(live, tmp_path / "snapshot")
  names = []
  for clip in range(3, 9):                      # the capacities grow on the way (initial_capacity=4)
    live.journal = []
    _clip(live, rng, clip, people, voices)
    names.append(f"clip_{clip}.npz")
    journal.save(live.journal, tmp_path / names[-1])
    live.journal = None
  assert live.faces.count.growths or live.text_emb.growths
  assert any(r[0] == "entities" and not created for name in names for r in journal.load(tmp_path / name)
             if r[1] == FACE for _, created, _, _ in r[2])             # merges were journaled, not only creations
  rebuilt = load_graph(tmp_path / "snapshot")
  for name in names:
    journal.replay(rebuilt, journal.load(tmp_path / name))
  assert _state(rebuilt) == _state(live)

  # a memory directory: snapshot + journals named by its manifest load as the same graph
  (tmp_path / "mem" / "journal").mkdir(parents=True)
  (tmp_path / "snapshot").rename(tmp_path / "mem" / "graph_00003")
  for name in names:
    (tmp_path / name).rename(tmp_path / "mem" / "journal" / name)
  manifest = {"format": FORMAT, "version": VERSION, "graph": "graph_00003", "graph_config": {},
              "journal": [f"journal/{n}" for n in names], "sources": [], "next_clip": 9}
  (tmp_path / "mem" / "manifest.json").write_text(json.dumps(manifest))
  assert _state(load_memory(tmp_path / "mem")) == _state(live)


def test_damaged_or_misplaced_journals_fail_clearly(tmp_path):
  g = MemoryGraph(CONFIG)
  g.journal = []
  g.add_clip(0, ["a walk."], [], EMBED)
  journal.save(g.journal, tmp_path / "j.npz")
  (tmp_path / "torn.npz").write_bytes((tmp_path / "j.npz").read_bytes()[:40])
  with pytest.raises(journal.JournalError, match="torn.npz is damaged"):
    journal.load(tmp_path / "torn.npz")
  other = MemoryGraph(CONFIG)
  other.add_entity("face", np.eye(8, dtype=np.float32)[:1])
  with pytest.raises(GraphError, match="next node id is 1"):
    journal.replay(other, [("entities", FACE, [(0, True, np.eye(8, dtype=np.float32)[:1], [])])])
