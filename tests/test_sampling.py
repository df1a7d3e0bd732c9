"""Sampler: greedy parity with transformers on ragged batches, continuation, buckets, stops, sampling, sharding."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from m3jax.engine.decode import sample_token, token_entropy
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.weights.hf import load_hf
from m3jax.parallel import make_mesh

from parity import assert_close_to_reference, torch_f32_f64

GREEDY = SamplingConfig(max_new_tokens=40, greedy=True)


@pytest.fixture(scope="module")
def tiny(tiny_dirs):
  path, ref = tiny_dirs["qwen3"]
  return load_hf(path), ref, path


def _prompts(lengths=(5, 11, 8), seed=1):
  rs = np.random.RandomState(seed)
  return [rs.randint(3, 320, n).tolist() for n in lengths]


def _hf_greedy(ref, prompt, n):
  with torch.no_grad():
    out = ref.generate(torch.tensor([prompt]), max_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
  return out[0, len(prompt):].tolist()


def test_greedy_ragged_batch_matches_transformers(tiny):
  model, ref, _ = tiny
  prompts = _prompts()
  out = Sampler(model, GREEDY).generate(prompts)
  assert out.finish_reason == ["length"] * 3
  for p, got in zip(prompts, out.tokens):
    assert len(got) == 40 and got == _hf_greedy(ref, p, 40)


def test_split_layer_decode_equals_the_layer_scan(tiny):
  """On CPU the decode step reads per-layer weight arrays (`Decoder.split_layers`, unrolled) instead of scanning
  the stacked ones: same greedy tokens, log-probs equal to float rounding; `layers` needs the unrolled loop."""
  model, _, _ = tiny
  prompts = _prompts()
  split, scan = Sampler(model, GREEDY), Sampler(model, GREEDY, split_layers=False)
  assert split.layers is not None and len(split.layers) == model.cfg.num_layers and scan.layers is None
  a, b = split.generate(prompts), scan.generate(prompts)
  assert a.tokens == b.tokens
  for x, y in zip(a.logprobs, b.logprobs):
    np.testing.assert_allclose(x, y, atol=1e-5)
  with pytest.raises(ValueError, match="'unroll' with `layers`"):
    model.hidden(jnp.asarray([prompts[0]]), layers=split.layers)


class _IdText:
  """A tokenizer stand-in whose text never holds the stop string: it only makes the host stop the decode loop every
  `stop_check_interval` steps."""

  def decode(self, ids, skip_special_tokens=False):
    return " ".join(map(str, ids))


@pytest.mark.parametrize("name", ["qwen3", "qwen2_window"])
def test_windowed_decode_equals_the_block_loop(tiny_dirs, name):
  """The decode loop on per-layer arrays of the slots it can fill (`LayerKV`), its window growing across the host's
  stop checks (128, then 192 slots), equals the block loop over the stacked cache: same greedy tokens, log-probs and
  written cache to float rounding, and the next turn continues alike."""
  from m3jax.engine.decode import window_slots
  model = load_hf(tiny_dirs[name][0])
  cfg = SamplingConfig(max_new_tokens=40, greedy=True, stop_strings=("never",), stop_check_interval=8,
                       length_buckets=(128, 256))
  prompts = _prompts((100, 37, 117))
  outs, samplers = [], []
  for window in (True, False):
    sampler = Sampler(model, cfg, tokenizer=_IdText(), decode_window=window)
    outs.append(sampler.generate(prompts))
    samplers.append(sampler)
  assert samplers[0].decode_window and not samplers[1].decode_window
  assert [window_slots(n, 256) for n in (117 + 8, 117 + 16, 117 + 40)] == [128, 192, 192]
  a, b = outs
  assert a.tokens == b.tokens and a.finish_reason == b.finish_reason == ["length"] * 3
  for x, y in zip(a.logprobs, b.logprobs):
    np.testing.assert_allclose(x, y, atol=1e-5)
  ca, cb = a.state.cache, b.state.cache
  np.testing.assert_array_equal(ca.length, cb.length)
  np.testing.assert_allclose(ca.k, cb.k, atol=1e-5)
  np.testing.assert_allclose(ca.v, cb.v, atol=1e-5)
  more = [[5, 6, 7], None, [9] * 20]
  na, nb = (s.continue_(o.state, more) for s, o in zip(samplers, outs))
  assert na.tokens == nb.tokens


def test_continuation_equals_full_reprefill(tiny):
  model, _, _ = tiny
  sampler = Sampler(model, GREEDY)
  prompts = _prompts()
  first = sampler.generate(prompts)
  appended = [[7, 8, 9], None, [12]]  # row 1 sits this turn out
  short = SamplingConfig(max_new_tokens=10, greedy=True)
  cont = sampler.continue_(first.state, appended, short)
  fresh = sampler.generate([p + o + a for p, o, a in zip(prompts, first.tokens, appended) if a is not None], short)
  assert cont.tokens == fresh.tokens
  for a, b in zip(cont.logprobs, fresh.logprobs):
    np.testing.assert_allclose(a, b, atol=1e-5)
  # a third turn, now including the row that sat out, still equals re-prefilling its whole history
  third = sampler.continue_(cont.state, [[5], [6, 6]], short)
  hist = first.state.history
  again = sampler.generate([hist[0][:-len(third.tokens[0])], hist[1][:-len(third.tokens[1])]], short)
  assert third.tokens == again.tokens


def test_forked_prefix_cache_equals_separate_prefills(tiny):
  """Rows with identical prompts (an RL group) prefill once and fork the cache: same tokens and log-probs as
  prefilling every row, in the first turn and in a continued one; seeded sampling still differs across the group."""
  model, _, _ = tiny
  a, b, c = _prompts((7, 12, 5))
  group = [a, a, a, b, b, c]  # batch bucket 8: two padding rows
  short = SamplingConfig(max_new_tokens=10, greedy=True)
  turn = [[5], None, [6, 7], [8], [9, 9, 9], None]
  for cfg in (GREEDY, SamplingConfig(max_new_tokens=40, temperature=1.5, seed=3)):
    forked, separate = Sampler(model, cfg), Sampler(model, cfg, share_prefix=False)
    one, ref = forked.generate(group), separate.generate(group)
    assert one.tokens == ref.tokens
    for x, y in zip(one.logprobs, ref.logprobs):
      np.testing.assert_allclose(x, y, atol=1e-5)
    assert forked.prefill_tokens_saved == 2 * 7 + 12 and forked.prefill_tokens == 7 + 12 + 5
    assert separate.prefill_tokens_saved == 0 and separate.prefill_tokens == 3 * 7 + 2 * 12 + 5
    two, ref2 = forked.continue_(one.state, turn, short), separate.continue_(ref.state, turn, short)
    assert two.tokens == ref2.tokens
    for x, y in zip(two.logprobs, ref2.logprobs):
      np.testing.assert_allclose(x, y, atol=1e-5)
  assert len({tuple(t) for t in one.tokens[:3]}) > 1  # sampled: the forked rows of one prompt diverge


def test_rows_whose_conversations_match_prefill_a_later_turn_once(tiny):
  """An RL group after the same search: rows with the same history (greedy, one prompt) fed the same tool result
  prefill it once and copy the cache row, in a wide state and in a subset of it; tokens and log-probs equal
  prefilling every row, and a row whose history differs (another prompt, another result) is never a copy."""
  model, _, _ = tiny
  a, b = _prompts((20, 24), seed=5)  # width bucket 32, as the reset-slot test: no later test compiles it first
  short = SamplingConfig(max_new_tokens=6, greedy=True)
  shared, separate = Sampler(model, short), Sampler(model, short, share_prefix=False)
  one, ref = shared.generate([a, a, a, b]), separate.generate([a, a, a, b])
  assert one.tokens[0] == one.tokens[1] == one.tokens[2]
  saved = shared.prefill_tokens_saved
  result = [3, 1, 4, 1, 5]
  for turn in ([result, result, result, result], [result + [9], None, result + [9], result]):
    two, ref2 = shared.continue_(one.state, turn, short), separate.continue_(ref.state, turn, short)
    assert two.tokens == ref2.tokens and two.state.history == ref2.state.history
    for x, y in zip(two.logprobs, ref2.logprobs):
      np.testing.assert_allclose(x, y, atol=1e-5)
    one, ref = two, ref2
  # turn 1: rows 1 and 2 copy row 0 (the pending sample plus the result); turn 2 (rows 0 and 2, a subset): row 2
  assert shared.prefill_tokens_saved - saved == 2 * (1 + len(result)) + (1 + len(result) + 1)
  assert separate.prefill_tokens_saved == 0


def test_a_reset_slot_takes_a_new_prompt_while_the_others_continue(tiny):
  """Continuous batching's sampler step: a row emptied by `reset_rows` and fed a new prompt decodes exactly as a
  fresh generate of that prompt, while the untouched rows' continuation is unchanged by the neighbour swap."""
  model, _, _ = tiny
  sampler = Sampler(model, GREEDY)
  prompts = _prompts((9, 6, 13, 4))
  new = _prompts((20,), seed=7)[0]  # a width bucket (32) no later test expects to compile itself
  short = SamplingConfig(max_new_tokens=10, greedy=True)
  first = sampler.generate(prompts)
  sampler.reset_rows(first.state, [1])
  mixed = sampler.continue_(first.state, [[7, 8], new, None, [3]], short)
  alone = Sampler(model, short).generate([new])
  assert mixed.tokens[1] == alone.tokens[0] and mixed.state.history[1] == new + alone.tokens[0]
  np.testing.assert_allclose(mixed.logprobs[1], alone.logprobs[0], atol=1e-5)
  plain = sampler.continue_(sampler.generate(prompts).state, [[7, 8], None, None, [3]], short)
  assert [mixed.tokens[0], mixed.tokens[2]] == plain.tokens
  assert 0 < sampler.decode_tokens <= sampler.decode_row_steps
  with pytest.raises(ValueError, match="outside"):
    sampler.reset_rows(first.state, [4])


