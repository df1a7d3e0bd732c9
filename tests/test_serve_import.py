"""A memory directory written for `m3jax ask` imports into the service (`serve.py import-memory`), and the
service retrieves what `m3jax ask` answers from, for the same question: both read one retrieval configuration
(`m3jax.control.answer.ASK_SEARCH` / `RETRIEVAL_ROUTE`)."""

import contextlib
import dataclasses
import io
import json

import pytest

from m3jax.memorize.pipeline import FORMAT, VERSION, MemorizeConfig, default_graph_config
from m3jax.data.memory_qa import episode_graph
from m3jax.models.bert import TextEmbedder
from m3jax.serve.spaces import SpaceError
from m3jax.memory.store import save_graph
from test_serve import ALICE, Server, _config

pytestmark = pytest.mark.slow


def _memory_dir(path, graph) -> None:
  """The layout `m3jax memorize` leaves (m3jax.memorize.pipeline): a graph snapshot named by manifest.json."""
  clips = graph.max_clip + 1
  save_graph(graph, path / f"graph_{clips:05d}")
  config = MemorizeConfig()
  (path / "manifest.json").write_text(json.dumps({
      "format": FORMAT, "version": VERSION, "sources": [{"path": "/videos/episode.mp4", "first_clip": 0}],
      "next_clip": clips, "graph": f"graph_{clips:05d}", "journal": [], "writer": "template",
      "writer_state": {}, "graph_config": dataclasses.asdict(graph.config),
      "memorize_config": {"clip_seconds": config.clip_seconds, "perception": dataclasses.asdict(config.perception)},
      "timings": {}}))


def test_cli_memory_imports_and_serve_retrieves_what_m3jax_ask_answers(tmp_path):
  import serve
  from m3jax import cli
  graph, qa = episode_graph(3, TextEmbedder.from_pretrained(), 384, graph_config=default_graph_config())
  q = next(q for q in qa if q["family"] == "drink" and not q["unanswerable"])  # "Which drink does Rachel enjoy?"
  drink = q["answer"].rstrip(".").lower()
  mem = tmp_path / "mem"
  mem.mkdir()
  _memory_dir(mem, graph)

  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    assert cli.main(["ask", "--memory", str(mem), "--answerer", "rules", q["question"], "--before-clip",
                     str(q["before_clip"])]) == 0
  answer = out.getvalue().strip()
  assert drink in answer.lower(), (q, answer)

  args = ["--set", f"data_dir={tmp_path / 'data'}"]
  with pytest.raises(SpaceError, match="is not a memory directory"):
    serve.main(args + ["import-memory", "--tenant", "alice", "--name", "x", str(tmp_path)])
  assert serve.main(args + ["import-memory", "--tenant", "alice", "--name", "episode", str(mem)]) == 0
  srv = Server(_config(tmp_path, embedder="minilm"))
  try:
    spaces = srv.client.get("/v1/spaces", headers=ALICE).json()["spaces"]
    assert [(s["name"], s["kind"], s["clips"], s["nodes"]) for s in spaces] == [
        ("episode", "video", len(graph.clip_texts), graph.next_node_id)]
    r = srv.client.post(f"/v1/spaces/{spaces[0]['id']}/ask", headers=ALICE,
                        json={"question": q["question"], "before_clip": q["before_clip"]}).json()
    found = [s for sentences in r["trajectory"][0]["memories"].values() for s in sentences]
    assert any(f"likes to drink {drink}" in s for s in found), (q, found)
  finally:
    srv.stop()
