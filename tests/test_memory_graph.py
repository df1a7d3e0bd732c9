"""Memory graph: fixture import, insertion replay (consolidation), identities, characters, growth, tags."""

import json
import pathlib

import numpy as np
import pytest

from m3jax.memory import GraphConfig, GraphError, MemoryGraph
from m3jax.memory import tags
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.reference_pickle import load_reference_pickle

import reference_search as rs  # tests/reference_search.py: the oracle, independent of m3jax

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"


@pytest.fixture(scope="module")
def embedder():
  return HashedBowEmbedder.builtin()


@pytest.fixture(scope="module")
def graphs():
  return {n: load_reference_pickle(FIX / f"{n}.pkl") for n in ("small", "medium")}


def test_fixture_embedder_matches_test_vectors(embedder):
  """The built-in (`embedder="hashed"`) and the spec file both give the spec's test vectors bit for bit."""
  spec = json.loads((FIX / "small.embedder.json").read_text())
  assert (FIX / "medium.embedder.json").read_text() == (FIX / "small.embedder.json").read_text()
  from_file = HashedBowEmbedder.from_json(FIX / "small.embedder.json")
  for e in (embedder, from_file):
    assert (e.stopwords, e.negations, e.dim) == (set(spec["stopwords"]), set(spec["negations"]), spec["dimension"])
    for tv in spec["test_vectors"]:
      assert e.embed_one(tv["text"]) == tv["embedding"]


@pytest.mark.parametrize("name,nodes,text,edges", [("small", 70, 64, 80), ("medium", 273, 261, 306)])
def test_fixture_import_counts_and_characters(graphs, name, nodes, text, edges):
  g = graphs[name]
  ref = rs.load(FIX / f"{name}.pkl")
  assert (g.num_nodes(), g.num_text, g.num_edges(), g.next_node_id) == (nodes, text, edges, nodes)
  assert len(ref.edges) == 2 * edges
  assert g.characters().mappings == ref.character_mappings     # reference voting and numbering reproduced
  for (a, b), w in ref.edges.items():
    if g.kind(a) in (3, 4):
      assert g.edge_weight.data[g.edge_of[(int(g.node_slot.data[a]), b)]] == w


def test_truncated_characters_match_reference(graphs):
  g = graphs["medium"]
  for bc in (0, 12, 15, 20, 30, 45, 50, 99):
    ref = rs.load(FIX / "medium.pkl")
    rs.truncate(ref, bc)
    rs.refresh_equivalences(ref)
    assert g.characters(bc).mappings == ref.character_mappings, bc
  assert g.characters(30).mappings["character_5"] == ["voice_33"]    # README: Kate voice-only at clip 30
  assert g.characters(30).mappings["character_4"] == ["face_25"]


def _replay(name: str, embedder, mode: str) -> MemoryGraph:
  """Rebuilds a fixture graph from its clip memories: identities as in the pickle, text through add_clip."""
  ref = rs.load(FIX / f"{name}.pkl")
  clips = json.loads((FIX / f"{name}.clip_memories.json").read_text())["clips"]
  g = MemoryGraph(GraphConfig(text_dim=64, mode=mode))
  entity_ids = sorted(n for n, node in ref.nodes.items() if node.type in ("img", "voice"))
  for clip in clips:
    first_text = min(ref.text_nodes_by_clip[clip["clip_id"]])
    while entity_ids and entity_ids[0] < first_text:
      node = ref.nodes[entity_ids.pop(0)]
      assert g.add_entity("face" if node.type == "img" else "voice", node.embeddings) == node.id
    g.add_clip(clip["clip_id"], clip["episodic"], clip["semantic"], embed_fn=embedder)
  return g