def test_prefill_in_pieces_equals_one_call(tiny):
  """A long prefill in pieces over the rows still fed (`_prefill_pieces`): first prompts of ragged lengths, then
  continuations of ragged lengths at each row's own cache offset (one row fed nothing), give the tokens and
  log-probs of one call at the longest row's width; the plan computes each row's length rounded up to a piece."""
  model, _, _ = tiny
  short = SamplingConfig(max_new_tokens=6, greedy=True)
  pieces = dataclasses.replace(short, prefill_piece=16)
  prompts = _prompts((40, 5, 17, 9, 26, 12, 3, 21, 14, 8))
  more = _prompts((19, 0, 7, 25, 2, 11, 16, 4, 9, 13), seed=5)
  more[1] = None
  one, split = Sampler(model, dataclasses.replace(short, prefill_piece=0)), Sampler(model, pieces)
  a, b = one.generate(prompts), split.generate(prompts)
  a2, b2 = one.continue_(a.state, more), split.continue_(b.state, more)
  assert a.tokens == b.tokens and a2.tokens == b2.tokens
  for x, y in zip(a.logprobs + a2.logprobs, b.logprobs + b2.logprobs):
    np.testing.assert_allclose(y, x, atol=1e-5)
  assert split.prefill_tokens == one.prefill_tokens
  plan = split._prefill_pieces(np.array([19, 0, 7, 25, 2, 11, 16, 4, 9, 13, 0, 0, 0, 0, 0, 0]), 16, pieces)
  assert plan == [([0, 2, 3, 4, 5, 6, 7, 8, 9], 0, 16, 16, 16), ([0, 3], 16, 32, 16, 2)]
  # a piece is at least the smallest width bucket (16), so no piece pads to a wider one
  assert split._prefill_pieces(np.array([19, 0, 7, 25]), 4, dataclasses.replace(pieces, prefill_piece=8))[0][1:4] == (
      0, 16, 16)


