"""Search tools: parity with the per-query reference port on the fixture queries, batching, views, ScaNN."""

import json
import pathlib

import numpy as np
import pytest

from m3jax.memory import MemoryGraph, MemorySearcher, SearchConfig, SearchError, SearchRequest
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.index import ExactIndex, ScannIndex, attach_scann
from m3jax.memory.reference_pickle import load_reference_pickle

import reference_search as rs  # tests/reference_search.py: the oracle, independent of m3jax

FIX = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"
EMPTY = "Searched knowledge: {}\n(The search result is empty. Please try searching from another perspective.)"


@pytest.fixture(scope="module")
def embedder():
  return HashedBowEmbedder.from_json(FIX / "small.embedder.json")


@pytest.fixture(scope="module")
def graphs():
  return [load_reference_pickle(FIX / f"{n}.pkl") for n in ("small", "medium")]


def _requests(name: str, graph_index: int):
  qs = rs.fixture_queries(FIX / f"{name}.queries.json")
  return qs, [SearchRequest(graph_index, q["query"], q["route"], q["before_clip"],
                            tuple(q["search_kwargs"]["current_clips"])) for q in qs]


@pytest.mark.parametrize("exclusion", ["backfill", "reference"])
def test_fixture_queries_match_reference_port_in_one_batch(graphs, embedder, exclusion):
  """Both fixtures' queries in ONE search call (two graphs), each checked against the reference algorithm."""
  qs_s, req_s = _requests("small", 0)
  qs_m, req_m = _requests("medium", 1)
  results = MemorySearcher(graphs, embedder, SearchConfig(exclusion=exclusion)).search(req_s + req_m)
  for (name, q), res in zip([("small", q) for q in qs_s] + [("medium", q) for q in qs_m], results):
    want = rs.answer(FIX / f"{name}.pkl", q["query"], q["route"], q["before_clip"],
                     list(q["search_kwargs"]["current_clips"]), embedder, backfill=exclusion == "backfill")
    assert res.text == want, q["id"]
    assert res.memories == (json.loads(want.split("Searched knowledge: ")[1].split("\n(")[0]))


def test_a_batch_meets_only_the_graphs_it_touches(graphs, embedder, monkeypatch):
  """A searcher holding many graphs hands the kernel only those a batch asks about, and answers each request as a
  searcher over that graph alone does (the fixture's medium graph among copies of the small one)."""
  from m3jax.memory import search as search_lib
  calls = []
  kernel = search_lib.search_batch
  monkeypatch.setattr(search_lib, "search_batch", lambda *a, **k: calls.append(len(a[2])) or kernel(*a, **k))
  many = [graphs[0]] * 6 + [graphs[1]] + [graphs[0]] * 3
  _, req_s = _requests("small", 0)
  _, req_m = _requests("medium", 0)
  asked = [SearchRequest(8, r.query, r.route, r.before_clip, r.exclude_clips) for r in req_s[:4]]
  asked += [SearchRequest(6, r.query, r.route, r.before_clip, r.exclude_clips) for r in req_m]
  results = MemorySearcher(many, embedder).search(asked)
  assert calls == [2]
  to_first = lambda rs: [SearchRequest(0, r.query, r.route, r.before_clip, r.exclude_clips) for r in rs]
  alone = (MemorySearcher([graphs[0]], embedder).search(to_first(asked[:4]))
           + MemorySearcher([graphs[1]], embedder).search(to_first(asked[4:])))
  assert [(r.text, r.clips) for r in results] == [(r.text, r.clips) for r in alone]


def test_fixture_story_answers(graphs, embedder):
  qs, reqs = _requests("medium", 1)
  by_id = dict(zip([q["id"] for q in qs], MemorySearcher(graphs, embedder).search(reqs)))
  assert 9 in by_id["m00"].clips and 17 in by_id["m01"].clips and 26 in by_id["m02"].clips
  assert 45 not in by_id["m07"].clips                                   # before_clip=40 masks clip 45
  assert by_id["m16"].text == EMPTY                                     # only clip 40 qualifies, and it was seen
  assert all(c <= 30 for c in by_id["m08"].clips)
  assert "Equivalence" not in json.dumps([r.memories for r in by_id.values()])
  assert "<face_" not in by_id["m00"].text and "<character_2>" in by_id["m00"].text
  assert "Kate" in by_id["m18"].text and by_id["m18"].clips == sorted(by_id["m18"].clips)
  assert sum(len(v) for v in by_id["m18"].memories.values()) == 20      # node route: top-20 memories


