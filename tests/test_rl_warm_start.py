"""Behaviour-cloning warm start: the expert's protocol, the NLL objective, and `RLProgram.warm_start`."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from m3jax.agent.control import ControlConfig, Controller, Question
from m3jax.agent.prompts import END_OF_TURN, FIRST_USER_MESSAGE, render_chatml, round_suffix, system_message
from m3jax.config import load_config
from m3jax.rl import losses
from m3jax.rl.program import RLProgram, _questions
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
  questions = _questions(program.train_records[:3], 1)
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


def test_expert_trajectories_on_every_family_and_unanswerable_questions():
  """The hindsight expert on the real searcher over gold-memory graphs of training episodes: every question
  (all families of the train split, unanswerable ones included) ends in a well-formed answer that is the gold
  answer; an unanswerable one is declined with the canonical NOT_IN_MEMORY after searching."""
  from m3jax.data.memory_qa import make_task
  from m3jax.data.questions import FAMILIES, HELDOUT_FAMILY, NOT_IN_MEMORY
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.memory.search import MemorySearcher, SearchConfig
  from m3jax.models.tokenizer import load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path

  embed = HashedBowEmbedder.builtin()
  graphs, records = make_task(range(12), embed, embed.dim, split="train")
  assert {r.family for r in records} == set(FAMILIES) - {HELDOUT_FAMILY}
  questions = _questions(records, 1)
  tok = load_tokenizer(smollm2_path())
  trajs = Controller(ExpertPolicy(questions, tok, 5), MemorySearcher(graphs, embed, SearchConfig()),
                     ControlConfig(5)).run(questions)
  declined = 0
  for r, t in zip(records, trajs):
    assert t.finished and t.response == r.answer, (r, t.response)
    assert all(x.action in ("search", "answer") for x in t.rounds)
    if r.unanswerable:
      declined += 1
      assert t.response == NOT_IN_MEMORY and t.num_searches >= 1
  assert declined >= 10