def test_a_few_fed_rows_decode_in_a_batch_of_their_own(tiny):
  """`continue_` feeding 2 rows of an 8-row state decodes them in a 2-row batch (`_continue_subset`), with the
  tokens and log-probs of the full-width call, and the idle rows' caches come back intact: feeding the other rows
  next, then every row, gives what one full-width call per round gives."""
  model, _, _ = tiny
  short = SamplingConfig(max_new_tokens=8, greedy=True)
  prompts = _prompts((9, 6, 13, 4, 7, 12, 5, 10))
  c = _prompts((3,) * 8, seed=3)
  f = _prompts((2,) * 8, seed=4)
  ref, test = Sampler(model, short), Sampler(model, short)
  r1 = ref.continue_(ref.generate(prompts).state, c)
  r2 = ref.continue_(r1.state, f)
  state = test.generate(prompts).state
  steps = test.decode_row_steps
  few = test.continue_(state, [c[b] if b in (2, 5) else None for b in range(8)])
  assert test.decode_row_steps - steps <= 2 * short.max_new_tokens  # two rows computed, not eight
  assert few.tokens == [r1.tokens[2], r1.tokens[5]]
  np.testing.assert_allclose(np.concatenate(few.logprobs), np.concatenate([r1.logprobs[2], r1.logprobs[5]]),
                             atol=1e-5)
  rest = test.continue_(few.state, [None if b in (2, 5) else c[b] for b in range(8)])
  assert rest.tokens == [t for b, t in enumerate(r1.tokens) if b not in (2, 5)]
  final = test.continue_(rest.state, f)
  assert final.tokens == r2.tokens and final.state.history == r2.state.history


