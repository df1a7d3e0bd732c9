"""Evaluation: resumable JSONL, summary (per type / video, behaviour rates, forgetting curve), plot, CLI config."""

import json
import pathlib
import re

import numpy as np
import pytest

import m3jax
from m3jax.control.controller import Controller, ControlConfig
from m3jax.eval.judges import RuleJudge
from m3jax.control.policy import Turn
from m3jax.config import load_config
from m3jax.data.m3bench import parse_annotations
from m3jax.eval.evaluate import EvalConfig, run_eval, select_questions
from m3jax.memory.embedders import make_embedder
from m3jax.eval.report import distance_bucket, format_summary, read_jsonl, summarize
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.search import MemorySearcher, SearchConfig
from m3jax.memory.reference_pickle import load_reference_pickle

ROOT = pathlib.Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "official_graphs"


class RetrieveThenAnswer:
  """Deterministic policy: search the question, then answer with the first retrieved sentence (or give up)."""

  def begin(self, conversations):
    self.questions = [c[0]["content"].rsplit("Question: ", 1)[1] for c in conversations]
    return [Turn(f"Action: [Search]\nContent: {q}") for q in self.questions]

  def step(self, rows, user_messages):
    turns = []
    for message in user_messages:
      found = re.search(r'"CLIP_\d+": \["(.*?)"', message)
      turns.append(Turn(f"Action: [Answer]\nContent: {found.group(1)}" if found else "no idea"))
    return turns


ANNOTATIONS = {
  "small": {"mem_path": "data/memory_graphs/robot/small.pkl", "qa_list": [
    {"question_id": "s_Q1", "question": "Who makes coffee with a French press?", "answer": "coffee",
     "type": ["Person Understanding"], "before_clip": 7, "evidence_clips": [0]},
    {"question_id": "s_Q2", "question": "What color is the lunch box?", "answer": "grey suit jacket",
     "type": ["Multi-Detail Reasoning"], "before_clip": 7, "evidence_clips": [2]},
    {"question_id": "s_Q3", "question": "quantum computing lecture at the university", "answer": "none",
     "type": ["Cross-Modal Reasoning", "Multi-Detail Reasoning"], "before_clip": 1, "evidence_clips": [1]},
  ]},
  "medium": {"mem_path": "data/memory_graphs/robot/medium.pkl", "qa_list": [
    {"question_id": "m_Q1", "question": "Who broke the blue porcelain vase?", "answer": "football",
     "type": ["Multi-Hop Reasoning"], "before_clip": 40, "evidence_clips": [9]},
    {"question_id": "m_Q2", "question": "Who flew a red dragon kite at the hill park?", "answer": "kite",
     "type": ["Person Understanding"], "before_clip": 18, "evidence_clips": [17]},
  ]},
}


@pytest.fixture(scope="module")
def factory():
  embed = make_embedder("hashed")
  graphs = {f"data/memory_graphs/robot/{n}.pkl": load_reference_pickle(FIXTURES / f"{n}.pkl")
            for n in ("small", "medium")}
  calls = []

  def controller_for(mem_paths):
    calls.append(mem_paths)
    searcher = MemorySearcher([graphs[m] for m in mem_paths], embed, SearchConfig())
    return Controller(RetrieveThenAnswer(), searcher, ControlConfig(max_rounds=3)), {m: i for i, m in
                                                                                   enumerate(mem_paths)}
  controller_for.calls = calls
  return controller_for


def test_run_eval_is_resumable_and_summarises_the_file(tmp_path, factory):
  questions = parse_annotations(ANNOTATIONS)
  out = tmp_path / "res" / "robot.jsonl"
  cfg = EvalConfig(annotations="x", graphs_dir="y", output=str(out), judge="contains", batch_size=2, limit=3)
  logs = []
  first = run_eval(cfg, questions, factory, RuleJudge("contains"), log=logs.append)
  assert first["questions"] == 3 and len(read_jsonl(out)) == 3
  assert factory.calls[0] == ["data/memory_graphs/robot/small.pkl"]
  with out.open("a") as f:
    f.write('{"question_id": "torn')  # a run killed mid-line
  second = run_eval(EvalConfig(**{**cfg.__dict__, "limit": 0}), questions, factory, RuleJudge("contains"),
                    log=logs.append)
  assert any(m.startswith("3 questions already") and m.endswith("2 to run") for m in logs)
  records = read_jsonl(out)
  assert sorted(r["question_id"] for r in records) == ["m_Q1", "m_Q2", "s_Q1", "s_Q2", "s_Q3"]
  assert second["questions"] == 5
  by_id = {r["question_id"]: r for r in records}
  assert [by_id[q]["correct"] for q in ("s_Q1", "s_Q2", "s_Q3", "m_Q1", "m_Q2")] == [True, True, False, True, False]
  assert by_id["s_Q3"]["response"] is None and [r["action"] for r in by_id["s_Q3"]["rounds"]] == \
    ["search", "format_error", "format_error"]
  assert by_id["m_Q1"]["evidence_distance"] == 31 and by_id["m_Q1"]["video_id"] == "medium"
  assert all(c <= 1 for r in by_id["s_Q3"]["rounds"] for c in r["retrieved_clips"])
  # summary: per type with normalised labels, per video, behaviour rates, forgetting curve
  assert set(second["by_type"]) == {"Person Understanding", "Multi-Evidence Reasoning", "Cross-Modal Reasoning",
                                    "Multi-Hop Reasoning"}
  assert second["by_type"]["Multi-Evidence Reasoning"]["count"] == 2
  assert set(second["by_video"]) == {"small", "medium"}
  assert second["accuracy"] == pytest.approx(3 / 5) and second["answered_rate"] == pytest.approx(4 / 5)
  assert second["mean_searches"] >= 1.0 and 0 <= second["empty_search_rate"] <= 1
  assert list(second["forgetting_curve"]) == ["0", "1", "4-7", "16-31"]
  assert out.with_suffix(".png").stat().st_size > 1000
  assert json.loads(out.with_suffix(".summary.json").read_text())["questions"] == 5
  assert "accuracy" in format_summary(second)
  # a third run has nothing to do
  assert run_eval(cfg, questions, factory, RuleJudge("contains"), log=logs.append)["questions"] == 5


