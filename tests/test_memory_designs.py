"""Memory designs behind one interface: the M3 graph and the two baselines answer the search tools, persist, and a
design without the node route is answered empty (and counted) instead of failing."""

import numpy as np
import pytest

from m3jax.data.memory_qa import episode_clips, episode_graph
from m3jax.memory.designs import (DESIGNS, ClipPerception, DesignError, DesignSearcher, load_design, make_design,
                                  register)
from m3jax.memory.designs.base import TextRows
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.search import MemorySearcher, SearchRequest, SearchResult, format_result

SEEDS = (1_000_000, 1_000_001)


class LastClips(TextRows):
  """A design defined outside the package (named by import path): one row per memory, retrieval ignores the
  query and returns the newest `topk` memories. It exists to show a design is a few lines."""
  name = "last_clips"

  def rows_for(self, clip: ClipPerception) -> list[str]:
    return list(clip.episodic)

  def retrieve(self, query, route="clip", before_clip=None, exclude_clips=()):
    rows = [i for i, c in enumerate(self.clips)
            if (before_clip is None or c <= before_clip) and c not in exclude_clips][-self.topk:]
    memories = {}
    for i in rows:
      memories.setdefault(f"CLIP_{self.clips[i]}", []).append(self.texts[i])
    return SearchResult(format_result(memories), sorted({self.clips[i] for i in rows}), memories)


@pytest.fixture(scope="module")
def embed():
  return HashedBowEmbedder.builtin()


@pytest.fixture(scope="module")
def built(embed):
  """Every registered design over two held-out episodes' gold memories."""
  out = {}
  for name in sorted(DESIGNS):
    designs = []
    for seed in SEEDS:
      d = make_design(name, embed, **({"text_dim": embed.dim} if name == "m3_graph" else {}))
      for clip in episode_clips(seed)[0]:
        d.update(clip)
      designs.append(d)
    out[name] = designs
  return out


def test_registry_has_the_paper_graph_and_two_baselines():
  assert {"m3_graph", "flat_list", "clip_summary"} <= set(DESIGNS)
  assert DESIGNS["m3_graph"].routes == ("clip", "node")
  assert DESIGNS["flat_list"].routes == DESIGNS["clip_summary"].routes == ("clip",)


def test_m3_graph_design_is_the_task_graph(built, embed):
  """The design built clip by clip is the graph RL trains on (same nodes, edges, characters)."""
  graph, _ = episode_graph(SEEDS[0], embed, embed.dim)
  assert built["m3_graph"][0].graph.to_json() == graph.to_json()


def test_flat_list_is_plain_topk_over_episodic_memories(built, embed):
  flat = built["flat_list"][0]
  clips, _ = episode_clips(SEEDS[0])
  assert flat.texts == [s for c in clips for s in c.episodic]  # episodic only, no consolidation
  query = "Where does Grace live?"
  got = flat.retrieve(query, before_clip=1, exclude_clips=(0,))
  allowed = [i for i, c in enumerate(flat.clips) if c == 1]
  scores = embed(flat.texts) @ embed([query])[0]
  best = sorted(allowed, key=lambda i: -scores[i])[:flat.topk]
  assert sorted(s for v in got.memories.values() for s in v) == sorted(flat.texts[i] for i in best)
  assert got.clips == [1] and got.text.startswith("Searched knowledge: {\"CLIP_1\"")


def test_clip_summary_keeps_one_row_per_clip(built):
  store = built["clip_summary"][0]
  clips, _ = episode_clips(SEEDS[0])
  assert store.clips == [c.clip_id for c in clips]
  assert store.texts[0] == " ".join(clips[0].episodic + clips[0].semantic)
  got = store.retrieve("Grace wallet desk", before_clip=2)
  assert len(got.clips) == store.topk and all(len(v) == 1 for v in got.memories.values())
  assert store.retrieve("anything", before_clip=0).clips == [0]


