"""bench/writer_eval.py's comparison with an earlier run's records (`--against`), on constructed verdicts."""

import json
import types

import pytest


@pytest.fixture(scope="module")
def bench():
  from bench import writer_eval
  return writer_eval


def _write(path, answerer, verdicts):
  rows = [{"id": f"episode_7_Q{i:02d}", "answerer": answerer, "template": {"answer": "x", "strict": v}}
          for i, v in enumerate(verdicts)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_against_pairs_the_same_questions_across_renderings(bench, tmp_path):
  _write(tmp_path / "old.jsonl", "rules", [True, False, False, True])
  against = bench.read_against(str(tmp_path / "old.jsonl"), "rules")
  # a talking rendering asks the still one's questions, in any order
  questions = [types.SimpleNamespace(question_id=f"episode_7_talking_Q{i:02d}") for i in (3, 2, 1, 0)]
  verdicts = {("template", "strict"): [True, True, True, True], ("ceiling", "strict"): [True] * 4}
  diffs = bench.against_differences(against, questions, verdicts, ["template", "ceiling"])
  assert list(diffs) == ["template"]  # the earlier run had no ceiling writer
  d, lo, hi = diffs["template"]
  assert d == pytest.approx(0.5) and lo <= 0.5 <= hi
  with pytest.raises(SystemExit, match="other questions"):
    bench.against_differences(against, questions[:3], verdicts, ["template"])


def test_against_refuses_another_answerers_records(bench, tmp_path):
  _write(tmp_path / "old.jsonl", "trained", [True])
  with pytest.raises(SystemExit, match="answered by trained, not rules"):
    bench.read_against(str(tmp_path / "old.jsonl"), "rules")
  (tmp_path / "bad.jsonl").write_text("{not json\n")
  with pytest.raises(SystemExit, match="unreadable"):
    bench.read_against(str(tmp_path / "bad.jsonl"), "rules")
