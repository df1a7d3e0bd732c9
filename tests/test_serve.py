"""The memory service over real HTTP on 127.0.0.1: spaces, keys, errors, asks (batched), restart, import.

One uvicorn server runs in a thread for the module (bag-of-words embedder: no model load); the restart test
builds a second app over the same data directory.
"""

import collections
import concurrent.futures
import json
import pathlib
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from m3jax.serve.app import create_app
from m3jax.serve.auth import KeyRing, add_key, hash_key
from m3jax.serve.config import ServeConfig

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "official_graphs"
ALICE = {"Authorization": "Bearer key-alice"}
BOB = {"X-API-Key": "key-bob"}
KEYS = KeyRing({hash_key("key-alice"): "alice", hash_key("key-bob"): "bob"})
CLIPS = [(["Anna cooks pasta in the kitchen.", "Ben reads a newspaper on the sofa."], ["Anna likes cooking."]),
         (["Ben waters the plants on the balcony."], ["Ben cares for plants."]),
         (["Anna and Ben play chess at the table."], ["Anna wins at chess."]),
         (["Ben drives the car to the market."], [])]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """uvicorn in a thread on a free 127.0.0.1 port; stopped (lifespan shutdown included) by `stop()`."""

  def __init__(self, config: ServeConfig, keys: KeyRing = KEYS, policy=None):
    port = _free_port()
    self.app = create_app(config, keys, policy)
    self.server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=port, log_level="error"))
    self.thread = threading.Thread(target=self.server.run, daemon=True)
    self.thread.start()
    self.url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while not self.server.started:
      assert time.time() < deadline, "server did not start"
      time.sleep(0.02)
    self.client = httpx.Client(base_url=self.url, timeout=60)

  def stop(self) -> None:
    self.client.close()
    self.server.should_exit = True
    self.thread.join(timeout=30)


def _config(tmp: pathlib.Path, **kw) -> ServeConfig:
  base = dict(data_dir=str(tmp / "data"), embedder="hashed", answerer="retrieval", keys_env="", max_wait_ms=20.0,
              snapshot_every=3,
              max_body_kb=64, max_upload_mb=0.01, allowed_dirs=(str(tmp / "allowed"),))
  base.update(kw)
  return ServeConfig(**base)


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("serve")
  (tmp / "allowed").mkdir()
  (tmp / "allowed" / "notes.mp4").write_text("not a video")
  (tmp / "secret.mp4").write_text("outside the allow-list")
  server = Server(_config(tmp))
  server.tmp = tmp
  yield server
  server.stop()


@pytest.fixture(scope="module")
def space(srv):
  r = srv.client.post("/v1/spaces", json={"name": "home"}, headers=ALICE)
  assert r.status_code == 201, r.text
  sid = r.json()["id"]
  for ep, sem in CLIPS:
    r = srv.client.post(f"/v1/spaces/{sid}/clips", json={"episodic": ep, "semantic": sem}, headers=ALICE)
    assert r.status_code == 201, r.text
  return sid


def test_spaces_crud_and_tenant_isolation(srv, space):
  c = srv.client
  assert [s["id"] for s in c.get("/v1/spaces", headers=ALICE).json()["spaces"]] == [space]
  info = c.get(f"/v1/spaces/{space}", headers=ALICE).json()
  assert (info["clips"], info["max_clip"], info["kind"]) == (4, 3, "clips")
  assert c.get("/v1/spaces", headers=BOB).json()["spaces"] == []
  for method, path in (("GET", ""), ("DELETE", ""), ("GET", "/graph"), ("POST", "/ask")):
    r = c.request(method, f"/v1/spaces/{space}{path}", headers=BOB, json={"question": "who?"})
    assert r.status_code == 404 and "unknown space" in r.json()["error"]
  assert c.post("/v1/spaces", json={"name": "home"}, headers=ALICE).status_code == 409
  assert c.post("/v1/spaces", json={"name": "home"}, headers=BOB).status_code == 201   # names are per tenant
  sid = c.post("/v1/spaces", json={"name": "tmp"}, headers=ALICE).json()["id"]
  assert c.delete(f"/v1/spaces/{sid}", headers=ALICE).status_code == 204
  assert c.delete(f"/v1/spaces/{sid}", headers=ALICE).status_code == 404
  assert c.get(f"/v1/spaces/{sid}", headers=ALICE).status_code == 404
  assert not (srv.tmp / "data" / "spaces" / sid).exists()


