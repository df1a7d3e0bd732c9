"""Judges on known pairs: strict Yes/No parsing, rule judges, the HTTP client against a local server."""

import http.server
import json
import threading
import time

import pytest

from m3jax.eval.judges import HTTPJudge, HTTPJudgeConfig, JudgeError, JudgeItem, LocalLLMJudge, RuleJudge, \
  make_judge, normalize_answer, parse_yes_no, token_f1


def test_strict_yes_no():
  assert [parse_yes_no(r) for r in ("Yes", "yes.", " **Yes**", "'No'", "No, it cannot.", "YES")] == \
    [True, True, True, False, False, True]
  # the reference's substring test would call all of these "yes"
  assert [parse_yes_no(r) for r in ("Eyes", "I would say yes", "Yesterday", "", "Not yes")] == [None] * 5


KNOWN = [
  JudgeItem("What drink?", "Coffee.", "coffee"),
  JudgeItem("Who made it?", "Alice", "It was Alice who made the coffee"),
  JudgeItem("Where?", "under the sofa cushions", "Under the green sofa cushions."),
  JudgeItem("Who?", "Bob", "Alice"),
  JudgeItem("Who?", "Bob", ""),
  JudgeItem("Which option?", "B", "(b) the red kite"),
]


def test_rule_judges_on_known_pairs():
  def run(kind, **kw):
    return [v.correct for v in RuleJudge(kind, **kw).judge(KNOWN)]
  assert run("exact") == [True, False, False, False, False, False]
  assert run("contains") == [True, True, False, False, False, True]  # "b" is a whole token of "b red kite"
  assert run("f1", f1_threshold=0.5) == [True, False, True, False, False, True]
  assert run("f1", f1_threshold=0.6) == [True, False, True, False, False, False]
  assert run("choice") == [False, False, False, False, False, True]  # a word is not a letter
  assert normalize_answer("The  Blue, vase!") == "blue vase"
  assert token_f1("blue vase", "the blue vase") == 1.0 and token_f1("red", "blue") == 0.0
  with pytest.raises(ValueError, match="unknown rule judge"):
    RuleJudge("fuzzy")


# (truth, distractors, answer, strict verdict): written by hand, each a way `contains` was paid for a wrong answer
DRINKS = ("tea", "milk", "lemonade")
STRICT_CASES = [
  # a right answer, alone or followed by supporting text that names no other candidate
  ("Coffee.", DRINKS, "Coffee.", True),
  ("Coffee.", DRINKS, "Coffee. Victoria said she drinks it every morning.", True),
  ("Coffee.", DRINKS, "Victoria likes coffee; she said so in the second clip.", True),
  ("On the kitchen table.", ("sofa", "window sill"), "On the kitchen table.\nShe moved it there this morning.", True),
  # lists of candidates
  ("On the kitchen table.", ("sofa", "window sill"), "On the window sill. On the sofa. On the kitchen table.", False),
  ("Coffee.", DRINKS, "Coffee, tea or milk.", False),
  ("Coffee.", DRINKS, "Coffee or lemonade.", False),
  # a candidate then a decline, a decline then a candidate
  ("Coffee.", DRINKS, "Coffee. The memory does not say.", False),
  ("Coffee.", DRINKS, "The memory does not say. Maybe coffee.", False),
  ("The memory does not say.", DRINKS, "The memory does not say. Maybe tea.", False),
  ("The memory does not say.", DRINKS, "Tea. The memory does not say.", False),
  # a right answer after a wrong one
  ("Coffee.", DRINKS, "Tea. Actually, coffee.", False),
  ("Coffee.", (), "Tea. Actually, coffee.", False),  # the truth is not in the first sentence
  ("Grace.", ("Michael",), "Michael. No wait, Grace.", False),
  # yes/no: the right word first, never the other one
  ("Yes.", ("No",), "Yes.", True),
  ("Yes.", ("No",), "Yes, they both like tea.", True),
  ("No.", ("Yes",), "No, Grace likes tea and Michael likes coffee.", True),
  ("Yes.", ("No",), "Yes or no, I cannot tell.", False),
  ("Yes.", ("No",), "No. Yes.", False),
  ("Yes.", (), "Yes and no.", False),
  ("Yes.", ("No",), "Maybe yes.", False),
  ("No.", ("Yes",), "I think not, no.", False),
  ("No.", (), "Yes", False),
  # declines: right only on an unanswerable question, and alone
  ("The memory does not say.", DRINKS, "The memory does not say.", True),
  ("The memory does not say.", DRINKS, "I checked: the memory does not say.", True),
  ("Coffee.", DRINKS, "The memory does not say.", False),
  ("The memory does not say.", DRINKS, "I don't know.", False),
  ("The memory does not say.", DRINKS, "Tea.", False),
  ("Coffee.", DRINKS, "", False),
]


@pytest.mark.parametrize("truth,distractors,answer,right", STRICT_CASES)
def test_strict_judge_on_hand_written_cases(truth, distractors, answer, right):
  item = JudgeItem("q?", truth, answer, distractors)
  assert RuleJudge("strict").judge([item])[0].correct is right
  assert make_judge("strict").judge([item])[0].correct is right  # by name, as RL rewards and evaluations make it


