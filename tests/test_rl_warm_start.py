"""Behaviour-cloning warm start: the expert's protocol, the NLL objective, and `RLProgram.warm_start`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from m3jax.control.controller import ControlConfig, Controller, Question
from m3jax.control.prompts import END_OF_TURN, FIRST_USER_MESSAGE, render_chatml, round_suffix, system_message
from m3jax.config import load_config
from m3jax.rl import losses
from m3jax.rl.program import RLProgram
from m3jax.rl.rollout import group_questions
from m3jax.rl.warm_start import ExpertPolicy, expert_turn

Q = Question("q", "Where did Rachel put the wallet?", "On the sofa.", 0)


def test_expert_resolves_names_then_searches_with_ids_then_answers():
  assert expert_turn(Q, "", 0, 4, []) == "Action: [Search]\nContent: What is the character id of Rachel"
  ids = '{"CLIP_0": ["<character_0>\'s name is Rachel.", "<character_0> is present."]}'
  assert expert_turn(Q, ids, 1, 4, ["What is the character id of Rachel"]) == (
      "Action: [Search]\nContent: Where did <character_0> put the wallet?")
  found = ids + ' {"CLIP_1": ["<character_0> put the wallet on the sofa."]}'
  assert expert_turn(Q, found, 2, 4, []) == "Action: [Answer]\nContent: On the sofa."
  assert expert_turn(Q, ids, 3, 4, []) == "Action: [Answer]\nContent: On the sofa."  # last round: always answer
  who = Question("w", "Who said they will go to the park tomorrow?", "Susan.", 0)
  hit = '{"CLIP_1": ["<character_1> says: \\"Tomorrow I will go to the park.\\""]}'
  assert expert_turn(who, hit, 1, 4, [who.question]) == "Action: [Search]\nContent: What is the name of <character_1>"
  # the answer must be in the retrieved text (normalised containment), not in the question
  assert expert_turn(who, hit + " <character_1>'s name is Susan.", 2, 4, []).endswith("Content: Susan.")


def test_nll_objective_is_masked_token_mean_of_minus_logp():
  logp = jnp.log(jnp.array([[0.5, 0.25, 0.9], [0.1, 0.2, 0.3]]))
  mask = jnp.array([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
  cfg = losses.LossConfig(objective="nll")
  loss, _ = losses.policy_loss(logp, logp + 5.0, jnp.full((2,), -3.0), mask, cfg)  # adv / old logp ignored
  expected = -(np.log(0.25) + np.log(0.9) + np.log(0.1)) / 3
  assert float(loss) == pytest.approx(expected, rel=1e-6)
  with pytest.raises(losses.LossConfigError, match="objective"):
    losses.LossConfig(objective="sft")


def test_warm_start_clones_the_expert_on_the_llm_token_layout(tmp_path):
  cfg = dataclasses.replace(load_config("configs/rl_tiny.py"), train_seeds=(0, 2), eval_seeds=(0, 0), max_rounds=4,
                            warm_start_steps=6, warm_start_questions=4, warm_start_lr=1e-2, seq_bucket=256,
                            out_dir=str(tmp_path / "run"))
  program = RLProgram(cfg)
  dapo_learner = program.learner
  history = program.warm_start()
  assert len(history) == 6 and all(np.isfinite(h["loss"]) for h in history)
  # the same 8 training questions come round again at steps 3-4 / 5-6: their loss has dropped
  assert history[4]["loss"] < history[0]["loss"] and history[5]["loss"] < history[1]["loss"]
  assert program.learner is not dapo_learner and program.learner.step == 0   # DAPO starts with a fresh optimizer
  # the DAPO learner trains the cloned parameters, and the sampler's model holds them too
  for a, b in zip(jax.tree.leaves(program.learner.params), jax.tree.leaves(nnx.state(program.model, nnx.Param))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))

  # rollouts of the cloned policy through 2 continuously refilled slots: the static batch's trajectories
  records, ids = program.train_records[:3], [5, 1, 4, 0, 3, 2]
  static, _ = program.rollout(records, seed=3, group=2, row_ids=ids)
  program.cfg = dataclasses.replace(cfg, rollout_slots=2)
  slotted, _ = program.rollout(records, seed=3, group=2, row_ids=ids)
  assert [t.token_ids.tolist() for t in slotted] == [t.token_ids.tolist() for t in static]

  # expert trajectories are token-for-token the rendered conversation, with exactly the assistant turns trained
  questions = group_questions(program.train_records[:3], 1)
  trajs = Controller(ExpertPolicy(questions, program.tokenizer, 4), program.searcher, ControlConfig(4)).run(questions)
  for q, t in zip(questions, trajs):
    messages = [system_message(q.question), {"role": "user", "content": FIRST_USER_MESSAGE + round_suffix(0, 4)}]
    for i, r in enumerate(t.rounds):
      messages.append({"role": "assistant", "content": r.text.removesuffix(END_OF_TURN)})
      if r.result_text:
        messages.append({"role": "user", "content": r.result_text + round_suffix(i + 1, 4)})
    rendered = render_chatml(messages, add_generation_prompt=False).removesuffix("\n")
    assert t.token_ids.tolist() == program.tokenizer.encode(rendered, add_special_tokens=False)
    assert t.finished and t.response == q.answer
    generated = program.tokenizer.decode([i for i, g in zip(t.token_ids, t.generated) if g])
    assert generated == "".join(r.text for r in t.rounds)


@pytest.mark.parametrize("style", ["hindsight", "ladder", "direct"])
def test_expert_trajectories_on_every_family_and_unanswerable_questions(style):
  """Both teachers on the real searcher over gold-memory graphs of training episodes: every question (all
  families of the train split, unanswerable ones included) ends in a well-formed answer; an unanswerable one is
  declined with the canonical NOT_IN_MEMORY after searching. The hindsight teacher always gives the gold answer;
  the ladder and direct teachers never repeat a query and decline only where no search found anything."""
  from m3jax.data.memory_qa import make_task
  from m3jax.data.questions import FAMILIES, HELDOUT_FAMILY, NOT_IN_MEMORY, TEST_FAMILY
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.memory.search import MemorySearcher, SearchConfig
  from m3jax.models.tokenizer import load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path

  embed = HashedBowEmbedder.builtin()
  graphs, records = make_task(range(12), embed, embed.dim, split="train")
  assert {r.family for r in records} == set(FAMILIES) - {HELDOUT_FAMILY, TEST_FAMILY}
  questions = group_questions(records, 1)
  tok = load_tokenizer(smollm2_path())
  trajs = Controller(ExpertPolicy(questions, tok, 5, style), MemorySearcher(graphs, embed, SearchConfig()),
                     ControlConfig(5)).run(questions)
  declined = 0
  for r, t in zip(records, trajs):
    assert t.finished and all(x.action in ("search", "answer") for x in t.rounds)
    if style != "hindsight" and t.response != r.answer:
      assert t.response == NOT_IN_MEMORY and not any(x.retrieved_clips for x in t.rounds), (r, t.rounds)
      continue
    if style != "hindsight":
      queries = [x.content for x in t.rounds if x.action == "search"]
      assert len(queries) == len(set(queries)), queries
    assert t.response == r.answer, (r, t.response)
    if r.unanswerable:
      declined += 1
      assert t.response == NOT_IN_MEMORY and t.num_searches >= 1
  assert declined >= 10


# the search results the teacher tests read: an id lookup that also holds the answer, an empty search, and a
# "who" question's hit naming someone only by id
LOOKUP = "What is the character id of Rachel"
IDS = 'Searched knowledge: {"CLIP_0": ["<character_0>\'s name is Rachel.", "<character_0> put the wallet on the sofa."]}'
WHO = Question("w", "Who mentioned the wallet last?", "Olivia.", 0)
EMPTY = 'Searched knowledge: {}\n(The search result is empty.)'
HIT = 'Searched knowledge: {"CLIP_1": ["<character_1> says: \\"I put my wallet here.\\""]}'


def test_ladder_teacher_answers_after_the_fact_search_never_repeats_and_declines_after_looking():
  from m3jax.data.questions import NOT_IN_MEMORY

  def ladder(q, seen, r, asked):
    return expert_turn(q, seen, r, 5, asked, style="ladder")

  assert ladder(Q, "", 0, []) == f"Action: [Search]\nContent: {LOOKUP}"
  # the truth is already in view after the id lookup, but the fact search comes first (the hindsight teacher
  # answers here, a stopping rule the student cannot see)
  assert expert_turn(Q, IDS, 1, 5, [LOOKUP]) == "Action: [Answer]\nContent: On the sofa."
  fact = "Where did <character_0> put the wallet?"
  assert ladder(Q, IDS, 1, [LOOKUP]) == f"Action: [Search]\nContent: {fact}"
  assert ladder(Q, IDS + " " + IDS, 2, [LOOKUP, fact]) == "Action: [Answer]\nContent: On the sofa."
  # an unanswerable question: the same route, then a decline
  none = dataclasses.replace(Q, answer=NOT_IN_MEMORY)
  assert ladder(none, IDS, 1, [LOOKUP]) == f"Action: [Search]\nContent: {fact}"
  assert ladder(none, IDS + " " + IDS, 2, [LOOKUP, fact]) == f"Action: [Answer]\nContent: {NOT_IN_MEMORY}"
  # nothing retrieved: the question in key words once, then a decline rather than the same query again
  assert ladder(WHO, EMPTY, 1, [WHO.question]) == "Action: [Search]\nContent: mentioned wallet last"
  assert ladder(WHO, EMPTY + EMPTY, 2, [WHO.question, "mentioned wallet last"]).endswith(NOT_IN_MEMORY)
  # a person as the answer: names of the ids seen are looked up before answering
  assert ladder(WHO, HIT, 1, [WHO.question]) == "Action: [Search]\nContent: What is the name of <character_1>"
  assert ladder(WHO, HIT + " <character_1>'s name is Olivia.", 2, [WHO.question, "x"]).endswith("Content: Olivia.")
  # the last round always answers
  assert ladder(Q, IDS, 4, [LOOKUP]) == "Action: [Answer]\nContent: On the sofa."
  with pytest.raises(ValueError, match="expert style"):
    ExpertPolicy([Q], None, 5, style="oracle")


def test_direct_teacher_answers_after_the_first_search_that_found_memories():
  from m3jax.data.questions import NOT_IN_MEMORY

  def direct(q, seen, r, asked):
    return expert_turn(q, seen, r, 5, asked, style="direct")

  assert direct(Q, "", 0, []) == f"Action: [Search]\nContent: {LOOKUP}"
  assert direct(Q, IDS, 1, [LOOKUP]) == "Action: [Answer]\nContent: On the sofa."
  none = dataclasses.replace(Q, answer=NOT_IN_MEMORY)
  assert direct(none, IDS, 1, [LOOKUP]) == f"Action: [Answer]\nContent: {NOT_IN_MEMORY}"
  # an empty result: once more in key words, then a decline
  assert direct(WHO, EMPTY, 1, [WHO.question]) == "Action: [Search]\nContent: mentioned wallet last"
  assert direct(WHO, EMPTY + EMPTY, 2, [WHO.question, "mentioned wallet last"]).endswith(NOT_IN_MEMORY)
  # a person as the answer: the ids in view are named first
  assert direct(WHO, HIT, 1, [WHO.question]) == "Action: [Search]\nContent: What is the name of <character_1>"
  assert direct(WHO, HIT + " <character_1>'s name is Olivia.", 2, [WHO.question, "x"]).endswith("Content: Olivia.")


def test_rounds_skip_questions_whose_pass_rate_saturated(monkeypatch):
  """`RLProgram._generate_round` draws past questions the batcher skips (their last group's outcomes all equal)
  and feeds each group's outcomes back under its question id: a question the policy always solves is rolled out
  once, then skipped for `skip_for` steps, while only mixed groups reach the batch."""
  from m3jax.rl.dynamic_sampling import DynamicSamplingConfig

  cfg = dataclasses.replace(load_config("configs/rl_tiny.py"), train_seeds=(0, 1), eval_seeds=(0, 0), group_size=2,
                            batch_questions=2, sampling=DynamicSamplingConfig(max_rounds=3, skip_after=2, skip_for=100))
  program = RLProgram(cfg)
  solved = {r.question_id for r in program.train_records[::2]}  # a fake policy: always right on these, else mixed
  rolled = []

  def fake_rollout(records, seed, row_ids=None, model=None):
    rolled.extend(r.question_id for r in records)
    outcome = np.array([o for r in records for o in ([1.0, 1.0] if r.question_id in solved else [1.0, 0.0])])
    return [Question(f"{r.question_id}#{k}", r.question, r.answer, 0) for r in records for k in range(2)], \
        {"outcome": outcome}

  monkeypatch.setattr(program, "rollout", fake_rollout)
  it = iter(program.dataset)
  skipped = 0
  for step in range(1, 3 * len(program.train_records)):
    program.skipped_questions = 0
    batch, _ = program.batcher.fill(lambda n, box=[0]: program._generate_round(it, step, box, n), step)
    skipped += program.skipped_questions
    assert batch and not solved & {g.question_id for g in batch}  # only mixed groups are kept
  assert skipped > 0 and all(rolled.count(q) == 1 for q in solved & set(rolled))
  assert set(program.batcher.rates.saturated_at) == solved & set(rolled)
