"""The LLM policy on the m3jax Sampler: KV continuation == re-prefill, trajectory tokens == the conversation, and an
end-to-end smoke run with the real SmolLM2-135M-Instruct weights over the fixture graphs."""

import pathlib

import numpy as np
import pytest
from flax import nnx

from m3jax.control import prompts
from m3jax.control.controller import Controller, ControlConfig, Question
from m3jax.eval.judges import JudgeItem, LocalLLMJudge, Verdict
from m3jax.control.policy import ChatCompleter, LLMPolicy, continuation_text
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.search import MemorySearcher, SearchConfig
from m3jax.memory.reference_pickle import load_reference_pickle
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.tokenizer import load_tokenizer
from m3jax.models.weights.gguf import smollm2_path

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"
QUESTIONS = [
  Question("s1", "Who made the coffee in the morning?", "Alice", graph_index=0, graph_key="small"),
  Question("m1", "Who broke the blue vase?", "Jack", graph_index=1, graph_key="medium", before_clip=30),
  Question("s2", "Where was the math homework?", "under the sofa cushions", graph_index=0, graph_key="small"),
]


@pytest.fixture(scope="module")
def searcher():
  embed = HashedBowEmbedder.from_json(FIXTURES / "small.embedder.json")
  graphs = [load_reference_pickle(FIXTURES / f"{name}.pkl") for name in ("small", "medium")]
  return MemorySearcher(graphs, embed, SearchConfig())


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer(smollm2_path())


def test_continuation_pieces_tokenize_like_the_full_conversation(tokenizer):
  answer = "Action: [Search]\nContent: What is the name of <character_0>"
  conv = [prompts.system_message("Who?"), {"role": "user", "content": "Searched knowledge: {}" + prompts.INSTRUCTION}]
  result = prompts.search_result_message({"CLIP_1": ["<character_0> said hi."]}) + prompts.INSTRUCTION
  full = conv + [{"role": "assistant", "content": answer}, {"role": "user", "content": result}]

  def enc(text):
    return tokenizer.encode(text, add_special_tokens=False)

  pieces = enc(prompts.render_chatml(conv)) + enc(answer) + enc(continuation_text("length", result))
  assert pieces == enc(prompts.render_chatml(full))
  eos = enc(prompts.END_OF_TURN)
  assert enc(prompts.render_chatml(conv)) + enc(answer) + eos + enc(continuation_text("stop", result)) == pieces


def test_kv_continuation_matches_reprefill_and_records_the_conversation(tokenizer, searcher):
  cfg = DecoderConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                      num_kv_heads=2, head_dim=8, tie_embeddings=True)
  sampling = SamplingConfig(max_new_tokens=4, greedy=True, stop_token_ids=(2,))
  sampler = Sampler(Decoder(cfg, rngs=nnx.Rngs(3)), sampling, tokenizer)  # shared: one jit cache for both modes
  runs = {}
  for reuse in (True, False):
    policy = LLMPolicy(sampler, tokenizer, sampling, reuse_kv=reuse)
    runs[reuse] = (policy, Controller(policy, searcher, ControlConfig(max_rounds=2)).run(QUESTIONS[:2]))
  (kv_policy, kv), (_, re) = runs[True], runs[False]
  for a, b in zip(kv, re):
    assert len(a.rounds) == 2 and a.num_format_errors == 2  # a random model never follows the format
    np.testing.assert_array_equal(a.token_ids, b.token_ids)
    np.testing.assert_array_equal(a.generated, b.generated)
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
  for row, traj in enumerate(kv):
    # the recorded tokens are exactly what the sampler holds for the row, and decode to the ChatML conversation
    assert traj.token_ids.tolist() == kv_policy._history[row]
    messages = [prompts.system_message(traj.question),
                {"role": "user", "content": "Searched knowledge: {}" + prompts.round_suffix(0, 2)}]
    for k, r in enumerate(traj.rounds[:-1]):
      messages += [{"role": "assistant", "content": r.text.removesuffix(prompts.END_OF_TURN)},
                   {"role": "user", "content": r.result_text + prompts.round_suffix(k + 1, 2)}]
    expected = prompts.render_chatml(messages) + traj.rounds[-1].text
    assert tokenizer.decode(traj.token_ids.tolist(), skip_special_tokens=False) == expected
    assert int(traj.generated.sum()) == sum(r.num_generated for r in traj.rounds) == 8


def test_smollm2_end_to_end_smoke(smollm2, searcher):
  model, tok = smollm2
  sampling = SamplingConfig(max_new_tokens=8, greedy=True, stop_token_ids=(tok.convert_tokens_to_ids("<|im_end|>"),))
  sampler = Sampler(model, sampling, tok)
  trajs = Controller(LLMPolicy(sampler, tok, sampling), searcher, ControlConfig(max_rounds=2)).run(QUESTIONS[:2])
  for t in trajs:
    assert 1 <= len(t.rounds) <= 2 and t.rounds[0].text.strip()
    assert t.generated.any() and np.all(t.logprobs[t.generated] <= 0) and np.all(np.isfinite(t.logprobs))
    assert int(t.generated.sum()) == sum(r.num_generated for r in t.rounds)
  # the same weights as a local judge: every answered item gets a parsed or explicitly invalid verdict
  judge = LocalLLMJudge(ChatCompleter(sampler, tok, sampling))  # same config: reuses the compiled decode loop
  verdicts = judge.judge([JudgeItem("What is the capital of France?", "Paris", "Paris"),
                          JudgeItem("Who?", "Bob", "")])
  assert verdicts[0].raw.strip() and verdicts[1] == Verdict(correct=False, valid=True, raw="")



