"""Controller trajectories → the learner's fixed-shape training batch.

The controller records every token of a conversation with a `generated` bit and the sampler's log-prob, so no
re-rendering happens (the reference re-renders with the chat template and thereby trains different tokens than
were sampled, §5.6). The loss mask is exactly `generated`: every sampled token including the end-of-turn token
the sampler stopped on; prompts, instructions and retrieved memories are 0. Rows are right-padded to a length
bucket (one compilation per bucket) and the batch to a fixed row count (padding rows have an empty mask, so the
whole-batch token mean ignores them).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from m3jax.eval.judges import is_decline
from m3jax.control.controller import Question
from m3jax.control.trajectory import Trajectory
from m3jax.rl.rewards import EpisodeStats


class RolloutError(ValueError):
  """Trajectories that do not fit the requested batch."""


def episode_stats(traj: Trajectory) -> EpisodeStats:
  """Shaping counts as the reference defines them: only non-final turns (those followed by a tool result)."""
  non_final = [r for r in traj.rounds if r.result_text]
  return EpisodeStats(
      answer=traj.response,
      format_errors=sum(r.action == "format_error" for r in non_final),
      searches=sum(r.action != "answer" for r in non_final),
      empty_searches=sum(r.empty_search for r in non_final),
      generated_tokens=int(np.sum(traj.generated)),
      declined=is_decline(traj.response))


def turn_ids(generated: np.ndarray) -> np.ndarray:
  """Index of the generated run (policy turn) each token belongs to; −1 for context tokens."""
  generated = np.asarray(generated, bool)
  starts = generated & ~np.concatenate([[False], generated[:-1]])
  return np.where(generated, np.cumsum(starts) - 1, -1).astype(np.int32)


def bucket_length(n: int, bucket: int, max_len: int) -> int:
  return min(max_len, -(-max(n, 1) // bucket) * bucket)


def build_batch(trajs: Sequence[Trajectory], rows: int, *, seq_bucket: int, max_len: int,
                pad_id: int = 0) -> tuple[dict[str, np.ndarray], dict[str, float]]:
  """tokens/lengths/mask/old_logp/entropy/turn_ids `[rows, T]` (T = bucketed longest trajectory, ≤ max_len).

  A trajectory longer than `max_len` is cut (its tail tokens are not trained) and counted in the stats.
  `old_logp` holds the sampler's log-probs (the behaviour policy) and `entropy` the entropies it recorded (0 where
  it recorded none), both 0 off the mask.
  """
  if len(trajs) > rows:
    raise RolloutError(f"{len(trajs)} trajectories do not fit a batch of {rows} rows")
  if not trajs:
    raise RolloutError("no trajectories to train on")
  longest = max(len(t.token_ids) for t in trajs)
  T = bucket_length(longest, seq_bucket, max_len)
  out = {"tokens": np.full((rows, T), pad_id, np.int32), "lengths": np.ones((rows,), np.int32),
         "mask": np.zeros((rows, T), np.float32), "old_logp": np.zeros((rows, T), np.float32),
         "entropy": np.zeros((rows, T), np.float32), "turn_ids": np.full((rows, T), -1, np.int32)}
  truncated = 0
  for i, t in enumerate(trajs):
    n = min(len(t.token_ids), T)
    truncated += len(t.token_ids) > T
    out["tokens"][i, :n] = t.token_ids[:n]
    out["lengths"][i] = max(n, 1)
    out["mask"][i, :n] = t.generated[:n]
    out["old_logp"][i, :n] = np.where(t.generated[:n], t.logprobs[:n], 0.0)
    out["entropy"][i, :n] = np.where(t.generated[:n], t.entropies[:n], 0.0)
    out["turn_ids"][i, :n] = turn_ids(t.generated)[:n]
  out["mask"][:, 0] = 0.0  # the first token has no prediction
  stats = {"rollout/truncated": float(truncated), "rollout/seq_len": float(T),
           "rollout/padding_rows": float(rows - len(trajs)),
           "rollout/generated_tokens": float(out["mask"].sum()), "rollout/tokens": float(out["lengths"].sum())}
  return out, stats


def group_questions(records, group: int) -> list[Question]:
  """`group` controller questions per `data.memory_qa.QARecord`, ids `QUESTION_ID#k` (a group's samples)."""
  return [Question(f"{r.question_id}#{k}", r.question, r.answer, r.memory_id, before_clip=r.before_clip,
                   question_types=r.types) for r in records for k in range(group)]
