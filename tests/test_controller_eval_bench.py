"""bench/controller_eval.py's scoring and RESULT line on constructed answers (no model runs)."""

import pathlib
import re

import pytest

from m3jax.data.memory_qa import QARecord


@pytest.fixture(scope="module")
def bench():
  from bench import controller_eval
  return controller_eval


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
  rows = [bench.question_record("gold", "test", "trained", r, a, {"searches": ["q"], "rounds": 2, "seconds": 0.5})
          for r, a in zip(records, trained)]
  assert [r["strict"] for r in rows] == results["gold", "trained"]["correct"]
  assert rows[-1]["strict"] is False and rows[-1]["contains"] is True and rows[-1]["truth"] == "Coffee."
  assert {"question", "truth", "answer", "strict", "contains", "searches", "rounds", "seconds"} <= set(rows[0])


def test_perception_directories_are_keyed_on_episode_and_memorize_settings(bench):
  """A re-run with the same settings finds the same directory (video and memory reused); any change of the
  episode or of the memorize settings gets another one instead of a stale memory."""
  import dataclasses

  from m3jax.eval.demo import DemoConfig

  cfg = DemoConfig()
  key = bench.perception_key(cfg.episode, cfg.memorize)
  assert key == bench.perception_key(DemoConfig().episode, DemoConfig().memorize) and len(key) == 12
  assert key != bench.perception_key(dataclasses.replace(cfg.episode, seed=cfg.episode.seed + 1), cfg.memorize)
  assert key != bench.perception_key(cfg.episode, dataclasses.replace(cfg.memorize, clip_seconds=20.0))


def _write(path, answerer, task, verdicts, ids=None):
  import json
  with open(path, "w") as f:
    for i, ok in zip(ids or range(len(verdicts)), verdicts):
      answer = "Coffee." if ok else "The memory does not say."
      f.write(json.dumps({"task": task, "split": "test", "answerer": answerer, "question_id": f"episode_2000000_Q{i:02d}",
                          "family": "drink", "question": "What does Ann drink?", "truth": "Coffee.", "answer": answer, "strict": ok,
                          "contains": ok, "unanswerable": False}) + "\n")
  return str(path)


def test_join_rebuilds_the_result_line_from_separate_runs(bench, tmp_path, capsys):
  """One answerer per run, joined: the same accuracies, paired differences and declines as one run would give;
  another adapter's file is compared with the shipped one under its label; mismatched question sets refuse."""
  trained = _write(tmp_path / "t.jsonl", "trained", "gold", [True] * 8 + [False] * 2)
  rules = _write(tmp_path / "r.jsonl", "rules", "gold", [True] * 4 + [False] * 6)
  other = _write(tmp_path / "o.jsonl", "trained", "gold", [True] * 9 + [False])
  bench.join_records([trained, rules, f"stage2={other}"])
  out = capsys.readouterr().out
  fields = dict(kv.split("=", 1) for kv in out.strip().splitlines()[-1].split()[1:])
  assert fields["trained"] == "0.800" and fields["rules"] == "0.400" and fields["diff_rules"] == "0.400"
  assert float(fields["diff_rules_lo"]) > 0 and fields["n"] == "10" and fields["untrained"] == "NA"
  assert "false declines 2/10" in out and "[gold] stage2 − trained: strict +0.100" in out
  assert "[gold] family drink: rules 4/10, stage2 9/10, trained 8/10" in out
  # another memory's run (a talking rendering: its question ids say so) pairs with the still one's questions
  cue = tmp_path / "c.jsonl"
  cue.write_text(pathlib.Path(_write(tmp_path / "c0.jsonl", "rules", "gold", [True] * 7 + [False] * 3)).read_text()
                 .replace("episode_2000000_Q", "episode_2000000_talking_Q"))
  bench.join_records([trained, rules, f"cue={cue}"])
  assert "[gold] cue_rules − rules: strict +0.300" in capsys.readouterr().out
  short = _write(tmp_path / "s.jsonl", "rules", "gold", [True] * 9)
  with pytest.raises(SystemExit, match="answered different gold questions"):
    bench.join_records([trained, short])
  with pytest.raises(SystemExit, match="twice"):
    bench.join_records([trained, trained])