def test_read_endpoints(srv, space):
  c = srv.client
  clip = c.get(f"/v1/spaces/{space}/clips/1", headers=ALICE).json()
  assert [m["text"] for m in clip["memories"]] == ["Ben waters the plants on the balcony.", "Ben cares for plants."]
  assert [m["kind"] for m in clip["memories"]] == ["episodic", "semantic"]
  node = c.get(f"/v1/spaces/{space}/nodes/0", headers=ALICE).json()
  assert node == {"id": 0, "type": "episodic", "contents": ["Anna cooks pasta in the kitchen."], "clip": 0}
  graph = c.get(f"/v1/spaces/{space}/graph", params={"before_clip": 1}, headers=ALICE).json()
  assert {n["clip"] for n in graph["nodes"]} == {0, 1}
  assert c.get(f"/v1/spaces/{space}/clips/9", headers=ALICE).status_code == 404
  assert c.get(f"/v1/spaces/{space}/nodes/999", headers=ALICE).status_code == 404
  assert c.get(f"/v1/spaces/{space}/characters", headers=ALICE).json() == {"characters": {}}


def test_bad_requests_get_clear_4xx_and_server_keeps_serving(srv, space):
  c = srv.client
  assert c.get("/v1/spaces").status_code == 401
  assert c.get("/v1/spaces", headers={"Authorization": "Bearer nope"}).json()["error"] == "missing or invalid API key"
  r = c.post("/v1/spaces", content=b'{"name": ', headers={**ALICE, "Content-Type": "application/json"})
  assert r.status_code == 400 and r.json()["error"] == "malformed JSON body"
  assert c.post("/v1/spaces", content=b"name=x", headers=ALICE).status_code == 400
  for name in ("../etc", "a/b", "", ".hidden", "x" * 65):
    r = c.post("/v1/spaces", json={"name": name}, headers=ALICE)
    assert r.status_code == 422, (name, r.text)
  assert c.post("/v1/spaces", json={"name": "v", "kind": "pickle"}, headers=ALICE).status_code == 422
  assert c.get("/v1/spaces/..%2F..%2Fmeta.sqlite", headers=ALICE).status_code == 404
  assert c.get("/v1/spaces/0123456789abcdef0123456789abcdef", headers=ALICE).status_code == 404
  big = {"episodic": ["word " * 20000]}
  r = c.post(f"/v1/spaces/{space}/clips", json=big, headers=ALICE)
  assert r.status_code == 413 and "exceeds" in r.json()["error"]
  r = c.post(f"/v1/spaces/{space}/clips", json={"clip_id": 1, "episodic": ["late"]}, headers=ALICE)
  assert r.status_code == 409 and "time order" in r.json()["error"]
  assert c.post(f"/v1/spaces/{space}/clips", json={"episodic": [""]}, headers=ALICE).status_code == 422
  assert c.post(f"/v1/spaces/{space}/clips", json={"episodic": [3]}, headers=ALICE).status_code == 422
  for body in ({}, {"question": "a", "questions": [{"question": "b"}]}, {"questions": []},
               {"question": "a", "before_clip": -1}):
    assert c.post(f"/v1/spaces/{space}/ask", json=body, headers=ALICE).status_code == 422, body
  # ingestion: wrong space kind, oversize and corrupt uploads, traversal out of the allow-list
  r = c.put(f"/v1/spaces/{space}/videos", params={"filename": "a.mp4"}, content=b"x" * 10, headers=ALICE)
  assert r.status_code == 409 and "kind='video'" in r.json()["error"]
  vid = c.post("/v1/spaces", json={"name": "cam", "kind": "video"}, headers=ALICE).json()["id"]
  r = c.put(f"/v1/spaces/{vid}/videos", params={"filename": "a.mp4"}, content=b"x" * 20000, headers=ALICE)
  assert r.status_code == 413
  r = c.put(f"/v1/spaces/{vid}/videos", params={"filename": "a.exe"}, content=b"x", headers=ALICE)
  assert r.status_code == 422
  r = c.put(f"/v1/spaces/{vid}/videos", params={"filename": "a.mp4"}, content=b"garbage" * 100, headers=ALICE)
  assert r.status_code == 422 and r.json()["error"].startswith("'a.mp4' is not a usable video")
  assert str(srv.tmp) not in r.text and "uploads" not in r.text             # no server path in the answer
  assert not any((srv.tmp / "data" / "spaces" / vid / "uploads").iterdir())       # refused uploads are removed
  for path, status in (("../secret.mp4", 422), (str(srv.tmp / "secret.mp4"), 422), ("missing.mp4", 404),
                       ("notes.mp4", 422)):
    r = c.post(f"/v1/spaces/{vid}/ingest", json={"path": path}, headers=ALICE)
    assert r.status_code == status, (path, r.text)
    assert str(srv.tmp / "allowed") not in r.text
  assert c.post(f"/v1/spaces/{vid}/clips", json={"episodic": ["x"]}, headers=ALICE).status_code == 409
  assert c.get("/v1/jobs/nope", headers=ALICE).status_code == 404
  assert c.get("/healthz").json()["status"] == "ok"
  metrics = c.get("/metrics").text
  assert 'status="413"' in metrics and 'status="401"' in metrics and "m3jax_questions_total" in metrics


