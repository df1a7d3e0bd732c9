"""The shipped controller (m3jax/data/controller): its adapter loads onto the real SmolLM2-135M-Instruct weights
and answers demo questions end to end — the paper's multi-turn protocol through the real search tools over the
demo episode's memories — with its own short answers, and declines an unanswerable question."""

import pytest

from m3jax.agent.answer import SHIPPED_CONTROLLER, LLMAnswerer
from m3jax.agent.control import Question
from m3jax.agent.demo import DemoConfig, answer_correct
from m3jax.data.memory_qa import episode_graph
from m3jax.data.questions import NOT_IN_MEMORY
from m3jax.models.bert import TextEmbedder
from m3jax.models.lora import read_adapter_meta

pytestmark = pytest.mark.slow


def test_the_shipped_adapter_names_its_base_model_and_protocol():
  info = read_adapter_meta(SHIPPED_CONTROLLER)
  assert info["base_model"] == "smollm2-135m-instruct" and info["rank"] == 8
  assert info["inter_turn_instruction"] is False and info["max_rounds"] == 5
  assert SHIPPED_CONTROLLER.stat().st_size < 12_000_000  # a few MB in the repository


def test_the_shipped_controller_answers_demo_questions_through_the_search_tools():
  embed = TextEmbedder.from_pretrained()
  graph, qa = episode_graph(0, embed, 384, DemoConfig().episode)
  picked = [q for q in qa if q["question_id"] in QUESTIONS]
  assert len(picked) == len(QUESTIONS)
  answerer = LLMAnswerer([graph], embed, adapter=SHIPPED_CONTROLLER)
  answers = answerer.answer([Question(q["question_id"], q["question"], q["answer"], 0, before_clip=q["before_clip"])
                             for q in picked])
  for q, a, t in zip(picked, answers, answerer.trajectories):
    assert answer_correct(a, q["answer"]), (q["question"], q["answer"], a, [r.text for r in t.rounds])
    assert t.num_searches >= 1 and len(a) < 60  # it searched, and answers in its own words, not a memory dump
  assert any(q["answer"] == NOT_IN_MEMORY for q in picked)
