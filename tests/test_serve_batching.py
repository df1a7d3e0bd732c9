"""The batched answering path's embedder side: the call planner of `TextEmbedder` (an exact optimum over the
bucketed shapes), its warm-up, and the service's background warm-up reported by /healthz."""

import itertools
import random
import time

import numpy as np
import pytest

from m3jax.models.bert import CALL_COST_TOKENS, TextEmbedder, _bucket, _length_bucket, plan_chunks
from test_serve import ALICE, CLIPS, Server, _config


def _cost(chunks, lengths, max_batch, max_len):
  return sum(_bucket(stop - start, 1, max_batch) * _length_bucket(lengths[stop - 1], max_len) + CALL_COST_TOKENS
             for start, stop, *_ in chunks)


def _brute_force(lengths, max_batch, max_len):
  """The cheapest split into contiguous calls, by trying every set of cut points."""
  n, best = len(lengths), None
  for cuts in itertools.product((False, True), repeat=n - 1):
    bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
    chunks = list(zip(bounds, bounds[1:]))
    if all(b - a <= max_batch for a, b in chunks):
      cost = _cost(chunks, lengths, max_batch, max_len)
      best = cost if best is None else min(best, cost)
  return best


def test_plan_is_the_exact_optimum_and_uses_only_bucket_shapes():
  rng = random.Random(0)
  for trial in range(60):
    n, max_batch = rng.randint(1, 11), rng.choice([1, 2, 4, 8])
    lengths = sorted(rng.choice([3, 16, 17, 23, 30, 40, 70, 200, 300]) for _ in range(n))
    plan = plan_chunks(lengths, max_batch, 256)
    assert [c[0] for c in plan] == [0] + [c[1] for c in plan[:-1]] and plan[-1][1] == n   # contiguous, complete
    for start, stop, batch, length in plan:
      assert stop - start <= batch <= max_batch and batch & (batch - 1) == 0
      assert length >= min(lengths[stop - 1], 256) and length in (16, 24, 32, 48, 64, 96, 128, 192, 256)
    assert _cost(plan, lengths, max_batch, 256) == _brute_force(lengths, max_batch, 256), (lengths, max_batch)
  # the serving case: a batch of 37 short questions runs as 32 + 4 + 1 rows instead of 64 padded ones
  assert plan_chunks([16] * 37, 64, 256) == [(0, 32, 32, 16), (32, 36, 4, 16), (36, 37, 1, 16)]
  assert plan_chunks([16] * 64, 64, 256) == [(0, 64, 64, 16)]
  assert plan_chunks([17] * 8, 64, 256) == [(0, 8, 8, 24)]                     # not padded to 32 tokens
  assert plan_chunks([], 64, 256) == []


@pytest.fixture(scope="module")
def minilm():
  return TextEmbedder.from_pretrained()


def test_planned_calls_keep_the_embeddings_and_warmup_precompiles(minilm):
  texts = [f"{w} number {i} walks to the kitchen." * (1 + i % 3) for i, w in enumerate(["Anna", "Ben"] * 19)]
  together = minilm(texts)
  alone = np.concatenate([minilm([t]) for t in texts[:6]])
  assert np.abs(together[:6] - alone).max() <= 1e-5
  assert len({len(ids) for ids in minilm.tokenize(texts)}) == 3              # three length buckets in one call
  before = minilm._forward._cache_size()
  assert minilm.warmup([40], max_batch=2) == 2                               # (1, 48) and (2, 48)
  assert minilm._forward._cache_size() == before + 2
  long = ["Anna cooks pasta in the kitchen while Ben reads the paper and Carla paints the old garden wall "
          "with a wide brush, and then all three of them sit down together for a quiet dinner."] * 2
  assert {len(ids) for ids in minilm.tokenize(long)} <= set(range(33, 49))
  minilm(long)
  minilm(long[:1])
  assert minilm._forward._cache_size() == before + 2                         # no compilation on the way


def test_service_precompiles_the_embedder_in_the_background(tmp_path):
  srv = Server(_config(tmp_path, embedder="minilm", warmup_lengths=(16,), max_batch=2))
  try:
    deadline = time.time() + 300
    while not (health := srv.client.get("/healthz").json())["warm"]:
      assert time.time() < deadline, health
      time.sleep(0.1)
    forward = srv.app.state.store.embed_fn.embed_fn._forward
    assert forward._cache_size() >= 2                                        # (1, 16) and (2, 16)
    sid = srv.client.post("/v1/spaces", json={"name": "w"}, headers=ALICE).json()["id"]
    ep, sem = CLIPS[1]
    assert srv.client.post(f"/v1/spaces/{sid}/clips", json={"episodic": ep, "semantic": sem},
                           headers=ALICE).status_code == 201
    out = srv.client.post(f"/v1/spaces/{sid}/ask", json={"questions": [{"question": "Who waters the plants?"}] * 2},
                          headers=ALICE).json()["answers"]
    assert [a["trajectory"][0]["retrieved_clips"] for a in out] == [[0], [0]]
  finally:
    srv.stop()
