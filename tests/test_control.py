"""The whole control loop: a deterministic rule-based policy driving the real memory search over the fixture graphs."""

import dataclasses
import json
import pathlib

import numpy as np
import pytest

from m3jax.control import prompts
from m3jax.control.controller import Controller, ControlConfig, Question
from m3jax.control.policy import Turn
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.search import MemorySearcher, SearchConfig
from m3jax.memory.reference_pickle import load_reference_pickle

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"


class ScriptedPolicy:
  """Test double of the policy interface: turn k of a row is `script[row][k]` formatted with the last result.

  It records every message it receives, and reports fake token ids (context: one id per message character
  count bucket, generated: one per word) so trajectory assembly can be checked without an LLM.
  """

  def __init__(self, scripts):
    self.scripts = scripts
    self.received: list[list[str]] = []
    self.rounds: list[int] = []

  def _turn(self, row, message):
    self.received[row].append(message)
    k = self.rounds[row]
    self.rounds[row] += 1
    text = self.scripts[row][k]
    words = text.split()
    return Turn(text=text, context_ids=[len(message) % 97, 1000 + row], gen_ids=list(range(len(words))),
                logprobs=-np.arange(1, len(words) + 1, dtype=np.float32) / 10, finish_reason="stop")

  def begin(self, conversations):
    self.received = [[c[0]["content"]] for c in conversations]
    self.rounds = [0] * len(conversations)
    return [self._turn(i, c[-1]["content"]) for i, c in enumerate(conversations)]

  def step(self, rows, user_messages):
    return [self._turn(r, m) for r, m in zip(rows, user_messages)]


class CountingSearcher:
  """Delegates to the real searcher and records every batch of requests it was given."""

  def __init__(self, searcher):
    self.searcher = searcher
    self.batches = []

  def search(self, requests):
    self.batches.append(list(requests))
    return self.searcher.search(requests)


@pytest.fixture(scope="module")
def searcher():
  embed = HashedBowEmbedder.from_json(FIXTURES / "small.embedder.json")
  graphs = [load_reference_pickle(FIXTURES / f"{name}.pkl") for name in ("small", "medium")]
  return MemorySearcher(graphs, embed, SearchConfig())


def S(query):
  return f"<think>need more</think>\nAction: [Search]\nContent: {query}"


def A(answer):
  return f"Action: [Answer]\nContent: {answer}"


def test_rule_policy_drives_real_search_over_two_graphs(searcher):
  counting = CountingSearcher(searcher)
  questions = [
    Question("s1", "Who made the coffee?", "Alice", graph_index=0, graph_key="small"),
    Question("m1", "Who broke the vase?", "Jack", graph_index=1, graph_key="medium", before_clip=30),
    Question("s2", "What did Chloe lose?", "math homework", graph_index=0, graph_key="small"),
    Question("m2", "What did the family eat?", "pizza", graph_index=1, graph_key="medium", before_clip=4),
  ]
  policy = ScriptedPolicy([
    [S("What is the name of <character_1>"), S("What is the name of <character_1>"), A("Alice")],
    [S("What is the character id of Jack"), "I am not sure.", S("vase broken football"), A("Jack")],
    [A("math homework")],
    [S("dinner food"), S("dinner pizza"), S("dinner meal"), S("family dinner"), S("still searching")],
  ])
  trajs = Controller(policy, counting, ControlConfig(max_rounds=5)).run(questions)
  s1, m1, s2, m2 = trajs

  # finished / unanswered, rounds used
  assert [t.response for t in trajs] == ["Alice", "Jack", "math homework", None]
  assert [len(t.rounds) for t in trajs] == [3, 4, 1, 5]
  # one searcher call per round for all active questions of both graphs
  assert [len(b) for b in counting.batches] == [3, 2, 2, 1]  # format errors and last rounds search nothing
  assert {r.graph_index for r in counting.batches[0]} == {0, 1}

  # routing: "character id" -> node route; everything else clip route
  assert [r.route for r in m1.rounds] == ["node", None, "clip", None]
  assert [r.action for r in m1.rounds] == ["search", "format_error", "search", "answer"]
  assert all(r.route == "clip" for r in s1.rounds[:2])

  # per-question memory of returned clips: the repeated query gets different clips, and is sent with exclusions
  first, second = s1.rounds[0].retrieved_clips, s1.rounds[1].retrieved_clips
  assert first and second and not set(first) & set(second)
  assert counting.batches[1][0].exclude_clips == tuple(first)
  assert s1.current_clips == first + second
  # node-route clips are not added to current_clips
  assert m1.rounds[0].retrieved_clips and m1.current_clips == m1.rounds[2].retrieved_clips

  # before_clip honoured on both routes; passed with every request
  assert all(c <= 30 for r in m1.rounds for c in r.retrieved_clips)
  unbounded = dataclasses.replace(counting.batches[0][1], before_clip=None)
  assert unbounded.route == "node" and max(searcher.search([unbounded])[0].clips) > 30
  assert all(c <= 4 for r in m2.rounds for c in r.retrieved_clips)
  assert all(req.before_clip == 4 for b in counting.batches for req in b if req.query.startswith("dinner"))
  # every request carries the question it serves (the node route ranks with it under SearchConfig.node_context)
  asked = {q.question for q in questions}
  assert all(req.context in asked for b in counting.batches for req in b)
  assert counting.batches[0][1].context == "Who broke the vase?"

  # the result messages are the searcher's own text, and what the policy received next (plus the instruction)
  direct = searcher.search([counting.batches[0][0]])[0]
  assert s1.rounds[0].result_text == direct.text
  assert policy.received[0][2] == s1.rounds[0].result_text + prompts.INSTRUCTION
  # format error: empty search, no request, the empty-result message
  assert m1.rounds[1].result_text == prompts.search_result_message({})
  assert m1.rounds[1].empty_search and m1.num_format_errors == 1
  # last round: the forced-answer suffix is appended; a last-round search runs no search and ends unanswered
  assert policy.received[3][5] == m2.rounds[3].result_text + prompts.INSTRUCTION + prompts.LAST_ROUND_SUFFIX
  assert m2.rounds[4].result_text == "" and m2.rounds[4].retrieved_clips == []
  assert m2.num_searches == 5 and not m2.finished
  # system prompt and first message
  assert policy.received[2][0] == prompts.SYSTEM_PROMPT.format(question="What did Chloe lose?")
  assert policy.received[2][1] == "Searched knowledge: {}" + prompts.INSTRUCTION