def test_ask_one_and_batch_retrieval_only(srv, space):
  c = srv.client
  r = c.post(f"/v1/spaces/{space}/ask", json={"question": "Ben waters the plants on the balcony"}, headers=ALICE)
  a = r.json()
  assert r.status_code == 200 and a["mode"] == "retrieval_only" and a["answer"] is None
  assert 1 in a["trajectory"][0]["retrieved_clips"]
  assert "Ben waters the plants on the balcony." in a["trajectory"][0]["memories"]["CLIP_1"]
  qs = [{"question": "Anna and Ben play chess at the table"},
        {"question": "Anna and Ben play chess at the table", "before_clip": 1}]
  out = c.post(f"/v1/spaces/{space}/ask", json={"questions": qs}, headers=ALICE).json()["answers"]
  assert 2 in out[0]["trajectory"][0]["retrieved_clips"]
  assert out[1]["before_clip"] == 1 and all(k <= 1 for k in out[1]["trajectory"][0]["retrieved_clips"])


def test_32_concurrent_clients_are_batched(srv, space):
  """Deterministic: the batcher is held busy on another space (its lock held here) while 32 clients send one
  question each; once all 32 are queued the lock is released, and they must be answered as ONE batch of 32."""
  batcher, store = srv.app.state.batcher, srv.app.state.store
  blocker_id = srv.client.post("/v1/spaces", json={"name": "blocker"}, headers=ALICE).json()["id"]
  blocker = store.get("alice", blocker_id)
  before = collections.Counter(batcher.batch_size_counts)
  questions = [f"{CLIPS[i % 4][0][0]} {i}" for i in range(32)]

  def ask(sid, q):
    with httpx.Client(base_url=srv.url, timeout=60) as c:
      return c.post(f"/v1/spaces/{sid}/ask", json={"question": q}, headers=ALICE)

  def wait_for(condition):
    deadline = time.time() + 30
    while not condition():
      assert time.time() < deadline
      time.sleep(0.01)

  with concurrent.futures.ThreadPoolExecutor(33) as pool:
    with blocker.lock:
      held = pool.submit(ask, blocker_id, "anything")
      wait_for(lambda: batcher._running and batcher.pending == 0)      # the blocker's batch is stuck on the lock
      replies = [pool.submit(ask, space, q) for q in questions]
      wait_for(lambda: batcher.pending == 32)
    replies = [r.result() for r in replies]
    assert held.result().status_code == 200
  assert all(r.status_code == 200 for r in replies)
  assert [r.json()["question"] for r in replies] == questions
  for i, r in enumerate(replies):
    assert i % 4 in r.json()["trajectory"][0]["retrieved_clips"]
  sizes = collections.Counter(batcher.batch_size_counts)
  sizes.subtract(before)
  assert +sizes == collections.Counter({1: 1, 32: 1})      # the blocker alone, then all 32 questions together


