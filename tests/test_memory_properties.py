"""Hypothesis property tests: consolidation and voting invariants."""

import pathlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from m3jax.memory import GraphConfig, MemoryGraph
from m3jax.memory.fixture_embedder import HashedBowEmbedder

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"
EMBED = HashedBowEmbedder.from_json(FIX / "small.embedder.json")
WORDS = ["likes", "tea", "coffee", "garden", "not", "bike", "reads", "books", "cooks"]


def _graph(mode: str, n_faces: int = 2, n_voices: int = 2) -> MemoryGraph:
  g = MemoryGraph(GraphConfig(text_dim=64, face_dim=4, voice_dim=4, mode=mode))
  for i in range(n_faces + n_voices):
    g.add_entity("face" if i < n_faces else "voice", np.eye(4, dtype=np.float32)[i % 4][None])
  return g


statement = st.tuples(st.lists(st.sampled_from(["<face_0>", "<face_1>", "<voice_2>"]), max_size=2, unique=True),
                      st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["paper", "reference"]), st.lists(st.lists(statement, min_size=1, max_size=4), min_size=1,
                                                          max_size=5))
def test_consolidation_invariants(mode, clips):
  g = _graph(mode)
  step = g.config.weight_step
  for clip, stmts in enumerate(clips):
    texts = [" and ".join(ents) + " " + " ".join(words) for ents, words in stmts]
    n_before = g.num_text
    created = g.add_clip(clip, [], texts, embed_fn=EMBED)
    assert g.num_text == n_before + len(created) and len(created) <= len(texts)
    for slot in range(g.num_text):
      rows = g.text_edges.get(slot, [])
      w = g.edge_weight.data[rows]
      alive = w[w > 0]
      assert len(set(alive.tolist())) <= 1                      # one weight per statement
      if len(alive):
        assert len(alive) == len(set(g.text_entities[slot]))     # edges to all its people, or to none
        assert float(alive[0]).is_integer() and (mode == "paper" or alive[0] % 2 == 1)
  # saying an alive statement again reinforces it instead of duplicating it
  for slot in range(g.num_text):
    rows = g.text_edges.get(slot, [])
    if rows and g.edge_weight.data[rows[0]] > 0:
      w0, n0 = g.edge_weight.data[rows[0]], g.num_text
      assert g.add_clip(len(clips), [], [g.text_of(slot)], embed_fn=EMBED) == []
      assert g.num_text == n0 and g.edge_weight.data[rows[0]] == w0 + step
      break


def _components(pairs, nodes):
  parent = {n: n for n in nodes}

  def find(x):
    while parent[x] != x:
      x = parent[x]
    return x
  for a, b in pairs:
    parent[find(a)] = find(b)
  groups = {}
  for n in nodes:
    groups.setdefault(find(n), set()).add(n)
  return sorted(sorted(v) for v in groups.values())


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(["paper", "reference"]),
       st.lists(st.tuples(st.integers(0, 2), st.integers(3, 5), st.integers(1, 4)), min_size=1, max_size=8))
def test_voting_invariants(mode, votes):
  g = _graph(mode, 3, 3)
  for clip, (f, v, times) in enumerate(votes):
    g.add_clip(clip, [], [f"Equivalence: <face_{f}>, <voice_{v}>"] * times, embed_fn=EMBED)
  chars = g.characters()
  tags_all = sorted(f"face_{i}" for i in range(3)) + sorted(f"voice_{i}" for i in range(3, 6))
  members = [t for m in chars.mappings.values() for t in m]
  assert sorted(members) == sorted(tags_all)                                  # a partition of all people
  assert list(chars.mappings) == [f"character_{k}" for k in range(len(chars.mappings))]
  assert all(chars.reverse[t] == c for c, m in chars.mappings.items() for t in m)
  pairs = [(f"face_{f}", f"voice_{v}") for f, v, _ in votes]
  if mode == "reference":
    assert sorted(map(sorted, chars.mappings.values())) == _components(pairs, tags_all)
  else:
    assert all(sum(t.startswith("face") for t in m) <= 1 for m in chars.mappings.values())
    for v in range(3, 6):                   # each voice sits with the face it was said to be most often
      counts = {}
      for f, vv, times in votes:
        if vv == v:
          counts[f] = counts.get(f, 0) + times
      if counts:
        best = max(counts.values())
        face = [t for t in chars.mappings[chars.reverse[f"voice_{v}"]] if t.startswith("face")]
        assert face and counts[int(face[0].split("_")[1])] == best