def test_trajectory_tokens_mask_logprobs_and_json_roundtrip(searcher):
  policy = ScriptedPolicy([[S("coffee"), A("Alice made coffee")]])
  traj = Controller(policy, searcher).run([Question("q", "Who made coffee?", "Alice", graph_index=0)])[0]
  gen1, gen2 = len(S("coffee").split()), len(A("Alice made coffee").split())
  assert len(traj.token_ids) == 2 + gen1 + 2 + gen2
  expected_mask = [0, 0] + [1] * gen1 + [0, 0] + [1] * gen2
  assert traj.generated.astype(int).tolist() == expected_mask
  assert np.all(traj.logprobs[~traj.generated] == 0) and np.all(traj.logprobs[traj.generated] < 0)
  assert traj.token_ids[1] == 1000 and traj.rounds[0].num_generated == gen1
  line = json.loads(json.dumps(traj.to_json()))
  back = type(traj).from_json(line)
  assert back.rounds == traj.rounds and back.response == "Alice made coffee"
  np.testing.assert_array_equal(back.token_ids, traj.token_ids)
  np.testing.assert_array_equal(back.generated, traj.generated)
  np.testing.assert_allclose(back.logprobs, traj.logprobs, atol=1e-6)


def test_multiple_choice_instruction_and_policy_contract(searcher):
  policy = ScriptedPolicy([[A("B")]])
  q = Question("mc", "Which drink?\nA. tea\nB. coffee", "B", graph_index=0, multiple_choice=True)
  traj = Controller(policy, searcher, ControlConfig(max_rounds=1)).run([q])[0]
  assert policy.received[0][1] == ("Searched knowledge: {}" + prompts.INSTRUCTION_MULTIPLE_CHOICE +
                                   prompts.LAST_ROUND_SUFFIX)
  assert traj.response == "B"

  class Broken(ScriptedPolicy):
    def begin(self, conversations):
      return super().begin(conversations)[:-1]

  with pytest.raises(ValueError, match="policy returned 1 turns for 2"):
    Controller(Broken([[A("x")], [A("y")]]), searcher).run([q, q])
  with pytest.raises(ValueError, match="max_rounds"):
    ControlConfig(max_rounds=0)
  assert Controller(policy, searcher).run([]) == []


def test_without_inter_turn_instruction_only_the_first_message_carries_it(searcher):
  """The no-inter-turn-instruction protocol: tool results arrive bare, the last round keeps its must-answer
  suffix, and the reference protocol (the default) repeats the instruction every round."""
  scripts = [[S("coffee"), S("Alice"), A("Alice")]]
  bare = ScriptedPolicy(scripts)
  Controller(bare, searcher, ControlConfig(max_rounds=3, inter_turn_instruction=False)).run(
      [Question("q", "Who made the coffee?", "Alice", graph_index=0)])
  first, second, last = bare.received[0][1:]
  assert first == "Searched knowledge: {}" + prompts.INSTRUCTION
  assert second.startswith("Searched knowledge: ") and prompts.INSTRUCTION not in second
  assert last.endswith(prompts.LAST_ROUND_SUFFIX) and prompts.INSTRUCTION not in last
  full = ScriptedPolicy(scripts)
  Controller(full, searcher, ControlConfig(max_rounds=3)).run(
      [Question("q", "Who made the coffee?", "Alice", graph_index=0)])
  assert full.received[0][2].endswith(prompts.INSTRUCTION)
  assert full.received[0][3].endswith(prompts.INSTRUCTION + prompts.LAST_ROUND_SUFFIX)
