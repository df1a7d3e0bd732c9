"""Ingestion of an uploaded video as a background job (the real memorization pipeline and models), with a
`kill -9` of the server in the middle of it, and a second upload of the same video refused (409).

A rendered two-clip episode is uploaded to a `video` space of a `python serve.py` subprocess. While the job
runs, questions on another space are answered without waiting for it and the space cannot be deleted. Once
the job reports its first clip done, the server is SIGKILLed; the restarted server still holds that
acknowledged clip unchanged, resumes the job at the next clip, and finishes it.
"""

import json
import pathlib
import signal
import socket
import time

import httpx

from m3jax.data.episode_render import render_episode
from m3jax.data.episodes import EpisodeConfig, make_episode
from test_serve import CLIPS
from test_serve_durability import KEY, _start, server_log

HEADERS = {"X-API-Key": KEY}


def _job(c: httpx.Client, job_id: str, proc) -> dict:
  """The job's status. A dropped connection is retried while the server runs (uvicorn closes idle keep-alive
  connections after 5 s, and a busy 2-core machine can stretch that race); a server that died fails the test
  with its stderr."""
  for attempt in range(3):
    try:
      return c.get(f"/v1/jobs/{job_id}", headers=HEADERS).json()
    except httpx.TransportError as e:
      if proc.poll() is not None or attempt == 2:
        raise AssertionError(f"GET /v1/jobs: {e!r}; {server_log(proc)}") from e
      time.sleep(1)


def test_ingest_job_survives_kill_9_and_does_not_block_questions(tmp_path):
  ep = make_episode(EpisodeConfig(seed=1, num_clips=2, num_characters=2))
  video = pathlib.Path(render_episode(ep, tmp_path / "episode")["video"])
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  extra = ["--set", "embedder=minilm", "--set", "max_upload_mb=64.0", "--set", "warmup_lengths=()",
           "--set", "memorize.snapshot_every=2",      # clip 0 is checkpointed as a journal, clip 1 as a snapshot
           "--set", "graph.voice_threshold=0.74"]     # the service's graph config reaches video ingestion
  proc = _start(tmp_path / "data", port, extra)
  try:
    c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    notes = c.post("/v1/spaces", json={"name": "notes"}, headers=HEADERS).json()["id"]
    c.post(f"/v1/spaces/{notes}/clips", json={"episodic": CLIPS[0][0]}, headers=HEADERS)
    sid = c.post("/v1/spaces", json={"name": "cam", "kind": "video"}, headers=HEADERS).json()["id"]
    r = c.put(f"/v1/spaces/{sid}/videos", params={"filename": "episode.mp4"}, content=video.read_bytes(),
              headers=HEADERS)
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    again = c.put(f"/v1/spaces/{sid}/videos", params={"filename": "copy.mp4"}, content=video.read_bytes(),
                  headers=HEADERS)
    assert again.status_code == 409 and job_id in again.json()["error"], again.text   # not memorized twice
    assert c.post(f"/v1/spaces/{notes}/ask", json={"question": "Who cooks pasta?"}, headers=HEADERS).status_code == 200
    assert _job(c, job_id, proc)["status"] in ("queued", "running")       # answered while the job was still going
    r = c.delete(f"/v1/spaces/{sid}", headers=HEADERS)
    assert r.status_code == 409 and "in progress" in r.json()["error"]
    deadline = time.time() + 600                  # generous: the machine may be shared
    while (job := _job(c, job_id, proc))["clips_done"] < 1:
      assert time.time() < deadline and job["status"] in ("queued", "running"), job
      time.sleep(0.1)
    first = c.get(f"/v1/spaces/{sid}/clips/0", headers=HEADERS).json()
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert (job["status"], job["clips_done"], job["clips_total"]) == ("running", 1, 2), job
    assert job["source"] == "episode.mp4" and str(tmp_path) not in str(job)          # no server path shown
    c.close()

    proc = _start(tmp_path / "data", port, extra)
    c = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    assert c.get(f"/v1/spaces/{sid}/clips/0", headers=HEADERS).json() == first      # the acknowledged clip
    while (job := _job(c, job_id, proc))["status"] not in ("done", "failed"):
      assert time.time() < deadline, job
      time.sleep(0.25)
    assert (job["status"], job["clips_done"], job["clips_total"]) == ("done", 2, 2), job
    r = c.put(f"/v1/spaces/{sid}/videos", params={"filename": "again.mp4"}, content=video.read_bytes(),
              headers=HEADERS)
    assert r.status_code == 409 and "already ingested" in r.json()["error"]
    info = c.get(f"/v1/spaces/{sid}", headers=HEADERS).json()
    manifest = json.loads((tmp_path / "data" / "spaces" / sid / "memdir" / "manifest.json").read_text())
    assert manifest["graph_config"]["voice_threshold"] == 0.74 and manifest["graph_config"]["face_dim"] == 128
    assert manifest["graph"] == "graph_00002" and manifest["journal"] == []
    assert (info["clips"], info["max_clip"]) == (2, 1)
    chars = c.get(f"/v1/spaces/{sid}/characters", headers=HEADERS).json()["characters"]
    transcripts = " ".join(t for ch in chars.values() for t in ch["transcripts"])
    assert ep.characters[0].name in transcripts
    face = next(ch["faces"][0] for ch in chars.values() if ch["faces"])
    assert c.get(f"/v1/spaces/{sid}/nodes/{face}", headers=HEADERS).json()["type"] == "img"
    said = ep.clips[1].utterances[-1].text
    out = c.post(f"/v1/spaces/{sid}/ask", json={"question": said}, headers=HEADERS).json()
    assert 1 in out["trajectory"][0]["retrieved_clips"]
    c.close()
  finally:
    proc.kill()
    proc.wait()