def test_action_constraints_make_every_turn_a_valid_action(tokenizer, searcher):
  """A random policy decoded inside the action format: every turn parses (never a format error), searches run,
  and the last round can only answer."""
  from m3jax.control.parsing import parse_turn
  from m3jax.control.policy import ActionConstraints

  cfg = DecoderConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, tie_embeddings=True)
  stop = tuple(tokenizer.encode(prompts.END_OF_TURN, add_special_tokens=False))
  sampling = SamplingConfig(max_new_tokens=24, temperature=1.0, stop_token_ids=stop, seed=5)
  rounds = 3
  actions = ActionConstraints.build(tokenizer, len(tokenizer), stop, rounds)
  policy = LLMPolicy(Sampler(Decoder(cfg, rngs=nnx.Rngs(2)), sampling, tokenizer), tokenizer, sampling,
                     actions=actions)
  trajs = Controller(policy, searcher, ControlConfig(max_rounds=rounds)).run(QUESTIONS * 2)
  turns = [r for t in trajs for r in t.rounds]
  assert all(r.action in ("search", "answer") for r in turns)
  assert all(parse_turn(r.text).action == r.action for r in turns)
  assert all(r.text.startswith("Action: [") for r in turns)
  assert any(r.action == "search" for r in turns) and all(t.finished for t in trajs)
  assert all(t.rounds[-1].action == "answer" for t in trajs if len(t.rounds) == rounds)


def test_min_searches_make_the_first_rounds_search(tokenizer, searcher):
  """`min_searches`: the first rounds can only search, later rounds run free (or in the action format, the last
  answer-only, with `max_rounds`); under continuous batching, rows at different rounds share one table of every
  kind and get the static batch's trajectories; a last round that could not answer is refused by name."""
  from m3jax.control.policy import ActionConstraints

  stop = tuple(tokenizer.encode(prompts.END_OF_TURN, add_special_tokens=False))
  assert ActionConstraints.build(tokenizer, len(tokenizer), stop, 4, min_searches=1).kinds == (
      "search", "any", "any", "answer")
  with pytest.raises(ValueError, match="min_searches=3"):
    ActionConstraints.build(tokenizer, len(tokenizer), stop, 3, min_searches=3)
  actions = ActionConstraints.build(tokenizer, len(tokenizer), stop, None, min_searches=2)
  assert actions.kinds == ("search", "search", "free") and actions.for_round(7) is actions.tables["free"]
  cfg = DecoderConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, tie_embeddings=True)
  sampling = SamplingConfig(max_new_tokens=16, temperature=1.0, stop_token_ids=stop, seed=5)
  sampler = Sampler(Decoder(cfg, rngs=nnx.Rngs(4)), sampling, tokenizer)
  questions = [Question(f"{q.question_id}_{i}", f"{q.question} ({i})", q.answer, q.graph_index, q.graph_key,
                        q.before_clip) for i in range(2) for q in QUESTIONS]
  row_ids = [7 * i for i in range(len(questions))]
  control = ControlConfig(max_rounds=4)
  static = Controller(LLMPolicy(sampler, tokenizer, sampling, actions=actions, row_ids=row_ids), searcher,
                      control).run(questions)
  first = [r for t in static for r in t.rounds[:2]]  # a turn cut by the token budget before its query is no search
  prefix = "Action: [Search]\nContent: "
  assert len(first) == 2 * len(questions) and all(r.text.startswith(prefix) or prefix.startswith(r.text)
                                                  for r in first)
  assert sum(r.action == "search" for r in first) >= len(first) // 2
  # a random model left free writes no action: format errors, never in the search-only rounds
  assert any(r.action == "format_error" for t in static for r in t.rounds[2:])
  slotted = Controller(LLMPolicy(sampler, tokenizer, sampling, actions=actions, row_ids=row_ids), searcher,
                       control).run(questions, slots=3)
  for a, b in zip(static, slotted):
    assert a.token_ids.tolist() == b.token_ids.tolist()  # log-probs up to float rounding across batch shapes
    np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=1e-4)


