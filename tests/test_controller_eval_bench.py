"""bench/controller_eval.py's scoring and RESULT line on constructed answers (no model runs)."""

import importlib.util
import pathlib
import re

import pytest

from m3jax.data.memory_qa import QARecord

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("controller_eval", ROOT / "bench" / "controller_eval.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _records():
  drinks = ("tea", "milk")
  return [QARecord(f"q{i}", "What does Ann drink?", "Coffee.", ("Person Understanding",), 0, None, "drink", False,
                   drinks) for i in range(10)]


def test_scores_both_judges_with_intervals_and_paired_differences(bench, capsys):
  records = _records()
  trained = ["Coffee."] * 8 + ["Coffee, tea or milk."] * 2  # the lists: right for contains, wrong for strict
  rules = ["Coffee."] * 4 + ["Tea."] * 6
  results = {}
  for kind, answers in (("trained", trained), ("rules", rules)):
    results["gold", kind] = {**bench.score(records, answers, None), "rounds": 1.0, "searches": 1.0,
                             "format_errors": 0.0, "seconds": 0.1}
  assert results["gold", "trained"]["accuracy"] == 0.8 and results["gold", "trained"]["contains"] == 1.0
  t = results["gold", "trained"]
  assert t["accuracy_lo"] < 0.8 < t["accuracy_hi"] and t["contains_lo"] < 1.0 == t["contains_hi"]
  diffs = {"gold": bench.paired_differences(results, "gold")}
  d, lo, hi = diffs["gold"]["rules", "strict"]
  assert d == pytest.approx(0.4) and lo <= 0.4 <= hi
  assert diffs["gold"]["rules", "contains"][0] == pytest.approx(0.6)
  assert "trained − rules: strict +0.400" in capsys.readouterr().out
  line = bench.result_line(results, diffs, len(records), "test")
  head = ("RESULT trained=0.800 trained_lo=\\S+ trained_hi=\\S+ rules=0.400 untrained=NA diff_rules=0.400 "
          "diff_rules_lo=\\S+ diff_rules_hi=\\S+ n=10 ")
  assert re.match(head, line), line
  assert line.endswith("split=test judge=strict") and "perception_trained=NA" in line and "trained_contains=1.000" in line
  rows = bench.question_records("gold", "test", "trained", records, trained, results["gold", "trained"],
                                [{"searches": ["q"], "rounds": 2, "seconds": 0.5}] * len(records))
  assert rows[-1]["strict"] is False and rows[-1]["contains"] is True and rows[-1]["truth"] == "Coffee."
  assert {"question", "truth", "answer", "strict", "contains", "searches", "rounds", "seconds"} <= set(rows[0])


def test_perception_directories_are_keyed_on_episode_and_memorize_settings(bench):
  """A re-run with the same settings finds the same directory (video and memory reused); any change of the
  episode or of the memorize settings gets another one instead of a stale memory."""
  import dataclasses

  from m3jax.agent.demo import DemoConfig

  cfg = DemoConfig()
  key = bench.perception_key(cfg.episode, cfg.memorize)
  assert key == bench.perception_key(DemoConfig().episode, DemoConfig().memorize) and len(key) == 12
  assert key != bench.perception_key(dataclasses.replace(cfg.episode, seed=cfg.episode.seed + 1), cfg.memorize)
  assert key != bench.perception_key(cfg.episode, dataclasses.replace(cfg.memorize, clip_seconds=20.0))