def test_prompt_buckets_bound_compilations(tiny):
  model, _, _ = tiny
  sampler = Sampler(model, SamplingConfig(max_new_tokens=8, greedy=True))
  sampler.generate(_prompts((5, 9, 3)))
  after_first = sampler.compilations
  for lengths in [(6, 14, 2), (16,), (1, 2, 3, 9)]:  # same length buckets, batch buckets 4 / 1 / 4
    sampler.generate(_prompts(lengths))
  assert after_first == 2  # one prefill + one decode program
  assert sampler.compilations == 4  # only batch bucket 1 added a prefill + decode pair


def test_stop_token_and_finish_reasons(tiny):
  model, ref, _ = tiny
  prompts = _prompts()
  free = Sampler(model, GREEDY).generate(prompts)
  stop_id = free.tokens[0][6]  # a token row 0 emits at step 6
  out = Sampler(model, SamplingConfig(max_new_tokens=40, greedy=True, stop_token_ids=(stop_id,))).generate(prompts)
  first = free.tokens[0].index(stop_id)
  assert out.tokens[0] == free.tokens[0][:first + 1] and out.finish_reason[0] == "stop"
  for b in (1, 2):
    expect = free.tokens[b][:free.tokens[b].index(stop_id) + 1] if stop_id in free.tokens[b] else free.tokens[b]
    assert out.tokens[b] == expect


def test_seeded_sampling_is_deterministic_and_logprobs_are_policy_logprobs(tiny):
  model, ref, _ = tiny
  cfg = SamplingConfig(max_new_tokens=12, temperature=0.7, top_p=0.9, top_k=20, seed=3)
  sampler = Sampler(model, cfg)
  prompts = _prompts()
  a, b = sampler.generate(prompts), sampler.generate(prompts)
  assert a.tokens == b.tokens
  assert sampler.generate(prompts, seed=4).tokens != a.tokens
  # returned log-probs equal log softmax(logits / T) of transformers' full forward over prompt + sample
  seq, n = prompts[0] + a.tokens[0], len(prompts[0])
  rows = torch.arange(n - 1, len(seq) - 1)
  pick = lambda m: torch.log_softmax(m(torch.tensor([seq])).logits[0] / 0.7, -1)[rows, torch.tensor(a.tokens[0])]
  ref32, ref64 = torch_f32_f64(ref, lambda m, _: pick(m))
  assert_close_to_reference(a.logprobs[0], ref32, ref64, what="sampled-token log-probs")


def test_recorded_entropies_are_the_sampling_distributions_and_change_no_sample(tiny):
  model, ref, _ = tiny
  cfg = SamplingConfig(max_new_tokens=12, temperature=0.7, top_p=0.9, seed=3)
  prompts = _prompts()
  plain = Sampler(model, cfg).generate(prompts)
  out = Sampler(model, dataclasses.replace(cfg, entropy=True)).generate(prompts)
  assert out.tokens == plain.tokens and plain.entropies is None
  for a, b in zip(out.logprobs, plain.logprobs):
    np.testing.assert_array_equal(a, b)
  # the entropy of softmax(logits / T) (before top-p truncation) of transformers' full forward, per sampled token
  seq, n = prompts[1] + out.tokens[1], len(prompts[1])
  rows = torch.arange(n - 1, len(seq) - 1)

  def entropy(m):
    logp = torch.log_softmax(m(torch.tensor([seq])).logits[0] / 0.7, -1)[rows]
    return -(logp.exp() * logp).sum(-1)
  ref32, ref64 = torch_f32_f64(ref, lambda m, _: entropy(m))
  assert [len(e) for e in out.entropies] == [len(t) for t in out.tokens]
  assert_close_to_reference(out.entropies[1], ref32, ref64, what="sampled-token entropies")


