"""m3jax.serve: a multi-tenant memory service (FastAPI) over memory spaces on disk.

Public seam:
  ServeConfig                     config.py    every setting of the service (configs/serve.py)
  create_app(config) -> FastAPI   app.py       the HTTP API, the viewer page, health and metrics
  SpaceStore                      spaces.py    memory spaces: SQLite (WAL) metadata + clip log, graph snapshots
  KeyRing, hash_key, new_key      auth.py      API keys stored hashed; tenant of a presented key
  Batcher                         batching.py  dynamic batching of concurrent questions
  JobRunner                       jobs.py      ingestion (memorization) as background jobs
"""
