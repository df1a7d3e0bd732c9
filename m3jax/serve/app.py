"""The memory service's HTTP API (FastAPI app factory; OpenAPI docs at /docs).

Every /v1 route needs an API key (`Authorization: Bearer KEY` or `X-API-Key: KEY`) and sees only its tenant's
spaces. Errors are JSON `{"error": message}` with a 4xx status naming the problem: 400 malformed JSON, 401 bad
key, 404 unknown space/job/clip/node, 409 conflicts, 413 too large, 422 invalid fields or unusable media (unknown
fields and ids beyond int32 included). Every route documents its error statuses in the OpenAPI spec, and
tests/test_serve_schema.py fuzzes the spec with schemathesis. Error messages never show server paths (data dir,
allowed dirs): a file is named as the client knows it. The API docs at /docs work offline (assets served here).
"""


import asyncio
import contextlib
import hashlib
import logging
import os
import pathlib
import re
import threading
import time
import uuid
from typing import Annotated, Literal

from fastapi import Depends, FastAPI, Header, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException
from swagger_ui_bundle import swagger_ui_path

from m3jax.memory.graph import FACE, REFERENCE_TYPE, VOICE
from m3jax.memory.search import SearchError
from m3jax.serve.answering import AskItem, ControllerAnswerer, RetrievalAnswerer, SharedEmbedCache
from m3jax.serve.auth import KeyRing
from m3jax.serve.batching import Batcher, JoiningBatcher
from m3jax.serve.config import ServeConfig
from m3jax.serve.jobs import JobRunner
from m3jax.serve.limits import BodyLimit, Metrics
from m3jax.serve.spaces import MAX_CLIP_ID, NAME_RE, Space, SpaceError, SpaceStore