def test_token_entropy_counts_masked_logits_as_zero_probability():
  logits = np.array([[1.0, 2.0, -np.inf, 0.5], [0.0, -np.inf, -np.inf, 3.0]], np.float32)
  cfg = SamplingConfig(temperature=0.5)
  got = np.asarray(token_entropy(jnp.asarray(logits), cfg))
  z = logits / 0.5
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  want = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), -1)
  np.testing.assert_allclose(got, want, rtol=1e-5)
  assert np.isfinite(got).all()


def test_row_streams_sample_a_row_alike_in_any_batch(tiny):
  """With `row_ids` each row samples from its own stream: a row draws the same tokens alone, at another position
  of a smaller batch and in a continued turn as in the whole batch (what lets RL rollouts split over processes
  equal the one-process run); with one stream for the batch its tokens depend on the batch."""
  model, _, _ = tiny
  sampler = Sampler(model, SamplingConfig(max_new_tokens=12, temperature=1.5, seed=3))
  a, b, c = _prompts()
  whole = sampler.generate([a, b, c], row_ids=[10, 11, 12])
  alone = sampler.generate([b], row_ids=[11])
  swapped = sampler.generate([c, b], row_ids=[12, 11])
  assert alone.tokens[0] == whole.tokens[1] == swapped.tokens[1] and swapped.tokens[0] == whole.tokens[2]
  assert len({tuple(t) for t in whole.tokens}) == 3
  again = sampler.continue_(whole.state, [[5], [6], [7]], row_ids=[10, 11, 12])
  assert sampler.continue_(alone.state, [[6]], row_ids=[11]).tokens[0] == again.tokens[1]
  assert sampler.generate([b]).tokens[0] != sampler.generate([a, b, c]).tokens[1]


def test_top_k_one_is_greedy_and_top_p_keeps_the_nucleus():
  logits = jnp.asarray([[0.0, 3.0, 1.0, 2.9], [5.0, 0.0, 0.0, 0.0]])
  key = jax.random.PRNGKey(0)
  tok, _ = sample_token(logits, key, SamplingConfig(top_k=1))
  assert tok.tolist() == [1, 0]
  # nucleus of row 0 at p=0.5 is {1} alone (p(1) ~ 0.49 < 0.5 -> {1, 3}); never token 0 or 2
  draws = [sample_token(logits, jax.random.PRNGKey(i), SamplingConfig(top_p=0.5))[0][0] for i in range(40)]
  assert set(int(d) for d in draws) <= {1, 3} and len(set(int(d) for d in draws)) == 2


def test_greedy_token_is_argmax_and_its_log_softmax():
  """Ties pick the first maximum and a NaN row picks its first NaN, as jnp.argmax; log-probs equal log_softmax."""
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 51864)).astype(np.float32) * 4
  logits[1, [7, 300, 9000]] = logits[1].max() + 1.0  # a three-way tie
  logits[2, [50, 40000]] = np.nan
  logits[3, :] = -1e30
  logits = jnp.asarray(logits)
  tok, logp = jax.jit(lambda x: sample_token(x, jax.random.PRNGKey(0), SamplingConfig(greedy=True)))(logits)
  expected = jnp.argmax(logits, axis=-1)
  assert tok.tolist() == expected.tolist() and tok.tolist()[1:4] == [7, 50, 0]
  ref = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), expected[:, None], axis=-1)[:, 0]
  finite = np.arange(6) != 2
  np.testing.assert_allclose(np.asarray(logp)[finite], np.asarray(ref)[finite], rtol=0, atol=1e-6)


