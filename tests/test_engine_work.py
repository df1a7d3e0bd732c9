"""Where the time goes: the sampler's prefill/decode counters and the RL step's searcher and totals."""

import numpy as np
from flax import nnx

from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.engine.work import kv_bytes
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.rl.flops import decode_weight_bytes, rollout_flops
from m3jax.rl.step_work import StepWork, TimedSearcher

CFG = DecoderConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, tie_embeddings=True)


def test_sampler_counts_fresh_reused_and_attended_tokens_and_times_both_phases():
  sampler = Sampler(Decoder(CFG, rngs=nnx.Rngs(0)), SamplingConfig(max_new_tokens=6, greedy=True))
  prompts = [list(range(1, 1 + n)) for n in (5, 11, 8)]
  first = sampler.generate(prompts)
  w = sampler.work
  assert w.prefill_rows == 3 and w.prefill_reused == 0
  assert w.prefill_attended == sum(n * (n + 1) // 2 for n in (5, 11, 8))
  assert w.decode_steps == 6 and w.prefill_s > 0 and w.decode_s > 0
  cached = np.asarray(first.state.cache.length)
  pending = [len(h) - int(c) for h, c in zip(first.state.history, cached)]  # the last sample, not cached yet
  before = (w.prefill_attended, sampler.prefill_tokens)
  sampler.continue_(first.state, [[7, 8, 9], None, [12]])
  n = {0: pending[0] + 3, 2: pending[2] + 1}
  assert w.prefill_rows == 5 and w.prefill_reused == int(cached[0] + cached[2])
  assert sampler.prefill_tokens - before[1] == sum(n.values())
  assert w.prefill_attended - before[0] == sum(k * int(cached[b]) + k * (k + 1) // 2 for b, k in n.items())


def test_kv_bytes_counts_the_blocks_read_and_the_live_rows_slots():
  model = Decoder(CFG, rngs=nnx.Rngs(0))
  cache = model.init_cache(2, 64)  # 64 slots: one 64-slot block; a slot of both layers' keys and values
  slot = 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 4
  # row 0 starts with 10 slots and samples 3 tokens; row 1 with 70 > 64 is impossible, so 60 and 1 token
  read, needed = kv_bytes(cache, np.array([10, 60]), np.array([3, 1]), 3)
  assert read == 3 * 2 * 64 * slot  # every step reads the whole block for both rows
  assert needed == ((11 + 12 + 13) + 61) * slot  # row 1 is live at step 0 only
  assert kv_bytes(cache, np.array([10, 60]), np.array([3, 1]), 0) == (0, 0)
  big = model.init_cache(3, 1024)  # 256-slot blocks: rows of 5, 300 and 0 (padding) slots, 2 steps
  read, needed = kv_bytes(big, np.array([5, 300, 0]), np.array([2, 2, 0]), 2)
  assert read == 2 * 3 * 512 * slot and needed == (6 + 7 + 301 + 302) * slot
  # a loop whose first call ran on a 384-slot window (`LayerKV`) and whose second read blocks
  read, needed_w = kv_bytes(big, np.array([5, 300, 0]), np.array([2, 2, 0]), 2, windows=[(1, 384), (2, None)])
  assert read == 3 * (384 + 512) * slot and needed_w == needed


def test_sampler_counts_the_kv_its_decode_reads():
  sampler = Sampler(Decoder(CFG, rngs=nnx.Rngs(0)), SamplingConfig(max_new_tokens=6, greedy=True,
                                                                    length_buckets=(16, 64)))
  out = sampler.generate([list(range(1, 6)), list(range(1, 12))])
  w, n = sampler.work, [len(t) for t in out.tokens]
  slot = 2 * CFG.num_layers * CFG.num_kv_heads * CFG.head_dim * 4
  assert w.decode_kv_needed == sum(start + min(i + 1, k) for start, k in zip((5, 11), n) for i in range(k)) * slot
  assert w.decode_kv_read == w.decode_steps * 2 * 64 * slot >= w.decode_kv_needed > 0


def test_timed_searcher_and_step_shares():
  class Searcher:
    graphs = ["g"]

    def search(self, requests):
      return [r * 2 for r in requests]

  work = StepWork()
  searcher = TimedSearcher(Searcher(), work)
  start = work.totals()
  assert searcher.search([1, 2]) == [2, 4] and searcher.graphs == ["g"]
  work.engine.decode_steps += 3
  share = work.since(start)
  assert share["time/search_s"] > 0 and share["work/decode_steps"] == 3 and share["time/judge_s"] == 0


def test_step_shares_count_compiling_and_the_learner_s_share_of_it():
  import jax
  import jax.numpy as jnp

  work = StepWork()
  start = work.totals()
  jax.jit(lambda x: jnp.cos(x) * 3)(jnp.ones(7))
  other = work.since(start)
  assert other["time/compile_s"] > 0 and other["time/learner_compile_s"] == 0

  def _grad_sums(x):  # a learner program's name (m3jax.rl.learner)
    return jnp.sin(x) * 2

  start = work.totals()
  jax.jit(_grad_sums)(jnp.ones(5))
  jax.jit(_grad_sums)(jnp.ones(5))  # cached: compiled once
  learner = work.since(start)
  assert 0 < learner["time/learner_compile_s"] <= learner["time/compile_s"]
  start = work.totals()
  jax.jit(_grad_sums)(jnp.ones(5))
  assert work.since(start)["time/compile_s"] == 0


def test_rollout_flops_and_weight_bytes():
  d, v = CFG.hidden_size, CFG.vocab_size
  per_token = 2 * (d * 32 + 2 * d * 16 + 32 * d + 3 * d * 64) * CFG.num_layers
  assert rollout_flops(CFG, 10, 0, 0) == 10 * per_token
  assert rollout_flops(CFG, 10, 55, 2) == 10 * per_token + 4 * 32 * 2 * 55 + 2 * 2 * d * v
  assert decode_weight_bytes(CFG) == 4 * (per_token // 2 + d * v)