log = logging.getLogger("m3jax.serve")
VIEWER = pathlib.Path(__file__).with_name("viewer.html")
DOCS_ASSETS = "/docs-assets"                 # Swagger UI's files, served locally
_PATH_TAIL = r"[^\s'\",:;)]*"               # the rest of a path inside a message
VIDEO_SUFFIXES = (".mp4", ".mkv", ".webm", ".mov", ".avi")
VIDEO_NAME = r"(?i)^[^/]+\.(mp4|mkv|webm|mov|avi)$"           # a file name (not a path) with a video suffix
MAX_ID = MAX_CLIP_ID                    # clip and node ids are int32 on device: larger ones are refused (422)
UPLOAD_BODY = {"requestBody": {"required": True, "description": "the video file's bytes (streamed to disk)",
                               "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                                   "format": "binary"}}}}}


class SpaceIn(BaseModel):
  model_config = ConfigDict(extra="forbid")          # unknown fields are refused (422), not silently dropped
  name: str = Field(min_length=1, max_length=64, pattern=NAME_RE.pattern)
  kind: Literal["clips", "video"] = "clips"


Memory = Annotated[str, Field(min_length=1, pattern=r"\S")]      # not empty, not only white space


class ClipIn(BaseModel):
  model_config = ConfigDict(extra="forbid")
  clip_id: int | None = Field(default=None, ge=0, le=MAX_ID)
  episodic: list[Memory] = Field(default_factory=list)
  semantic: list[Memory] = Field(default_factory=list)


class Question(BaseModel):
  """One question (answered alone, or as one of a batch)."""
  model_config = ConfigDict(extra="forbid")
  question: str = Field(min_length=1, max_length=4000)
  before_clip: int | None = Field(default=None, ge=0, le=MAX_ID)


class Questions(BaseModel):
  """A batch of questions, answered together."""
  model_config = ConfigDict(extra="forbid")
  questions: list[Question] = Field(min_length=1)


AskIn = Question | Questions                      # `{"question": ...}` or `{"questions": [...]}`, never both


class IngestIn(BaseModel):
  model_config = ConfigDict(extra="forbid")
  path: str = Field(min_length=1, max_length=1024)


class ErrorOut(BaseModel):
  """Every error answer: a message naming the problem (and the invalid fields for 400/422)."""
  error: str
  detail: list[dict] | None = None


_ERROR_TEXT = {400: "malformed JSON, or a body that is not a JSON object", 401: "missing or invalid API key",
               403: "the operation is disabled by the server's configuration",
               404: "unknown space, job, clip or node", 409: "conflicts with the space's state",
               413: "request too large", 422: "invalid fields or unusable media"}


def _errors(*codes: int) -> dict:
  """OpenAPI `responses` for the error statuses a route can answer (every route may answer 413: body limit)."""
  return {c: {"model": ErrorOut, "description": _ERROR_TEXT[c]} for c in sorted({413, *codes})}


def _embedder(config: ServeConfig):
  from m3jax.memory.embedders import make_embedder
  return make_embedder(config.embedder, dim=config.graph.text_dim if config.embedder == "hashed" else None)


class PathScrubber:
  """Cuts every path under a server directory (data dir, allowed dirs, the working directory) down to its last
  component: answers name the file the client knows, never where the server keeps it. A directory named as
  configured (relative) is matched only with a path below it, so plain words are left alone."""

  def __init__(self, roots: list[str]):
    absolute = {str(pathlib.Path(r).resolve()) for r in roots if r}
    relative = {r.rstrip("/") for r in roots if r and not pathlib.Path(r).is_absolute() and r.strip("./")}
    by_length = lambda forms: enumerate(sorted(forms, key=len, reverse=True))
    alternatives = [f"{re.escape(f)}(?P<a{i}>/{_PATH_TAIL})?" for i, f in by_length(absolute)]
    alternatives += [f"{re.escape(f)}(?P<r{i}>/{_PATH_TAIL})" for i, f in by_length(relative)]
    self._re = re.compile(r"(?<![\w.-])(?:" + "|".join(alternatives) + r")(?![\w.-])")

  def __call__(self, text: str) -> str:
    def cut(m: re.Match) -> str:
      tail = next((t for t in m.groupdict().values() if t), "")
      return pathlib.PurePath(tail).name or "<server dir>"
    return self._re.sub(cut, text)


def _error(status: int, message: str, headers: dict | None = None, **extra) -> JSONResponse:
  return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def create_app(config: ServeConfig, keys: KeyRing | None = None, policy=None) -> FastAPI:
  """The app; `keys` defaults to the configured key file and environment variable. `policy`, when given, is the
  control agent's policy (an `m3jax.control.policy.Policy`, e.g. one served elsewhere) and overrides
  `config.answerer`."""
  keys = keys if keys is not None else KeyRing.load(config.keys_file, config.keys_env)
  if not len(keys):
    raise ValueError("no API keys configured: create one with `python serve.py --config ... add-key TENANT`")
  embedder = _embedder(config)
  cache = SharedEmbedCache(embedder)
  warm = threading.Event()

  def warm_up() -> None:
    try:
      embedder.warmup(config.warmup_lengths, config.max_batch)
    except Exception:
      log.exception("embedder warm-up failed; its shapes compile on first use")
    finally:
      warm.set()

  if config.warmup_lengths and hasattr(embedder, "warmup"):
    # WHY in the background: start-up stays fast; until `warm`, a batch of a new shape compiles it on the spot
    threading.Thread(target=warm_up, name="m3jax-warmup", daemon=True).start()
  else:
    warm.set()
  store = SpaceStore(config.data_dir, config.graph, config.search, cache, config.snapshot_every)
  if policy is not None:
    answer = ControllerAnswerer(policy, config.max_rounds, store, config.slots)
  elif config.answerer in ("trained", "controller"):
    answer = ControllerAnswerer.from_llm(config.llm, config.max_new_tokens, config.max_rounds, store,
                                         adapter=config.adapter if config.answerer == "trained" else None,
                                         slots=config.slots)
  else:
    answer = RetrievalAnswerer(store)
  if config.join_running and isinstance(answer, ControllerAnswerer) and answer.streams:
    batcher = JoiningBatcher(answer, answer.stream, config.max_batch)
  else:
    batcher = Batcher(answer, config.max_batch, config.max_wait_ms / 1000)
  jobs = JobRunner(store, batcher, config.job_yield_ms / 1000, config.memorize_config)
  metrics = Metrics()
  allowed = [pathlib.Path(d).resolve() for d in config.allowed_dirs]
  scrub = PathScrubber([config.data_dir, *config.allowed_dirs, os.getcwd()])

  def error(status: int, message: str, headers: dict | None = None, **extra) -> JSONResponse:
    return _error(status, scrub(message), headers, **extra)

  @contextlib.asynccontextmanager
  async def lifespan(_app: FastAPI):
    yield
    jobs.close()
    batcher.close()
    store.snapshot_all()
    store.close()

  # WHY not FastAPI's own /docs: it loads Swagger UI from a CDN, a blank page offline; the assets ship in the
  # swagger-ui-bundle package and are served from here (ReDoc, CDN-only too, is off)
  app = FastAPI(title="m3jax memory service", version="1", lifespan=lifespan, docs_url=None, redoc_url=None)
  app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")
  app.state.store, app.state.batcher, app.state.jobs, app.state.config = store, batcher, jobs, config
  app.add_middleware(BodyLimit, json_limit=config.max_body_kb * 1024, metrics=metrics)

  @app.exception_handler(SpaceError)
  async def _space_error(_req, e: SpaceError):
    return error(e.status, str(e))

  @app.exception_handler(HTTPException)            # unknown routes, wrong methods, unparseable bodies
  async def _http_error(_req, e: HTTPException):
    return error(e.status_code, str(e.detail), headers=e.headers)

  @app.exception_handler(SearchError)
  async def _search_error(_req, e: SearchError):
    return error(422, str(e))

  @app.exception_handler(RequestValidationError)
  async def _validation(_req, e: RequestValidationError):
    errors = [{"loc": list(err.get("loc", ())), "msg": err.get("msg", ""), "type": err.get("type", "")}
              for err in e.errors()]
    if any(err["type"] == "json_invalid" for err in errors):
      return error(400, "malformed JSON body", detail=errors)
    if any(err["loc"] == ["body"] and err["type"] == "model_attributes_type" for err in errors):
      return error(400, "the body must be a JSON object (send Content-Type: application/json)", detail=errors)
    where = "; ".join(f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in errors)
    return error(422, f"invalid request: {where}", detail=errors)

  @app.exception_handler(Exception)
  async def _internal(_req, e: Exception):
    log.exception("internal error")
    return error(500, f"internal error ({type(e).__name__})")

  # Dependencies are async (no thread-pool hop per request); a space's first load runs in a worker thread.
  async def tenant(authorization: Annotated[str | None, Header()] = None,
                   x_api_key: Annotated[str | None, Header()] = None) -> str:
    key = x_api_key or (authorization[7:] if authorization and authorization.startswith("Bearer ") else None)
    who = keys.tenant_of(key)
    if who is None:
      raise SpaceError("missing or invalid API key", 401)
    return who

  Tenant = Annotated[str, Depends(tenant)]

  async def space_of(space_id: str, who: Tenant) -> Space:
    loaded = store.loaded(space_id)
    if loaded is not None:
      if loaded.tenant != who:
        raise SpaceError(f"unknown space {space_id!r}", 404)
      return loaded
    return await asyncio.to_thread(store.get, who, space_id)

  SpaceDep = Annotated[Space, Depends(space_of)]

  # ------------------------------------------------------------------------------------------- service
  @app.get("/healthz", responses=_errors())
  def healthz() -> dict:
    return {"status": "ok", "spaces_loaded": store.num_loaded, "pending_questions": batcher.pending,
            "warm": warm.is_set()}

  @app.get("/metrics", response_class=PlainTextResponse, responses=_errors())
  def metrics_text() -> str:
    return metrics.render(batcher)

  @app.get("/docs", include_in_schema=False)
  def docs() -> HTMLResponse:
    return get_swagger_ui_html(openapi_url=app.openapi_url, title=f"{app.title} - API docs",
                               swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js",
                               swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
                               swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png")

  @app.get("/", include_in_schema=False)
  def viewer() -> FileResponse:
    return FileResponse(VIEWER, media_type="text/html")

  # -------------------------------------------------------------------------------------------- spaces
  @app.post("/v1/spaces", status_code=201, responses=_errors(400, 401, 409, 422))
  def create_space(body: SpaceIn, who: Tenant) -> dict:
    return store.create(who, body.name, body.kind).summary()

  @app.get("/v1/spaces", responses=_errors(401, 422))
  def list_spaces(who: Tenant) -> dict:
    return {"spaces": [s.summary() for s in store.list(who)]}

  @app.get("/v1/spaces/{space_id}", responses=_errors(401, 404, 422))
  def get_space(space: SpaceDep) -> dict:
    return space.summary()

  @app.delete("/v1/spaces/{space_id}", status_code=204, responses=_errors(401, 404, 409, 422))
  def delete_space(space: SpaceDep) -> Response:
    store.delete(space.tenant, space.id)
    return Response(status_code=204)

  @app.post("/v1/spaces/{space_id}/clips", status_code=201, responses=_errors(400, 401, 404, 409, 422))
  def add_clip(body: ClipIn, space: SpaceDep) -> dict:
    if len(body.episodic) + len(body.semantic) > config.max_memories_per_clip:
      raise SpaceError(f"at most {config.max_memories_per_clip} memories per clip", 413)
    return store.add_clip(space, body.episodic, body.semantic, body.clip_id)

  # ------------------------------------------------------------------------------------------------ ask
  @app.post("/v1/spaces/{space_id}/ask", responses=_errors(400, 401, 404, 422))
  async def ask(body: AskIn, space: SpaceDep) -> dict:
    qs = body.questions if isinstance(body, Questions) else [body]
    if len(qs) > config.max_questions_per_request:
      raise SpaceError(f"at most {config.max_questions_per_request} questions per request", 413)
    start = time.perf_counter()
    futures = batcher.submit([AskItem(space, q.question, q.before_clip) for q in qs])
    answers = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    metrics.observe_ask(len(qs), time.perf_counter() - start)
    out = [{"question": q.question, "before_clip": q.before_clip, **a} for q, a in zip(qs, answers)]
    return {"answers": out} if isinstance(body, Questions) else out[0]

  # ------------------------------------------------------------------------------------------------ read
  @app.get("/v1/spaces/{space_id}/characters", responses=_errors(401, 404, 422))
  def characters(space: SpaceDep, before_clip: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None) -> dict:
    with space.lock:
      g = space.graph
      chars = g.characters(before_clip)
      out = {}
      for name, members in chars.mappings.items():
        ids = [int(m.split("_")[1]) for m in members]
        out[name] = {"faces": [i for i in ids if g.kind(i) == FACE], "voices": [i for i in ids if g.kind(i) == VOICE],
                     "transcripts": [t for i in ids if g.kind(i) == VOICE for t in g.contents[i][:5]]}
      return {"characters": out}

  @app.get("/v1/spaces/{space_id}/clips/{clip_id}", responses=_errors(401, 404, 422))
  def clip(space: SpaceDep, clip_id: Annotated[int, Path(ge=0, le=MAX_ID)]) -> dict:
    with space.lock:
      g = space.graph
      if clip_id not in g.clip_texts:
        raise SpaceError(f"space {space.id} has no clip {clip_id}", 404)
      slots = g.clip_memories(clip_id, g.next_node_id)
      mems = [{"node": int(g.text_node.data[s]), "kind": REFERENCE_TYPE[g.kind(int(g.text_node.data[s]))],
               "text": g.text_of(s)} for s in slots]
      return {"clip_id": clip_id, "memories": mems}

  @app.get("/v1/spaces/{space_id}/nodes/{node_id}", responses=_errors(401, 404, 422))
  def node(space: SpaceDep, node_id: Annotated[int, Path(ge=0, le=MAX_ID)]) -> dict:
    with space.lock:
      g = space.graph
      if not 0 <= node_id < g.next_node_id or g.kind(node_id) == 0:
        raise SpaceError(f"space {space.id} has no node {node_id}", 404)
      kind = g.kind(node_id)
      item = {"id": node_id, "type": REFERENCE_TYPE[kind], "contents": g.contents[node_id][:20]}
      if kind not in (FACE, VOICE):
        item["clip"] = int(g.node_clip.data[node_id])
      return item

  @app.get("/v1/spaces/{space_id}/graph", responses=_errors(401, 404, 422))
  def graph(space: SpaceDep, before_clip: Annotated[int | None, Query(ge=0, le=MAX_ID)] = None) -> dict:
    with space.lock:
      return space.graph.to_json(before_clip)

  # ---------------------------------------------------------------------------------------------- ingest
  @app.put("/v1/spaces/{space_id}/videos", status_code=202, responses=_errors(401, 404, 409, 422),
           openapi_extra=UPLOAD_BODY)
  async def upload_video(request: Request, space: SpaceDep, filename: Annotated[str, Query(
      max_length=128, pattern=VIDEO_NAME, description=f"ends with one of {VIDEO_SUFFIXES}")]) -> dict:
    suffix = pathlib.PurePath(filename).suffix.lower()
    if suffix not in VIDEO_SUFFIXES:
      raise SpaceError(f"filename must end with one of {VIDEO_SUFFIXES}", 422)
    limit = int(config.max_upload_mb * 2**20)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
      raise SpaceError(f"upload of {declared} bytes exceeds the {config.max_upload_mb} MiB limit", 413)
    uploads = store.space_dir(space.id) / "uploads"
    uploads.mkdir(parents=True, exist_ok=True)
    target = uploads / f"{uuid.uuid4().hex}{suffix}"      # never a client-chosen path
    size, digest = 0, hashlib.sha256()
    try:
      with open(target, "wb") as f:
        async for chunk in request.stream():
          size += len(chunk)
          if size > limit:
            raise SpaceError(f"upload exceeds the {config.max_upload_mb} MiB limit", 413)
          f.write(chunk)
          digest.update(chunk)
      if size == 0:
        raise SpaceError("empty upload", 422)
      return {"job_id": await asyncio.to_thread(jobs.submit, space.tenant, space, target, filename,
                                                digest.hexdigest())}
    except BaseException:
      target.unlink(missing_ok=True)
      raise

  @app.post("/v1/spaces/{space_id}/ingest", status_code=202, responses=_errors(400, 401, 403, 404, 409, 422))
  def ingest_local(body: IngestIn, space: SpaceDep) -> dict:
    if not allowed:
      raise SpaceError("ingesting local files is disabled (no allowed_dirs configured)", 403)
    candidate = pathlib.Path(body.path)
    if candidate.is_absolute() or ".." in candidate.parts or "\x00" in body.path:
      raise SpaceError("path must be relative to an allowed directory, without '..'", 422)
    for root in allowed:
      try:
        full = (root / candidate).resolve()
        found = full.is_relative_to(root) and full.is_file()
      except OSError as e:                       # a name too long, a loop of links, ...
        raise SpaceError(f"unusable path {body.path[:80]!r}: {e.strerror}", 422) from None
      if found:
        return {"job_id": jobs.submit(space.tenant, space, full, body.path)}
    raise SpaceError(f"no file {body.path!r} under the allowed directories", 404)

  @app.get("/v1/jobs/{job_id}", responses=_errors(401, 404, 422))
  def job(job_id: str, who: Tenant) -> dict:
    out = store.job_get(who, job_id)
    return {**out, "message": scrub(out["message"])}

  return app