def test_stop_string_truncates_and_continuation_rolls_back(smollm2):
  """Against a decode without stop strings, cut by hand at the first "France" of its text; the next turn equals a
  fresh prefill of prompt + kept tokens + new tokens, built here and not from the sampler's history."""
  from m3jax.models.tokenizer import chat_ids
  model, tok = smollm2
  prompt = chat_ids(tok, [{"role": "user", "content": "What is the capital of France?"}])
  free = Sampler(model, SamplingConfig(max_new_tokens=24, greedy=True), tokenizer=tok).generate([prompt]).tokens[0]
  text = tok.decode(free, skip_special_tokens=False)
  assert "France" in text
  kept = next(k for k in range(1, len(free) + 1) if "France" in tok.decode(free[:k], skip_special_tokens=False))
  assert kept + 3 <= len(free)
  # the host first looks at the text 3 tokens after the stop string: they are in the cache and must be rolled back
  cfg = SamplingConfig(max_new_tokens=24, greedy=True, stop_strings=("France",), stop_check_interval=kept + 3)
  sampler = Sampler(model, cfg, tokenizer=tok)
  out = sampler.generate([prompt])
  assert out.finish_reason == ["stop_string"] and out.tokens[0] == free[:kept]
  assert out.text[0] == text[:text.index("France") + len("France")]
  more, short = tok.encode(" and", add_special_tokens=False), SamplingConfig(max_new_tokens=6, greedy=True)
  nxt = sampler.continue_(out.state, [more], short)
  assert nxt.tokens == sampler.generate([prompt + free[:kept] + more], short).tokens


def test_sharded_forward_and_decode_equal_single_device(tiny):
  _, _, path = tiny
  single = load_hf(path)
  mesh = make_mesh(data=1, fsdp=4, tensor=2)
  sharded = load_hf(path, mesh=mesh)
  assert sharded.wq[...].sharding.spec == jax.sharding.PartitionSpec(None, "fsdp", "tensor", None)
  toks = jnp.asarray(np.random.RandomState(0).randint(0, 320, (4, 9)))
  a, _ = single(toks)
  b = jax.jit(lambda t: sharded(t)[0])(toks)
  np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
  prompts = _prompts((5, 11, 8, 3))
  cfg = SamplingConfig(max_new_tokens=16, greedy=True)
  one, many = Sampler(single, cfg).generate(prompts), Sampler(sharded, cfg, mesh=mesh).generate(prompts)
  assert one.tokens == many.tokens
  for x, y in zip(one.logprobs, many.logprobs):
    np.testing.assert_allclose(x, y, atol=1e-5)


def test_bad_requests_fail_clearly(tiny):
  model, _, _ = tiny
  sampler = Sampler(model, GREEDY)
  with pytest.raises(ValueError, match="at least one token"):
    sampler.generate([[1, 2], []])
  with pytest.raises(ValueError, match="exceeds the largest bucket"):
    sampler.generate([[1] * 40000])
  with pytest.raises(ValueError, match="temperature"):
    SamplingConfig(temperature=0.0)