def test_restart_restores_every_space(tmp_path):
  cfg = _config(tmp_path)
  first = Server(cfg)
  try:
    sid = first.client.post("/v1/spaces", json={"name": "r"}, headers=ALICE).json()["id"]
    for ep, sem in CLIPS:            # 4 clips, snapshot every 3 (the kill -9 test covers log replay)
      assert first.client.post(f"/v1/spaces/{sid}/clips", json={"episodic": ep, "semantic": sem},
                               headers=ALICE).status_code == 201
    graph = first.client.get(f"/v1/spaces/{sid}/graph", headers=ALICE).json()
    ask = first.client.post(f"/v1/spaces/{sid}/ask", json={"question": "Ben drives the car"}, headers=ALICE).json()
  finally:
    first.stop()
  # a clean shutdown snapshots the clip after the last periodic snapshot and removes the older one
  assert [p.name for p in (tmp_path / "data" / "spaces" / sid).glob("graph_*")] == ["graph_00000004"]
  second = Server(cfg)
  try:
    assert second.client.get(f"/v1/spaces/{sid}/graph", headers=ALICE).json() == graph
    assert second.client.post(f"/v1/spaces/{sid}/ask", json={"question": "Ben drives the car"},
                              headers=ALICE).json() == ask
  finally:
    second.stop()


def test_admin_import_of_reference_pickle(tmp_path):
  import serve
  keys = tmp_path / "keys.txt"
  key = add_key(str(keys), "alice")
  assert key not in keys.read_text() and hash_key(key) in keys.read_text()
  embedder = str(FIXTURES / "small.embedder.json")
  args = ["--set", f"data_dir={tmp_path / 'data'}", "--set", f"embedder={embedder}", "--set", "graph.text_dim=64"]
  assert serve.main(args + ["import-pickle", "--tenant", "alice", "--name", "small", str(FIXTURES / "small.pkl")]) == 0
  server = Server(_config(tmp_path, embedder=embedder, keys_file=str(keys), graph=ServeConfig().graph.__class__(
      text_dim=64)), KeyRing.load(str(keys), ""))
  try:
    headers = {"X-API-Key": key}
    spaces = server.client.get("/v1/spaces", headers=headers).json()["spaces"]
    assert [(s["name"], s["clips"]) for s in spaces] == [("small", 8)]
    query = json.loads((FIXTURES / "small.queries.json").read_text())
    query = (query["queries"] if isinstance(query, dict) else query)[0]
    out = server.client.post(f"/v1/spaces/{spaces[0]['id']}/ask", json={"question": query["query"]},
                             headers=headers).json()
    assert out["trajectory"][0]["retrieved_clips"]
  finally:
    server.stop()


def test_docs_page_works_offline(srv):
  """/docs must not load Swagger UI from a CDN (blank page offline): every asset it names is served here."""
  import re
  html = srv.client.get("/docs")
  assert html.status_code == 200 and "swagger-ui" in html.text
  assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", html.text, re.I), html.text
  assets = re.findall(r"""(?:src|href)=["']([^"']+)["']|url: *["']([^"']+)["']""", html.text)
  assets = [a or b for a, b in assets]
  assert {"/openapi.json"} < set(assets) and any(a.endswith("swagger-ui-bundle.js") for a in assets), assets
  for asset in assets:
    r = srv.client.get(asset)
    assert r.status_code == 200 and r.content, asset


def test_viewer_page_calls_only_existing_routes(srv):
  import re
  html = srv.client.get("/")
  assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
  assert "innerHTML" not in html.text                     # untrusted memories are inserted as text only
  routes = set(srv.client.get("/openapi.json").json()["paths"])
  used = set(re.findall(r'"(/v1/[a-z]+)"', html.text)) | {"/v1/spaces/{space_id}" + p for p in
                                                           re.findall(r'spacePath\(\) \+ "(/[a-z]+)', html.text)}
  assert used == {"/v1/spaces", "/v1/spaces/{space_id}/graph", "/v1/spaces/{space_id}/characters",
                  "/v1/spaces/{space_id}/nodes", "/v1/spaces/{space_id}/ask"}
  for path in used - {"/v1/spaces/{space_id}/nodes"}:
    assert path in routes, path
  assert "/v1/spaces/{space_id}/nodes/{node_id}" in routes