@pytest.mark.parametrize("name", ["small", "medium"])
def test_replay_reproduces_reference_consolidation(name, embedder):
  ref = rs.load(FIX / f"{name}.pkl")
  g = _replay(name, embedder, "reference")
  assert g.next_node_id == ref.next_node_id
  assert {c: [int(g.text_node.data[s]) for s in v] for c, v in g.clip_texts.items()} == ref.text_nodes_by_clip
  got = {(int(g.text_node.data[t]), int(e)): float(w) for t, e, w in
         zip(g.edge_text.valid, g.edge_entity.valid, g.edge_weight.valid) if w > 0}
  want = {k: w for k, w in ref.edges.items() if ref.nodes[k[0]].type in ("episodic", "semantic")}
  assert got == want                         # includes +2 reinforcements and weakened (deleted) edges
  assert g.characters().mappings == ref.character_mappings


def test_paper_mode_voting(embedder):
  g = _replay("small", embedder, "paper")
  chars = g.characters().mappings
  # each voice joins only its best face: the weight-1 clip-7 statement no longer merges Alice and Chloe
  assert sorted(map(sorted, chars.values())) == [["face_16", "voice_15"], ["face_2", "voice_0"],
                                                  ["face_3", "voice_1"]]
  # paper steps are +-1: the equivalence said 5 times has weight 5 (reference: 9)
  alice = g.edge_weight.data[g.edge_of[(int(g.node_slot.data[10]), 2)]]
  assert alice == 5.0


def test_ablation_characters(graphs):
  g = graphs["small"]
  for ablation in ("no_equivalence", "no_semantic"):
    assert g.characters(ablation=ablation).mappings == {
        "character_0": ["voice_0"], "character_1": ["voice_1"], "character_2": ["face_2"],
        "character_3": ["face_3"], "character_4": ["voice_15"], "character_5": ["face_16"]}


def _unit(rng, n, d, center=None, noise=0.05):
  x = rng.normal(size=(n, d)) * noise + (center if center is not None else 0)
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def test_identity_matching_batched_and_capped():
  rng = np.random.default_rng(0)
  g = MemoryGraph(GraphConfig(text_dim=8, face_dim=16, voice_dim=8, initial_capacity=2))
  people = _unit(rng, 3, 16, noise=1.0)
  first = g.add_faces([_unit(rng, 3, 16, people[i]) for i in range(3)], crops=[["a"], ["b"], ["c"]])
  assert first == [0, 1, 2]
  again = g.add_faces([_unit(rng, 3, 16, people[i]) for i in (2, 0, 0, 1, 1)])
  assert again == [2, 0, 0, 1, 1]
  assert g.faces.count.data[0] == 9 and g.contents[0] == ["a"]
  g.add_faces([_unit(rng, 3, 16, people[0])] * 3)          # overflow: seeded subsample keeps the cap
  assert g.faces.count.data[0] == 10
  h = MemoryGraph(GraphConfig(text_dim=8, face_dim=16, voice_dim=8))
  rng = np.random.default_rng(0)
  people = _unit(rng, 3, 16, noise=1.0)
  h.add_faces([_unit(rng, 3, 16, people[i]) for i in range(3)])
  h.add_faces([_unit(rng, 3, 16, people[i]) for i in (2, 0, 0, 1, 1)])
  h.add_faces([_unit(rng, 3, 16, people[0])] * 3)
  np.testing.assert_array_equal(g.faces.embeddings(0), h.faces.embeddings(0))   # deterministic subsample
  # voices are matched in order: the second segment of a new speaker joins the node made by the first
  v = _unit(rng, 1, 8, noise=1.0)[0]
  ids = g.add_voices([v, v * 0.99 + 0.01, -v], asr=["hi", "hello", "other"])
  assert ids[0] == ids[1] != ids[2]
  assert g.contents[ids[0]] == ["hi", "hello"]


def test_identity_threshold_and_mean_pairwise():
  def fresh():
    g = MemoryGraph(GraphConfig(text_dim=4, face_dim=2, voice_dim=2))
    g.add_faces([np.array([[1.0, 0.0]])])
    return g

  def unit(c):
    return [c, np.sqrt(1 - c * c)]

  assert fresh().add_faces([np.array([unit(0.29)], np.float32)]) == [1]     # below 0.3: new face node
  assert fresh().add_faces([np.array([unit(0.31)], np.float32)]) == [0]
  assert fresh().add_faces([np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)]) == [0]    # mean of (1, 0) = 0.5
  assert fresh().add_faces([np.array([[0.0, 1.0], unit(0.5)], np.float32)]) == [1]     # mean 0.25
  g = MemoryGraph(GraphConfig(text_dim=4, face_dim=2, voice_dim=2))
  g.add_voices([np.array([1.0, 0.0])])
  assert g.add_voices([np.array(unit(0.59)), np.array([1.0, 0.0])]) == [1, 0]     # voice threshold 0.6