def _nucleus(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> dict[int, float]:
  """HF `generate`'s warper order, in float64: temperature, then top-k, then top-p on the renormalised top-k
  (a token stays when the mass strictly above it is < top_p); token -> probability of the final distribution."""
  scaled = logits.astype(np.float64) / temperature
  order = np.argsort(-scaled, kind="stable")[:top_k]
  p = np.exp(scaled[order] - scaled[order].max())
  p /= p.sum()
  keep = order[np.cumsum(p) - p < top_p]
  q = np.exp(scaled[keep] - scaled[keep].max())
  return dict(zip(keep.tolist(), (q / q.sum()).tolist()))


def test_top_k_with_top_p_samples_exactly_the_truncated_renormalised_distribution():
  """The production setting (T 0.6, top-k 20, top-p 0.95) on one logits row where both truncations bind: the top
  20 hold ~60% of the mass (a nucleus over the whole vocabulary would reach beyond them) and top-p then drops the
  tail of those 20. 200k draws: support within the numpy nucleus, frequencies by a chi-square test."""
  from scipy import stats
  rng = np.random.default_rng(0)
  scaled = np.concatenate([np.linspace(3.0, 0.0, 20), rng.uniform(-3.0, -0.5, 300)])
  logits = (rng.permutation(scaled) * 0.6).astype(np.float32)
  cfg = SamplingConfig(temperature=0.6, top_k=20, top_p=0.95)
  want = _nucleus(logits, 0.6, 20, 0.95)
  assert 5 < len(want) < 20 and len(_nucleus(logits, 0.6, 320, 0.95)) > 20  # both truncations bind
  n = 200_000
  draw = jax.jit(jax.vmap(lambda key: sample_token(jnp.asarray(logits)[None], key, cfg)[0][0]))
  toks = np.asarray(draw(jax.random.split(jax.random.PRNGKey(1), n)))
  outside = set(np.unique(toks).tolist()) - set(want)
  assert not outside, f"sampled outside the top-k/top-p support: {sorted(outside)}"
  support = sorted(want)
  counts = np.array([(toks == t).sum() for t in support])
  expected = n * np.array([want[t] for t in support])
  assert stats.chisquare(counts, expected).pvalue > 1e-3


def _penalised_greedy_reference(forward, vocab, prompt, n, frequency, presence):
  """Greedy decode by full forward passes, penalties in numpy (OpenAI's definition: the logit of token j is
  lowered by frequency * c[j] + presence * (c[j] > 0), c[j] = times j was generated so far)."""
  width = len(prompt) + n
  seq, counts = list(prompt), np.zeros(vocab)
  for _ in range(n):
    padded = np.zeros((1, width), np.int32)
    padded[0, :len(seq)] = seq  # causal: the padding after the last token does not change its logits
    logits = np.asarray(forward(jnp.asarray(padded)))[len(seq) - 1].astype(np.float64)
    tok = int(np.argmax(logits - frequency * counts - presence * (counts > 0)))
    seq.append(tok)
    counts[tok] += 1
  return seq[len(prompt):]


def test_frequency_and_presence_penalties_match_their_definition(tiny):
  """At 0.03 (this model's top logits lie ~0.02-0.2 apart, and it loops on a 2-token phrase without penalties),
  where a token generated 3 times is lowered 0.09 by the frequency penalty but 0.03 by the presence penalty: each
  greedy decode equals the numpy reference's, and the two kinds decode differently."""
  model, _, _ = tiny
  prompt, n = _prompts((7,))[0], 24
  forward = jax.jit(lambda t: model(t)[0][0])
  runs = {}
  for freq, pres in [(0.03, 0.0), (0.0, 0.03), (0.02, 0.03)]:
    cfg = SamplingConfig(max_new_tokens=n, greedy=True, frequency_penalty=freq, presence_penalty=pres)
    got = Sampler(model, cfg).generate([prompt]).tokens[0]
    assert got == _penalised_greedy_reference(forward, model.cfg.vocab_size, prompt, n, freq, pres), (freq, pres)
    runs[freq, pres] = got
  plain = Sampler(model, SamplingConfig(max_new_tokens=n, greedy=True)).generate([prompt]).tokens[0]
  assert len({tuple(plain), tuple(runs[0.03, 0.0]), tuple(runs[0.0, 0.03])}) == 3  # penalties and kinds matter
  assert max(runs[0.03, 0.0].count(t) for t in set(runs[0.03, 0.0])) >= 3  # repeated tokens: the kinds differ


def test_slots_starting_one_prompt_prefill_it_once(tiny):
  """Continuous batching: empty slots that start the same prompt in one call (an RL group entering its slots)
  prefill it once and copy the cache row; tokens and log-probs equal prefilling each slot, and a slot that already
  holds a conversation is never a copy source."""
  model, _, _ = tiny
  a, b = _prompts((7, 12))
  short = SamplingConfig(max_new_tokens=10, greedy=True)
  shared, separate = Sampler(model, short), Sampler(model, short, share_prefix=False)
  one = shared.continue_(shared.empty_state(4), [a, a, b, a])
  ref = separate.continue_(separate.empty_state(4), [a, a, b, a])
  assert one.tokens == ref.tokens and one.state.history == ref.state.history
  for x, y in zip(one.logprobs, ref.logprobs):
    np.testing.assert_allclose(x, y, atol=1e-5)
  assert shared.prefill_tokens_saved == 2 * 7 and shared.prefill_tokens == 7 + 12
  shared.reset_rows(one.state, [1])
  separate.reset_rows(ref.state, [1])
  two, ref2 = shared.continue_(one.state, [[5], a, None, None]), separate.continue_(ref.state, [[5], a, None, None])
  assert two.tokens == ref2.tokens and shared.prefill_tokens_saved == 2 * 7  # row 0 is not empty: no copy