def test_node_context_ranks_the_lookup_with_its_question(graphs, embedder):
  """With `node_context` a node search ranks by its query joined to the question it serves (SearchRequest.context),
  exactly as a search for the joined text; the clip route, and every route with the setting off, ignore it."""
  lookup, question = "What is the character id of Kate", "Who baked the apple pie?"
  on = MemorySearcher(graphs, embedder, SearchConfig(node_context=True))
  off = MemorySearcher(graphs, embedder)
  with_context = on.search([SearchRequest(1, lookup, "node", context=question),
                            SearchRequest(1, question, "clip", context=lookup)])
  joined = on.search([SearchRequest(1, f"{lookup}? {question}", "node"), SearchRequest(1, question, "clip")])
  assert [r.text for r in with_context] == [r.text for r in joined]
  plain = off.search([SearchRequest(1, lookup, "node", context=question), SearchRequest(1, lookup, "node")])
  assert plain[0].text == plain[1].text != with_context[0].text


def test_exclusion_backfill_vs_reference(graphs, embedder):
  r = SearchRequest(0, "Where did Chloe find her math homework?")
  cfg = SearchConfig(threshold=0.2)
  first = MemorySearcher(graphs, embedder, cfg).search([r])[0]
  seen = tuple(first.clips)
  again_ref = MemorySearcher(graphs, embedder, SearchConfig(threshold=0.2, exclusion="reference")).search(
      [SearchRequest(0, r.query, exclude_clips=seen)])[0]
  again = MemorySearcher(graphs, embedder, cfg).search([SearchRequest(0, r.query, exclude_clips=seen)])[0]
  assert again_ref.text == EMPTY                       # the reference loses them: filtering after top-k
  assert again.clips and not set(again.clips) & set(seen)


def test_before_clip_is_a_mask_not_a_copy(graphs, embedder):
  g = graphs[1]
  state = (g.num_text, g.num_edges(), g.version)
  searcher = MemorySearcher(graphs, embedder)
  masked = searcher.search([SearchRequest(1, "Who baked the apple pie?", before_clip=b) for b in (40, 44, 45, None)])
  assert (g.num_text, g.num_edges(), g.version) == state
  assert all(max(r.clips, default=0) <= 40 for r in masked[:2]) and 45 in masked[2].clips


def test_no_semantic_ablation(graphs, embedder):
  res = MemorySearcher(graphs, embedder, SearchConfig(ablation="no_semantic")).search(
      [SearchRequest(1, "What is the character id of Kate", "node"), SearchRequest(1, "Who baked the apple pie?")])
  g = graphs[1]
  semantic = {g.contents[int(g.text_node.data[s])][0] for s in range(g.num_text) if g.text_flags.data[s] & 1}
  texts = [t for r in res for v in r.memories.values() for t in v]
  assert texts and not any("name is" in t for t in texts)
  assert len(semantic) > 50


def test_bad_requests_raise(graphs, embedder):
  s = MemorySearcher(graphs, embedder)
  with pytest.raises(SearchError, match="graph_index"):
    s.search([SearchRequest(5, "x")])
  with pytest.raises(SearchError, match="route"):
    s.search([SearchRequest(0, "x", route="both")])
  with pytest.raises(ValueError, match="clip_mode"):
    SearchConfig(clip_mode="median")


def test_clip_modes_match_reference(graphs, embedder):
  for mode in ("mean", "sum"):
    res = MemorySearcher(graphs, embedder, SearchConfig(clip_mode=mode, threshold=0.3)).search(
        [SearchRequest(1, "<character_3> rides the bicycle to the lake")])[0]
    ref = rs.load(FIX / "medium.pkl")
    rs.refresh_equivalences(ref)
    want = rs.search(ref, "<character_3> rides the bicycle to the lake", [], embedder, topk=2, mode=mode,
                     threshold=0.3, backfill=True)
    assert res.memories == want, mode


