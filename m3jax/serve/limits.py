"""Request-size limit (ASGI middleware) and Prometheus-format metrics.

WHY buffer JSON bodies here: a body over the limit is refused with 413 before any handler parses it, even
when the client streams it without a Content-Length. Video uploads (`PUT .../videos`) are streamed to disk
by their handler, which enforces the upload limit itself.
"""

from __future__ import annotations

import collections
import json
import threading
import time

_LATENCY_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, float("inf"))


class Metrics:
  def __init__(self):
    self._lock = threading.Lock()
    self.requests: collections.Counter[tuple[str, int]] = collections.Counter()
    self.questions = 0
    self.ask_buckets = [0] * len(_LATENCY_BUCKETS_S)
    self.ask_seconds = 0.0
    self.ask_requests = 0
    self.started = time.time()

  def observe_request(self, method: str, status: int) -> None:
    with self._lock:
      self.requests[(method, status)] += 1

  def observe_ask(self, questions: int, seconds: float) -> None:
    with self._lock:
      self.questions += questions
      self.ask_requests += 1
      self.ask_seconds += seconds
      for i, bound in enumerate(_LATENCY_BUCKETS_S):
        if seconds <= bound:
          self.ask_buckets[i] += 1

  def render(self, batcher) -> str:
    with self._lock:
      lines = ["# TYPE m3jax_requests_total counter"]
      lines += [f'm3jax_requests_total{{method="{m}",status="{s}"}} {n}' for (m, s), n in sorted(self.requests.items())]
      lines += ["# TYPE m3jax_questions_total counter", f"m3jax_questions_total {self.questions}",
                "# TYPE m3jax_ask_seconds histogram"]
      for bound, n in zip(_LATENCY_BUCKETS_S, self.ask_buckets):
        lines.append(f'm3jax_ask_seconds_bucket{{le="{"+Inf" if bound == float("inf") else bound}"}} {n}')
      lines += [f"m3jax_ask_seconds_sum {self.ask_seconds:.6f}", f"m3jax_ask_seconds_count {self.ask_requests}",
                "# TYPE m3jax_batches_total counter", f"m3jax_batches_total {batcher.batches}",
                "# TYPE m3jax_batched_questions_total counter", f"m3jax_batched_questions_total {batcher.items}",
                "# TYPE m3jax_batch_seconds_total counter", f"m3jax_batch_seconds_total {batcher.batch_seconds:.6f}",
                "# TYPE m3jax_pending_questions gauge", f"m3jax_pending_questions {batcher.pending}",
                "# TYPE m3jax_uptime_seconds gauge", f"m3jax_uptime_seconds {time.time() - self.started:.1f}"]
    return "\n".join(lines) + "\n"


class BodyLimit:
  """Refuses JSON bodies over `json_limit` bytes with 413; counts responses by status for /metrics."""

  def __init__(self, app, json_limit: int, metrics: Metrics):
    self.app, self.json_limit, self.metrics = app, json_limit, metrics

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    method = scope["method"]

    async def counted_send(message):
      if message["type"] == "http.response.start":
        self.metrics.observe_request(method, message["status"])
      await send(message)

    if scope["path"].endswith("/videos"):
      return await self.app(scope, receive, counted_send)
    headers = dict(scope.get("headers", ()))
    declared = headers.get(b"content-length", b"")
    if declared.isdigit() and int(declared) > self.json_limit:
      return await _too_large(counted_send, self.json_limit)
    body, more = b"", True
    while more:
      message = await receive()
      if message["type"] == "http.disconnect":
        return
      body += message.get("body", b"")
      more = message.get("more_body", False)
      if len(body) > self.json_limit:
        return await _too_large(counted_send, self.json_limit)
    replayed = False

    async def replay():
      nonlocal replayed
      if not replayed:
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}
      return await receive()

    return await self.app(scope, replay, counted_send)


async def _too_large(send, limit: int) -> None:
  payload = json.dumps({"error": f"request body exceeds {limit} bytes"}).encode()
  await send({"type": "http.response.start", "status": 413,
              "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
  await send({"type": "http.response.body", "body": payload})