def test_continuous_batching_gives_the_static_trajectories(tokenizer, searcher):
  """Slots refilled as questions finish: every question's tokens, log-probs and searches equal the static batch's,
  greedy and (with per-episode row ids, as RL rollouts use) sampled, where questions end at different rounds;
  a rerun compiles nothing new."""
  from m3jax.control.policy import ActionConstraints

  cfg = DecoderConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, tie_embeddings=True)
  stop = tuple(tokenizer.encode(prompts.END_OF_TURN, add_special_tokens=False))
  rounds, control = 3, ControlConfig(max_rounds=3)
  actions = ActionConstraints.build(tokenizer, len(tokenizer), stop, rounds)
  model = Decoder(cfg, rngs=nnx.Rngs(4))
  questions = [Question(f"{q.question_id}_{i}", f"{q.question} ({i})", q.answer, q.graph_index, q.graph_key,
                        q.before_clip) for i in range(3) for q in QUESTIONS]
  row_ids = [100 + 3 * i for i in range(len(questions))]
  for sampling, ids in ((SamplingConfig(max_new_tokens=16, greedy=True, stop_token_ids=stop), None),
                        (SamplingConfig(max_new_tokens=16, temperature=1.0, stop_token_ids=stop, seed=5), row_ids)):
    sampler = Sampler(model, sampling, tokenizer)
    static = Controller(LLMPolicy(sampler, tokenizer, sampling, actions=actions, row_ids=ids), searcher,
                        control).run(questions)
    policy = LLMPolicy(sampler, tokenizer, sampling, actions=actions, row_ids=ids)
    before = sampler.compilations
    slotted = Controller(policy, searcher, control).run(questions, slots=2)
    compiled = sampler.compilations - before
    for a, b in zip(static, slotted):
      assert a.question_id == b.question_id and a.token_ids.tolist() == b.token_ids.tolist()
      np.testing.assert_array_equal(a.generated, b.generated)
      np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
      assert [r.retrieved_clips for r in a.rounds] == [r.retrieved_clips for r in b.rounds]
    heard = []
    rerun = Controller(policy, searcher, control).run(questions, slots=2,
                                                      on_finish=lambda i, t: heard.append((i, t)))
    assert [t.token_ids.tolist() for t in rerun] == [t.token_ids.tolist() for t in slotted]
    assert sorted(i for i, _ in heard) == list(range(len(questions)))  # each question heard of once, as it ends
    assert all(rerun[i] is t for i, t in heard)
    assert sampler.compilations - before == compiled  # the rerun reuses every program
  assert len({len(t.rounds) for t in static}) > 1  # sampled, questions end at different rounds: slots refill
  with pytest.raises(ValueError, match="slot policy"):
    Controller(object(), searcher, control).run(questions, slots=2)


def test_questions_joining_a_running_stream_get_the_static_trajectories(tokenizer, searcher):
  """`run_stream` (serve's request-level joining): questions handed over while others run take the free slots in
  the next call, each trajectory is reported as soon as it ends, and every one equals the static loop's (greedy);
  `take` returning None stops the loop once the running questions end."""
  import collections

  from m3jax.control.policy import ActionConstraints

  cfg = DecoderConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=16, tie_embeddings=True)
  stop = tuple(tokenizer.encode(prompts.END_OF_TURN, add_special_tokens=False))
  control = ControlConfig(max_rounds=3)
  actions = ActionConstraints.build(tokenizer, len(tokenizer), stop, 3)
  sampling = SamplingConfig(max_new_tokens=16, greedy=True, stop_token_ids=stop)
  sampler = Sampler(Decoder(cfg, rngs=nnx.Rngs(4)), sampling, tokenizer)
  questions = [Question(f"{q.question_id}_{i}", f"{q.question} ({i})", q.answer, q.graph_index, q.graph_key,
                        q.before_clip) for i in range(2) for q in QUESTIONS]
  static = Controller(LLMPolicy(sampler, tokenizer, sampling, actions=actions), searcher, control).run(questions)
  arrivals = [[0], [1], [], [2, 3, 4], [5]]  # what arrives before each call
  queue, events, running, overlaps = collections.deque(), [], set(), 0

  def take(n, idle):
    nonlocal overlaps
    if arrivals:
      queue.extend(arrivals.pop(0))
    elif not queue:
      return None
    got = [queue.popleft() for _ in range(min(n, len(queue)))]
    overlaps += bool(got and running)
    running.update(got)
    events.append(("take", got, n))
    return [(i, questions[i]) for i in got]

  def finish(key, traj):
    running.discard(key)
    events.append(("finish", key, traj))

  Controller(LLMPolicy(sampler, tokenizer, sampling, actions=actions), searcher, control).run_stream(
      take, finish, slots=2)
  finished = {e[1]: e[2] for e in events if e[0] == "finish"}
  assert sorted(finished) == list(range(len(questions))) and not running
  for i, t in finished.items():
    assert t.question_id == static[i].question_id and t.token_ids.tolist() == static[i].token_ids.tolist()
    np.testing.assert_allclose(t.logprobs, static[i].logprobs, atol=1e-4)
    assert [r.retrieved_clips for r in t.rounds] == [r.retrieved_clips for r in static[i].rounds]
  assert overlaps >= 1  # a question joined while another was still running
  assert all(len(e[1]) <= e[2] for e in events if e[0] == "take")  # never more than the free slots