def test_indexes_agree_with_exact(graphs, embedder):
  g = load_reference_pickle(FIX / "medium.pkl")
  attach_scann(g, num_leaves=8, leaves_to_search=8, reorder=300)
  qs, reqs = _requests("medium", 0)
  exact = MemorySearcher([graphs[1]], embedder).search(reqs)
  approx = MemorySearcher([g], embedder, SearchConfig(backend="scann")).search(reqs)
  assert [r.text for r in approx] == [r.text for r in exact]
  # upsert as memory grows: the new clip is retrievable through the index
  g.add_clip(60, ["<face_41> launches a green paper rocket from the balcony."], [], embed_fn=embedder)
  hit = MemorySearcher([g], embedder, SearchConfig(backend="scann")).search(
      [SearchRequest(0, "green paper rocket balcony")])[0]
  assert 60 in hit.clips
  vecs = g.text_emb.valid
  for index in (ExactIndex.from_vectors(vecs), ScannIndex.build(vecs, num_leaves=4, leaves_to_search=4)):
    s, i = index.search(vecs[:5], 3)
    assert i[:, 0].tolist() == list(range(5)) and np.allclose(s[:, 0], 1.0, atol=1e-3)


def test_empty_graph_and_config_file(embedder):
  from m3jax.config import load_config
  from m3jax.memory import GraphConfig
  cfg = load_config("configs/memory.py", ["graph.mode=reference", "graph.text_dim=64", "search.exclusion=reference"])
  assert cfg.graph.mode == "reference" and cfg.search.exclusion == "reference"
  with pytest.raises(ValueError, match="mode"):
    load_config("configs/memory.py", ["graph.mode=voting"])
  g = MemoryGraph(cfg.graph)
  res = MemorySearcher([g], embedder, cfg.search).search([SearchRequest(0, "anything"),
                                                          SearchRequest(0, "What is the character id of Al", "node")])
  assert [r.text for r in res] == [EMPTY, EMPTY]
  g.add_entity("face", np.eye(512, dtype=np.float32)[:1])
  g.add_entity("voice", np.eye(192, dtype=np.float32)[:1])
  g.add_clip(0, ["<face_0> waves."], ["Equivalence: <face_0>, <voice_1>"], embed_fn=embedder)
  assert g.characters().mappings == {"character_0": ["face_0", "voice_1"]}
  g.add_clip(1, ["<character_0> sings a song."], [], embed_fn=embedder)     # a character tag links its members
  assert g.text_entities[2] == (0, 1)
  res = MemorySearcher([g], embedder, cfg.search).search([SearchRequest(0, "<character_0> sings")])[0]
  assert res.memories["CLIP_1"] == ["<character_0> sings a song."]
  assert g.config == GraphConfig(text_dim=64, mode="reference")


def test_tpu_approx_topk_path_and_stale_device_copies(graphs, embedder, monkeypatch):
  """The node route's approx_max_k branch (taken on TPU; exact on CPU) gives the same answers here, and a graph
  that grows between searches is seen by the next search (incremental device sync)."""
  reqs = [SearchRequest(1, "What is the character id of Kate", "node", before_clip=b) for b in (None, 20)]
  exact = [r.text for r in MemorySearcher(graphs, embedder).search(reqs)]
  import m3jax.memory.search as search_mod
  monkeypatch.setattr(search_mod.jax, "default_backend", lambda: "tpu")
  assert [r.text for r in MemorySearcher(graphs, embedder).search(reqs)] == exact
  monkeypatch.undo()
  g = load_reference_pickle(FIX / "small.pkl")
  s = MemorySearcher([g], embedder)
  assert 8 not in s.search([SearchRequest(0, "purple dinosaur kite")])[0].clips
  g.add_clip(8, ["<face_16> flies a purple dinosaur kite."], [], embed_fn=embedder)
  assert s.search([SearchRequest(0, "purple dinosaur kite")])[0].memories == {
      "CLIP_8": ["<character_0> flies a purple dinosaur kite."]}