@pytest.mark.parametrize("name", ["m3_graph", "flat_list", "clip_summary"])
def test_save_load_answers_the_same(built, embed, name, tmp_path):
  design = built[name][0]
  design.save(tmp_path / name)
  again = load_design(tmp_path / name, embed)
  assert type(again) is type(design) and again.options == design.options
  for query, route in (("What is the name of <character_0>", "clip"), ("Where did Grace put the wallet?", "clip"),
                       ("What is the character id of Grace", "node")):
    if route in design.routes:
      assert again.retrieve(query, route, 2).memories == design.retrieve(query, route, 2).memories


def test_design_searcher_answers_missing_routes_empty_and_counts_them(built, embed):
  searcher = DesignSearcher(built["flat_list"] + built["m3_graph"][:1])   # mixed kinds: one request at a time
  node, clip, graph_node = searcher.search([SearchRequest(0, "What is the character id of Grace", "node"),
                                            SearchRequest(1, "Where does Emily live?", "clip"),
                                            SearchRequest(2, "What is the character id of Grace", "node")])
  assert node.memories == {} and node.text.endswith("(The search result is empty. Please try searching from "
                                                    "another perspective.)")
  assert clip.memories and graph_node.memories
  assert searcher.requests == {"clip": 1, "node": 2} and searcher.unsupported == {"clip": 0, "node": 1}


def test_graph_designs_search_in_one_batch_exactly_as_alone(built, embed):
  designs = built["m3_graph"]
  searcher = DesignSearcher(designs)
  assert isinstance(searcher.batch, MemorySearcher)
  requests = [SearchRequest(i, q, r, 2) for i in range(2) for q, r in (
      ("What is the character id of Grace", "node"), ("Where did she put the wallet?", "clip"))]
  together = searcher.search(requests)
  alone = [designs[r.graph_index].retrieve(r.query, r.route, r.before_clip) for r in requests]
  assert [t.memories for t in together] == [a.memories for a in alone]
  ablated = make_design("m3_graph", embed, text_dim=embed.dim, ablation="no_semantic")
  assert DesignSearcher(designs + [ablated]).batch is None  # different search settings: not one batch


def test_a_design_by_import_path_is_a_few_lines(embed, tmp_path):
  d = make_design("test_memory_designs:LastClips", embed, topk=2)
  for clip in episode_clips(SEEDS[0])[0]:
    d.update(clip)
  got = d.retrieve("ignored", before_clip=1)
  assert sum(len(v) for v in got.memories.values()) == 2 and got.clips == [1]
  with pytest.raises(DesignError, match="two memory designs are named 'flat_list'"):
    register(type("Other", (LastClips,), {"name": "flat_list"}))


def test_bad_designs_options_and_files_are_refused(built, embed, tmp_path):
  with pytest.raises(DesignError, match="unknown memory design 'nope' \\(known: clip_summary, flat_list"):
    make_design("nope", embed)
  with pytest.raises(DesignError, match="flat_list.*bogus"):
    make_design("flat_list", embed, bogus=1)
  with pytest.raises(DesignError, match="m3_graph: unknown options \\['bogus'\\]"):
    make_design("m3_graph", embed, bogus=1)
  with pytest.raises(DesignError, match="topk must be >= 1"):
    make_design("flat_list", embed, topk=0)
  with pytest.raises(DesignError, match="cannot import memory design"):
    make_design("no_such_module:X", embed)
  flat = built["flat_list"][0]
  with pytest.raises(DesignError, match="clip 0 after clip 2"):
    flat.update(ClipPerception(0, ("late",)))
  with pytest.raises(DesignError, match="no readable memory design"):
    load_design(tmp_path / "missing", embed)
  flat.save(tmp_path / "flat")
  np.save(tmp_path / "flat" / "emb.npy", np.zeros((1, 4), np.float32))
  with pytest.raises(DesignError, match="damaged: 1 embeddings for"):
    load_design(tmp_path / "flat", embed)
