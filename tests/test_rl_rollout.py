"""Trajectories → training batch (mask on generated tokens incl. end-of-turn), shaping counts, memory-QA graphs."""

import numpy as np
import pytest

from m3jax.control.trajectory import RoundRecord, Trajectory
from m3jax.rl import rollout


def _traj(pieces, rounds=(), response=None):
  t = Trajectory("q", "question?", "truth", "g", rounds=list(rounds), response=response)
  for ids, gen in pieces:
    t.append_tokens(ids, generated=gen, logprobs=-0.5 * np.ones(len(ids)) if gen else None)
  return t


def test_turn_ids_number_generated_runs():
  gen = np.array([0, 0, 1, 1, 0, 1, 0, 0, 1], bool)
  np.testing.assert_array_equal(rollout.turn_ids(gen), [-1, -1, 0, 0, -1, 1, -1, -1, 2])


def test_build_batch_masks_generated_tokens_pads_rows_and_truncates():
  # prompt 3 | turn 1 (2 tokens, the 2nd is <|im_end|>) | tool result 2 | turn 2 (1 token)
  a = _traj([([5, 6, 7], False), ([8, 99], True), ([10, 11], False), ([12], True)])
  b = _traj([([5, 6], False), ([8] * 9, True)])  # 11 tokens: cut at max_len 8
  batch, stats = rollout.build_batch([a, b], rows=4, seq_bucket=4, max_len=8, pad_id=0)
  assert batch["tokens"].shape == (4, 8)
  np.testing.assert_array_equal(batch["mask"][0], [0, 0, 0, 1, 1, 0, 0, 1])
  np.testing.assert_array_equal(batch["turn_ids"][0], [-1, -1, -1, 0, 0, -1, -1, 1])
  np.testing.assert_allclose(batch["old_logp"][0], [0, 0, 0, -0.5, -0.5, 0, 0, -0.5])
  np.testing.assert_array_equal(batch["lengths"], [8, 8, 1, 1])
  assert batch["mask"][2:].sum() == 0 and stats["rollout/truncated"] == 1 and stats["rollout/padding_rows"] == 2
  assert not batch["entropy"].any()  # none recorded
  c = _traj([([5, 6], False)])
  c.append_tokens([8, 9], generated=True, logprobs=[-0.5, -0.25], entropies=[1.5, 0.75])
  with pytest.raises(ValueError, match="entropies"):
    c.append_tokens([1, 2], generated=True, logprobs=[-0.5, -0.5], entropies=[1.0])
  np.testing.assert_allclose(rollout.build_batch([c], rows=1, seq_bucket=4, max_len=8)[0]["entropy"][0],
                             [0, 0, 1.5, 0.75])
  back = Trajectory.from_json(c.to_json())  # entropies survive a JSON line, and a line without them reads as 0
  np.testing.assert_array_equal(back.entropies, c.entropies)
  assert "entropies" not in a.to_json() and not Trajectory.from_json(a.to_json()).entropies.any()
  short, _ = rollout.build_batch([_traj([([5, 6, 7], False), ([8], True)])], rows=1, seq_bucket=4, max_len=64)
  assert short["tokens"].shape == (1, 4)
  with pytest.raises(rollout.RolloutError, match="do not fit"):
    rollout.build_batch([a, b], rows=1, seq_bucket=4, max_len=8)


def test_episode_stats_count_only_non_final_turns():
  rounds = [RoundRecord("search", "q1", "t", retrieved_clips=[1], result_text="found"),
            RoundRecord("search", "q2", "t", retrieved_clips=[], result_text="nothing"),
            RoundRecord("format_error", None, "t", result_text="nothing"),
            RoundRecord("format_error", None, "t")]  # final turn: no shaping
  s = rollout.episode_stats(_traj([([1], False), ([2, 3], True)], rounds))
  assert (s.answer, s.format_errors, s.searches, s.empty_searches, s.generated_tokens) == (None, 1, 3, 2, 2)


def test_memory_qa_graphs_answer_their_questions():
  from m3jax.data.memory_qa import make_task
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.memory.search import MemorySearcher, SearchConfig, SearchRequest

  embed = HashedBowEmbedder.builtin()           # the RL config's default embedder ("hashed")
  graphs, records = make_task([0, 1], embed, embed.dim)
  assert len(graphs) == 2 and {r.memory_id for r in records} == {0, 1}
  drink = next(r for r in records if "drink" in r.question)
  found = MemorySearcher(graphs, embed, SearchConfig()).search(
      [SearchRequest(drink.memory_id, drink.question, "clip")])[0]
  assert drink.answer.rstrip(".").lower() in found.text.lower()
