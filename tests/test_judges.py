"""Judges on known pairs: strict Yes/No parsing, rule judges, the HTTP client against a local server."""

import http.server
import json
import threading
import time

import pytest

from m3jax.agent.judges import HTTPJudge, HTTPJudgeConfig, JudgeError, JudgeItem, LocalLLMJudge, RuleJudge, \
  normalize_answer, parse_yes_no, token_f1


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