class _ScriptedPolicy:
  """Policy test double: row r plays `scripts[r]` turn by turn and records the user messages it gets."""

  def __init__(self, scripts):
    self.scripts, self.received = scripts, []

  def begin(self, conversations):
    from m3jax.control.policy import Turn
    self.rounds = [0] * len(conversations)
    self.received = [[] for _ in conversations]
    return [self._turn(r, Turn) for r in range(len(conversations))]

  def step(self, rows, user_messages):
    from m3jax.control.policy import Turn
    for r, m in zip(rows, user_messages):
      self.received[r].append(m)
    return [self._turn(r, Turn) for r in rows]

  def _turn(self, row, turn_cls):
    self.rounds[row] += 1
    return turn_cls(text=self.scripts[row][self.rounds[row] - 1])


def test_controller_answerer_routes_each_question_to_its_space(tmp_path):
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.serve.answering import AskItem, ControllerAnswerer, SharedEmbedCache
  from m3jax.serve.spaces import SpaceStore
  cfg = _config(tmp_path)
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, SharedEmbedCache(HashedBowEmbedder((), (), 384)))
  a, b = store.create("alice", "a"), store.create("alice", "b")
  for ep, sem in CLIPS:
    store.add_clip(a, ep, sem)
  for ep, sem in reversed(CLIPS):                 # same sentences, other clip ids
    store.add_clip(b, ep, sem)
  search = "<think>look</think>\nAction: [Search]\nContent: Ben waters the plants on the balcony"
  policy = _ScriptedPolicy([[search, "Action: [Answer]\nContent: the balcony"],
                            [search, "Action: [Answer]\nContent: unknown"],
                            [search, search, search]])
  items = [AskItem(a, "Where are the plants?"), AskItem(b, "Where are the plants?"),
           AskItem(b, "Where are the plants?", before_clip=1)]
  out = ControllerAnswerer(policy, max_rounds=3, store=store)(items)
  assert [o["answer"] for o in out] == ["the balcony", "unknown", None]
  assert 1 in out[0]["trajectory"][0]["retrieved_clips"] and 2 in out[1]["trajectory"][0]["retrieved_clips"]
  assert all(k <= 1 for r in out[2]["trajectory"] for k in r["retrieved_clips"])
  assert "Ben waters the plants" in policy.received[1][0] and "Ben waters" not in policy.received[2][0]
  assert [r["action"] for r in out[2]["trajectory"]] == ["search"] * 3
  store.close()


class _SlotScripts:
  """Slot-policy test double (`open`/`advance`): a question plays the script named by its text, turn by turn, in
  whichever slot it is given; `gates[i]` (an Event) holds call i until the test opens it."""

  def __init__(self, scripts, gates=None):
    self.scripts, self.gates, self.calls = scripts, dict(gates or {}), []

  def open(self, slots):
    self.playing = {}
    return slots

  def advance(self, starts, continues):
    from m3jax.control.policy import Turn
    gate = self.gates.pop(len(self.calls), None)
    if gate is not None:
      gate.wait(10)
    self.calls.append(([e for _, e, _ in starts], [s for s, _ in continues]))
    for slot, _, conversation in starts:
      name = next(n for n in self.scripts if n in conversation[0]["content"])
      if name == "boom":
        raise RuntimeError("the policy failed on this question")
      self.playing[slot] = [name, 0]
    turns = []
    for slot in [s for s, *_ in starts] + [s for s, _ in continues]:
      name, r = self.playing[slot]
      self.playing[slot][1] += 1
      turns.append(Turn(text=self.scripts[name][r]))
    return turns