def test_summary_rates_on_hand_made_records():
  def rec(qid, correct, rounds, response, valid=True, dist=None):
    return {"question_id": qid, "correct": correct, "rounds": rounds, "response": response, "judge_valid": valid,
            "question_types": ["Person Understanding"], "video_id": "v", "evidence_distance": dist}
  search_hit = {"action": "search", "retrieved_clips": [1], "result_text": "x", "num_generated": 10}
  search_empty = {"action": "search", "retrieved_clips": [], "result_text": "x", "num_generated": 10}
  fmt = {"action": "format_error", "retrieved_clips": [], "result_text": "x", "num_generated": 5}
  answer = {"action": "answer", "retrieved_clips": [], "result_text": "", "num_generated": 3}
  s = summarize([rec("a", True, [search_hit, answer], "x", dist=0),
                 rec("b", False, [search_empty, fmt, answer], "y", valid=False, dist=5),
                 rec("c", False, [fmt], None)])
  assert s["accuracy"] == pytest.approx(1 / 3) and s["answered_rate"] == pytest.approx(2 / 3)
  assert s["mean_rounds"] == 2 and s["mean_searches"] == pytest.approx(2 / 3)
  assert s["empty_search_rate"] == pytest.approx(3 / 4)  # empty search + 2 format errors, of 4 tool results
  assert s["format_error_rate"] == pytest.approx(2 / 6) and s["judge_invalid_rate"] == pytest.approx(1 / 3)
  assert s["forgetting_curve"] == {"0": {"accuracy": 1.0, "count": 1}, "4-7": {"accuracy": 0.0, "count": 1}}
  assert [distance_bucket(d) for d in (0, 1, 2, 3, 4, 9, 100)] == ["0", "1", "2-3", "2-3", "4-7", "8-15", "64-127"]


def test_select_questions_and_config_file():
  questions = parse_annotations(ANNOTATIONS)
  cfg = EvalConfig(videos=("medium",))
  assert [q.question_id for q in select_questions(questions, cfg, done={"m_Q1"})] == ["m_Q2"]
  loaded = load_config(ROOT / "configs" / "eval.py", ["judge=exact", "greedy=true", "batch_size=8"])
  assert (loaded.judge, loaded.greedy, loaded.batch_size, loaded.temperature, loaded.top_k) == ("exact", True, 8,
                                                                                                0.6, 20)
  with pytest.raises(ValueError, match="judge"):
    load_config(ROOT / "configs" / "eval.py", ["judge=gpt"])
  annotations = pathlib.Path(loaded.annotations)     # the shipped robot split, inside the package
  assert annotations.parent == pathlib.Path(m3jax.__file__).resolve().parent / "data" / "m3bench_annotations"
  assert annotations.name == "robot.json" and annotations.is_file()


def test_make_embedder_names():
  spec = HashedBowEmbedder.from_json(FIXTURES / "small.embedder.json")
  texts = ["<face_2> does not drink coffee.", "Where is the green lunch box?"]
  assert np.array_equal(make_embedder("hashed")(texts), spec(texts))
  assert np.array_equal(make_embedder(str(FIXTURES / "small.embedder.json"))(texts), spec(texts))
  with pytest.raises(ValueError, match="embedder must be minilm, hashed or .*'mini-lm'"):
    make_embedder("mini-lm")


def test_make_embedder_minilm_gives_unit_384d_embeddings():
  emb = np.asarray(make_embedder("minilm")(["Who likes coffee?", "Anna likes coffee."]))
  assert emb.shape == (2, 384) and np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-5)
  assert emb[0] @ emb[1] > 0.5