def test_a_stopped_run_resumes_where_it_stopped(bench, tmp_path, monkeypatch, capsys):
  """Records are written as questions end; --resume drops a half-written last record, asks only what is missing,
  and reports over the whole file: the same verdicts as one uninterrupted run."""
  import json
  import sys

  def run(path, *extra):
    monkeypatch.setattr(sys, "argv", ["controller_eval", "--split", "test", "--n", "6", "--answerers", "rules",
                                      "--tasks", "gold", "--embedder", "hashed", "--no-llm-judge", "--records",
                                      str(path), *extra])
    bench.main()
    return capsys.readouterr().out

  whole = tmp_path / "whole.jsonl"
  run(whole)
  full = whole.read_text().splitlines()
  assert len(full) == 6
  part = tmp_path / "part.jsonl"
  part.write_text("\n".join(full[:2]) + "\n" + full[2][:40])  # stopped while writing the third record
  out = run(part, "--resume")
  assert "[rules] 2 answered" in out and "answering 4" in out and "\nRESULT " in out and " n=6 " in out
  strip = lambda rows: sorted((r["question_id"], r["answer"], r["strict"]) for r in map(json.loads, rows))
  assert strip(part.read_text().splitlines()) == strip(full)
  with pytest.raises(SystemExit, match="another split"):
    run(part, "--resume", "--split", "dev")


def test_sized_episodes_report_accuracy_per_clips_and_people(bench, tmp_path, monkeypatch, capsys):
  """--sizes draws each gold episode's clips and people per seed; every record carries them and the report has a
  line per answerer and size."""
  import json
  import sys

  path = tmp_path / "sized.jsonl"
  monkeypatch.setattr(sys, "argv", ["controller_eval", "--split", "dev", "--n", "12", "--answerers", "rules",
                                    "--tasks", "gold", "--embedder", "hashed", "--no-llm-judge", "--records",
                                    str(path), "--sizes", "3-10x2-3"])
  bench.main()
  out = capsys.readouterr().out
  rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert len(rows) == 12 and all(3 <= r["clips"] <= 10 and 2 <= r["people"] <= 3 for r in rows)
  assert len({(r["clips"], r["people"]) for r in rows}) > 1  # several shapes among the episodes drawn
  for r in rows:
    assert f"[gold] rules clips={r['clips']}: strict" in out and f"[gold] rules people={r['people']}: strict" in out
  with pytest.raises(ValueError, match="expected CLIPS_LO"):
    bench.parse_sizes("3to10")


def test_search_settings_reach_every_answerer_and_bad_ones_are_named(bench, tmp_path, monkeypatch, capsys):
  """--search KEY=VALUE overrides the product's search settings for the answerers and is kept in each record;
  an unknown or invalid setting ends the run with one line naming it."""
  import json
  import sys

  import m3jax.control as control

  seen = []
  make = control.make_answerer
  monkeypatch.setattr(control, "make_answerer", lambda *a, **k: seen.append(k["search"]) or make(*a, **k))

  def run(*search):
    path = tmp_path / "s.jsonl"
    monkeypatch.setattr(sys, "argv", ["controller_eval", "--split", "dev", "--n", "4", "--answerers", "rules",
                                      "--tasks", "gold", "--embedder", "hashed", "--no-llm-judge", "--records",
                                      str(path), "--search", *search])
    bench.main()
    return [json.loads(line) for line in path.read_text().splitlines()]

  rows = run("threshold=0.3", "clip_topk=3")
  assert [(s.threshold, s.clip_topk) for s in seen] == [(0.3, 3)]
  assert all(r["search"] == ["threshold=0.3", "clip_topk=3"] for r in rows) and len(rows) == 4
  for bad, named in (("nope=1", "nope"), ("clip_mode=median", "clip_mode")):
    with pytest.raises(SystemExit, match=f"--search: .*{named}"):
      run(bad)