def test_a_question_joins_the_running_ones_and_returns_when_it_ends(tmp_path):
  """Serve's request-level joining (`JoiningBatcher` over `ControllerAnswerer.stream`): a question asked while
  another is being answered enters the very next policy call in a free slot, beside the running one's next
  round, and gets its answer as soon as its own trajectory ends, before the running one's. A question on
  which the stream fails is retried alone and fails alone; the next question gets a fresh stream."""
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.serve.answering import AskItem, ControllerAnswerer, SharedEmbedCache
  from m3jax.serve.batching import JoiningBatcher
  from m3jax.serve.spaces import SpaceStore
  cfg = _config(tmp_path)
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, SharedEmbedCache(HashedBowEmbedder((), (), 384)))
  a, b = store.create("alice", "a"), store.create("alice", "b")
  for ep, sem in CLIPS:
    store.add_clip(a, ep, sem)
  for ep, sem in reversed(CLIPS):
    store.add_clip(b, ep, sem)
  search = "Action: [Search]\nContent: Ben waters the plants on the balcony"
  first, third = threading.Event(), threading.Event()
  policy = _SlotScripts({"long": [search, search, "Action: [Answer]\nContent: slowly"],
                         "short": ["Action: [Answer]\nContent: at once"],
                         "boom": []}, {0: first, 2: third})
  answerer = ControllerAnswerer(policy, max_rounds=3, store=store, slots=4)
  batcher = JoiningBatcher(answerer, answerer.stream, max_batch=8)
  try:
    long = batcher.submit([AskItem(a, "long: where are the plants?")])[0]
    deadline = time.monotonic() + 10
    while batcher.pending and time.monotonic() < deadline:   # the stream took `long` and waits at the gate
      time.sleep(0.01)
    short = batcher.submit([AskItem(b, "short: who waters them?")])[0]
    first.set()
    assert short.result(timeout=10)["answer"] == "at once"
    assert not long.done()                                           # still running: held before its last round
    third.set()
    out = long.result(timeout=10)
    assert out["answer"] == "slowly" and [r["action"] for r in out["trajectory"]] == ["search", "search", "answer"]
    assert 1 in out["trajectory"][0]["retrieved_clips"]              # space a: the plants are in its clip 1
    assert policy.calls[:2] == [([0], []), ([1], [0])]                 # `short` started beside `long`'s round 2
    assert batcher.batches == 2 and batcher.items == 2 and batcher.pending == 0
    bad, good = batcher.submit([AskItem(a, "boom: ?"), AskItem(b, "short: again?")])
    with pytest.raises(RuntimeError, match="failed on this question"):
      bad.result(timeout=10)
    assert good.result(timeout=10)["answer"] == "at once"
    assert batcher.submit([AskItem(a, "short: and now?")])[0].result(timeout=10)["answer"] == "at once"
    with pytest.raises(ValueError, match="join_running needs slots"):
      _config(tmp_path, join_running=True, slots=0)
  finally:
    batcher.close()
    store.close()


def test_batcher_groups_concurrent_items_and_isolates_a_failing_one():
  from m3jax.serve.batching import Batcher
  calls = []

  def square(items):
    calls.append(list(items))
    if "bad" in items:
      raise ValueError("bad item")
    return [x * x for x in items]

  batcher = Batcher(square, max_batch=4, max_wait_s=0.2)
  try:
    futures = batcher.submit([1, 2, 3]) + batcher.submit([4, 5])
    assert [f.result(timeout=10) for f in futures] == [1, 4, 9, 16, 25]
    assert calls[:2] == [[1, 2, 3, 4], [5]]                    # max_batch respected, submissions merged
    futures = batcher.submit([6, "bad", 7])
    assert futures[0].result(timeout=10) == 36 and futures[2].result(timeout=10) == 49
    with pytest.raises(ValueError, match="bad item"):
      futures[1].result(timeout=10)
  finally:
    batcher.close()


def test_damaged_snapshot_is_rebuilt_from_the_clip_log(tmp_path):
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.serve.spaces import SpaceStore
  cfg = _config(tmp_path)
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, HashedBowEmbedder((), (), 384), snapshot_every=2)
  space = store.create("alice", "s")
  for ep, sem in CLIPS:
    store.add_clip(space, ep, sem)
  before = space.graph.to_json()
  store.close()
  snapshots = list((tmp_path / "data" / "spaces" / space.id).glob("graph_*"))
  assert [p.name for p in snapshots] == ["graph_00000004"]
  (snapshots[0] / "arrays.npz").write_bytes(b"torn write")
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, HashedBowEmbedder((), (), 384), snapshot_every=2)
  assert store.get("alice", space.id).graph.to_json() == before
  store.close()


