"""The perception pool (m3jax.memorize.perception_pool): a train-split episode rendered and memorized end to end once,
then reused from its cache entry without rendering or memorizing again; changed settings get their own entry, and
an entry recorded with other settings is refused. `train.py rl` mixes the pool's questions with the gold graphs'
at `pool_ratio`."""

import dataclasses
import json

import pytest

from m3jax.memorize import perception_pool
from m3jax.memorize.pipeline import MemorizeConfig
from m3jax.data.episodes import EpisodeConfig

# one 12-s clip with one person: the smallest episode that still has speech, a face and questions
TINY = EpisodeConfig(num_clips=1, num_characters=1, clip_seconds=12.0, utterances_per_clip=(1, 2))
SEED = 7  # train split


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
  root = tmp_path_factory.mktemp("pool")
  graphs, records, embed, stats = perception_pool.perceived_episodes(root, [SEED], TINY, MemorizeConfig(),
                                                                     progress=False)
  return root, graphs, records, embed, stats


def test_the_pool_is_built_once_and_reused(pool, monkeypatch):
  root, graphs, records, _, stats = pool
  assert len(graphs) == 1 and records and {r.memory_id for r in records} == {0}
  assert not stats[0]["cached"] and stats[0]["build_seconds"] > 0
  entry, = root.iterdir()
  assert entry.name == f"{stats[0]['episode']}_{perception_pool.entry_key(dataclasses.replace(TINY, seed=SEED), MemorizeConfig())}"
  print(f"perception pool: one {TINY.num_clips}-clip episode built in {stats[0]['build_seconds']} s")

  def never(*a, **kw):
    raise AssertionError("a cached entry was built again")

  from m3jax.memorize import pipeline
  from m3jax.data import episode_render
  monkeypatch.setattr(episode_render, "render_episode", never)
  monkeypatch.setattr(pipeline.Memorizer, "memorize", never)
  again, records2, _, stats2 = perception_pool.perceived_episodes(root, [SEED], TINY, MemorizeConfig(),
                                                                  progress=False)
  assert stats2[0]["cached"] and stats2[0]["build_seconds"] == stats[0]["build_seconds"]
  assert records2 == records and again[0].num_nodes() == graphs[0].num_nodes() > 0


def test_changed_settings_never_reuse_an_entry(pool, monkeypatch):
  root, *_ = pool
  entry, = root.iterdir()
  other = MemorizeConfig(clip_seconds=6.0)
  assert perception_pool.entry_key(dataclasses.replace(TINY, seed=SEED), other) not in entry.name
  # an entry whose record says other settings (copied or edited by hand) is refused, naming what differs
  record = json.loads((entry / "pool.json").read_text())
  record["settings"]["memorize"]["clip_seconds"] = 6.0
  (entry / "pool.json").write_text(json.dumps(record))
  with pytest.raises(perception_pool.PoolError, match=r"memorize.clip_seconds: cached 6.0, asked 30.0"):
    perception_pool.perceived_episodes(root, [SEED], TINY, MemorizeConfig(), models=object(), progress=False)


def test_rl_mixes_pool_questions_with_gold_at_the_ratio(pool, monkeypatch):
  """The pool's graphs follow the gold ones in the searcher, its questions are `pool:`-prefixed, and about
  `pool_ratio` of the draws are the pool's (grain's weighted mix: a pure function of seed and index)."""
  from m3jax.config import load_config
  from m3jax.rl import program as program_lib

  root, graphs, records, embed, stats = pool
  monkeypatch.setattr(perception_pool, "perceived_episodes", lambda *a, **kw: (graphs, records, embed, stats))
  cfg = load_config("configs/rl_tiny.py", ["train_seeds=(0, 2)", "eval_seeds=(1000000, 1000001)",
                                           "embedder=minilm", "pool_seeds=(7, 8)", "pool_ratio=0.25"])
  program = program_lib.RLProgram(cfg)
  assert len(program.searcher.graphs) == 3 + 1  # 2 train + 1 eval gold graphs, then the pool's
  assert {r.memory_id for r in program.pool_records} == {3}
  assert all(r.question_id.startswith("pool:") for r in program.pool_records)
  drawn = [program.dataset[i].question_id.startswith("pool:") for i in range(400)]
  assert abs(sum(drawn) / len(drawn) - 0.25) < 0.02
  with pytest.raises(ValueError, match="embedder"):
    load_config("configs/rl_tiny.py", ["pool_seeds=(7, 8)", "pool_ratio=0.25"])
  with pytest.raises(ValueError, match="not train seeds"):
    load_config("configs/rl_tiny.py", ["embedder=minilm", "pool_seeds=(1000000, 1000001)", "pool_ratio=0.25"])