def test_bad_input_is_rejected_without_changes(embedder):
  g = MemoryGraph(GraphConfig(text_dim=64))
  g.add_entity("face", np.eye(512, dtype=np.float32)[:1])
  g.add_clip(0, ["<face_0> waves."], [], embed_fn=embedder)
  before = (g.next_node_id, g.num_text, g.num_edges())
  with pytest.raises(GraphError, match="shape"):
    g.add_clip(1, ["x"], ["y"], episodic_emb=np.zeros((1, 5)), semantic_emb=np.zeros((1, 64)))
  with pytest.raises(GraphError, match="non-negative"):
    g.add_clip(-1, ["x"], [], embed_fn=embedder)
  g.add_clip(3, ["later"], [], embed_fn=embedder)
  with pytest.raises(GraphError, match="ascending"):
    g.add_clip(2, ["too early"], [], embed_fn=embedder)
  with pytest.raises(GraphError, match="NaN"):
    g.add_faces([np.full((1, 512), np.nan)])
  assert (g.next_node_id, g.num_text, g.num_edges()) == (before[0] + 1, before[1] + 1, before[2])


def test_growth_across_capacity_boundaries_keeps_device_mirror_exact(embedder):
  g = MemoryGraph(GraphConfig(text_dim=64, initial_capacity=2))
  g.add_entity("face", np.eye(512, dtype=np.float32)[:1])
  caps = []
  for clip in range(40):
    g.add_clip(clip, [f"<face_0> does thing {clip}", f"event number {clip}"], [f"<face_0> likes item {clip % 3}"],
               embed_fn=embedder)
    if clip % 7 == 0:          # sync in between: later syncs are incremental scatters, then growth re-uploads
      np.testing.assert_array_equal(np.asarray(g.text_emb.device())[: g.num_text], g.text_emb.valid)
      np.testing.assert_array_equal(np.asarray(g.edge_weight.device())[: g.edge_weight.size], g.edge_weight.valid)
    caps.append(g.text_emb.capacity)
  np.testing.assert_array_equal(np.asarray(g.text_emb.device())[: g.num_text], g.text_emb.valid)
  np.testing.assert_array_equal(np.asarray(g.edge_weight.device())[: g.edge_weight.size], g.edge_weight.valid)
  assert g.text_emb.growths <= int(np.log2(g.num_text)) + 1
  assert g.num_text == 83          # 80 episodic + 3 semantic (the other 37 reinforced)
  assert sorted(set(caps)) == [2 ** k for k in range(2, 8)][: len(set(caps))]


def test_whole_tag_parsing_and_translation():
  assert tags.parse_entities("<face_1> and <face_12>, <Voice_3>, <dog_2>, <face_1_2>, <character_x>") == [
      ("face", 1), ("face", 12), ("voice", 3)]
  rev = {"face_1": "character_0", "face_12": "character_5"}
  assert tags.translate("<face_1> meets <face_12> and <voice_1>", rev) == \
      "<character_0> meets <character_5> and <voice_1>"
  maps = {"character_1": ["face_3", "voice_1"], "character_11": ["face_9"]}
  assert tags.back_translate("<character_1> and <character_11>", maps) == [
      "<face_3> and <face_9>", "<voice_1> and <face_9>"]
  many = {f"character_{i}": [f"face_{i}", f"voice_{i}", f"face_{i + 50}"] for i in range(6)}
  q = " ".join(f"<character_{i}>" for i in range(6))
  v1, v2 = tags.back_translate(q, many, 100, seed=1), tags.back_translate(q, many, 100, seed=1)
  assert len(v1) == 100 and v1 == v2