def test_no_route_answers_5xx_to_junk(srv, space):
  """A small schemathesis-style sweep: every OpenAPI operation gets malformed ids, params and bodies."""
  import itertools
  import random
  rng = random.Random(0)
  spec = srv.client.get("/openapi.json").json()
  junk_values = [None, True, -1, 2**70, 1.5, "", "x" * 300, "../../etc/passwd", "\x00", "💥", [], {}, [1, "a"],
                 {"question": {"nested": 1}}]
  ids = [space, "..", "%2e%2e", "0" * 32, "-1", "99999999999999999999999", "abc"]
  bodies = [b"", b"null", b"[]", b"{", b'{"questions": [{}]}', b'{"episodic": [null]}', b"\xff\xfe"]
  bodies += [json.dumps({k: rng.choice(junk_values) for k in ("name", "kind", "question", "questions", "before_clip",
                                                               "episodic", "semantic", "clip_id", "path")}).encode()
             for _ in range(12)]
  checked = 0
  for path, ops in spec["paths"].items():
    for method in ops:
      for pid, body in itertools.islice(zip(itertools.cycle(ids), bodies), len(bodies)):
        url = path.replace("{space_id}", pid).replace("{clip_id}", rng.choice(["0", "-3", "x", "10**9"])) \
            .replace("{node_id}", rng.choice(["0", "-1", "9" * 25])).replace("{job_id}", rng.choice(["x", pid]))
        params = {"before_clip": rng.choice(["-1", "x", "3", "1e99"]), "filename": rng.choice(["a.mp4", "../x", ""])}
        if method == "delete" and pid == space:
          continue                                  # keep the shared space for the other tests
        r = srv.client.request(method.upper(), url, params=params, content=body,
                               headers={**ALICE, "Content-Type": "application/json"})
        assert r.status_code < 500, (method, url, body, r.status_code, r.text)
        assert str(srv.tmp) not in r.text, r.text                  # never a server path
        checked += 1
  assert checked > 200 and srv.client.get("/healthz").status_code == 200


def test_write_through_a_stale_handle_after_delete_is_refused(tmp_path):
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.serve.spaces import SpaceError, SpaceStore
  cfg = _config(tmp_path)
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, HashedBowEmbedder((), (), 384))
  handle = store.create("alice", "s")
  store.delete("alice", handle.id)
  with pytest.raises(SpaceError, match="unknown space") as e:
    store.add_clip(handle, ["too late"], [])
  assert e.value.status == 404 and store.list("alice") == []
  assert store._query("SELECT COUNT(*) FROM clips")[0][0] == 0
  store.close()


def test_one_kernel_call_answers_a_batch_over_many_spaces(tmp_path, monkeypatch):
  """A batch whose questions hit three spaces makes ONE search-kernel call (not one per space), and each
  answer equals that space searched alone."""
  from m3jax.control.answer import RETRIEVAL_ROUTE
  from m3jax.memory import search as search_lib
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  from m3jax.serve.answering import AskItem, RetrievalAnswerer, SharedEmbedCache
  from m3jax.serve.spaces import SpaceStore
  cfg = _config(tmp_path)
  store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, SharedEmbedCache(HashedBowEmbedder((), (), 384)))
  spaces = [store.create("alice", f"s{i}") for i in range(3)]
  for i, space in enumerate(spaces):
    for ep, sem in CLIPS[i:] + CLIPS[:i] + CLIPS[: i + 1]:          # other clip orders and counts per space
      store.add_clip(space, ep, sem)
  calls = []
  kernel = search_lib.search_batch
  monkeypatch.setattr(search_lib, "search_batch", lambda *a, **k: calls.append(len(a[2])) or kernel(*a, **k))
  items = [AskItem(spaces[i % 3], CLIPS[i % 4][0][0], before_clip=None if i % 2 else 3) for i in range(9)]
  out = RetrievalAnswerer(store)(items)
  assert calls == [3]                                   # one call, over the three spaces' graphs
  for it, o in zip(items, out):
    alone = search_lib.MemorySearcher([it.space.graph], store.embed_fn, store.search_config).search(
        [search_lib.SearchRequest(0, it.question, RETRIEVAL_ROUTE, it.before_clip)])[0]
    assert o["trajectory"][0]["memories"] == alone.memories and o["trajectory"][0]["retrieved_clips"] == alone.clips
  store.close()