def test_contains_stays_and_pays_what_strict_refuses():
  lists = JudgeItem("Where?", "On the kitchen table.", "On the window sill. On the sofa. On the kitchen table.",
                    ("sofa", "window sill"))
  hedge = JudgeItem("Same drink?", "Yes.", "Yes or no, I cannot tell.", ("No",))
  assert [v.correct for v in make_judge("contains").judge([lists, hedge])] == [True, True]
  assert [v.correct for v in make_judge("strict").judge([lists, hedge])] == [False, False]


def test_strict_judge_over_generated_test_questions():
  """On real test-split questions: the truth alone is right, the truth listed with a distractor is wrong."""
  from m3jax.data.episodes import EpisodeConfig, make_episode
  from m3jax.data.questions import TEST_SEED_START
  judge, n = RuleJudge("strict"), 0
  for seed in range(TEST_SEED_START, TEST_SEED_START + 10):
    for q in make_episode(EpisodeConfig(seed=seed)).qa_list:
      d = tuple(q["distractors"])
      assert judge.judge([JudgeItem(q["question"], q["answer"], q["answer"], d)])[0].correct, q
      if d:
        listed = JudgeItem(q["question"], q["answer"], f"{q['answer'].rstrip('.')}, or {d[0]}.", d)
        assert not judge.judge([listed])[0].correct, q
        n += 1
  assert n > 50


def test_local_llm_judge_batches_and_skips_empty_answers():
  seen = []

  def complete(conversations):
    seen.extend(conversations)
    return ["Yes" if "agent_answer: coffee" in c[1]["content"] else "Maybe." for c in conversations]

  verdicts = LocalLLMJudge(complete).judge(KNOWN[:5])
  assert len(seen) == 4  # the empty answer is never asked
  assert [(v.correct, v.valid) for v in verdicts] == [(True, True), (False, False), (False, False), (False, False),
                                                      (False, True)]
  assert seen[0][0]["content"] == "You are an expert in video understanding."


class _Handler(http.server.BaseHTTPRequestHandler):
  def log_message(self, *args):
    pass

  def do_POST(self):
    server = self.server
    body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
    with server.lock:
      server.calls += 1
      server.active += 1
      server.max_active = max(server.max_active, server.active)
      server.auth.add(self.headers.get("Authorization"))
      fail = server.failures > 0
      if fail:
        server.failures -= 1
    time.sleep(0.02)
    with server.lock:
      server.active -= 1
    if fail:
      self.send_response(server.fail_code)
      self.end_headers()
      return
    prompt = body["messages"][1]["content"]
    reply = "Yes" if "ground_truth_answer: Alice" in prompt and "Alice" in prompt.split("agent_answer:")[1] else "No"
    data = json.dumps({"choices": [{"message": {"role": "assistant", "content": reply}}],
                       "model": body["model"]}).encode()
    self.send_response(200)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture()
def judge_server():
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
  server.lock = threading.Lock()
  server.calls = server.active = server.max_active = server.failures = 0
  server.fail_code = 503
  server.auth = set()
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  yield server
  server.shutdown()
  server.server_close()


def test_http_judge_retries_with_backoff_and_bounds_concurrency(judge_server):
  judge_server.failures = 3  # three 503s, then success
  sleeps = []
  cfg = HTTPJudgeConfig(base_url=f"http://127.0.0.1:{judge_server.server_address[1]}/v1", api_key="k",
                        model="judge-model", concurrency=2, max_retries=4, backoff_s=0.5)
  judge = HTTPJudge(cfg, sleep=sleeps.append)
  items = [JudgeItem("Who made it?", "Alice", "Alice did")] * 6 + [JudgeItem("Who?", "Alice", "Bob")] * 2
  verdicts = judge.judge(items)
  assert [v.correct for v in verdicts] == [True] * 6 + [False] * 2
  assert all(v.valid for v in verdicts)
  assert judge_server.calls == 8 + 3 and judge_server.max_active <= 2
  assert judge_server.auth == {"Bearer k"}
  assert sorted(sleeps)[:2] == [0.5, 0.5] and max(sleeps) <= 2.0  # exponential: 0.5, 1.0, 2.0 per request chain


def test_http_judge_gives_up_with_clear_errors(judge_server, monkeypatch):
  base = f"http://127.0.0.1:{judge_server.server_address[1]}"
  judge_server.failures, judge_server.fail_code = 100, 400
  with pytest.raises(JudgeError, match="rejected the request: HTTP 400"):
    HTTPJudge(HTTPJudgeConfig(base_url=base, model="m"), sleep=lambda s: None).judge([JudgeItem("q", "a", "a")])
  judge_server.fail_code = 500
  with pytest.raises(JudgeError, match="failed after 3 attempts"):
    HTTPJudge(HTTPJudgeConfig(base_url=base, model="m", max_retries=2), sleep=lambda s: None).judge(
      [JudgeItem("q", "a", "a")])
  monkeypatch.delenv("M3JAX_JUDGE_BASE_URL", raising=False)
  monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
  with pytest.raises(JudgeError, match="base URL"):
    HTTPJudge(HTTPJudgeConfig(model="m"))
  monkeypatch.setenv("M3JAX_JUDGE_BASE_URL", base)
  monkeypatch.setenv("M3JAX_JUDGE_MODEL", "env-model")
  assert HTTPJudge().config.model == "env-model"
