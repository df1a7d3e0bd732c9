"""m3jax memory service: many memory spaces, batched answers, durable memory, API keys, a viewer.

  python serve.py --config configs/serve.py [--set port=9000 ...]                 serve (127.0.0.1 by default)
  python serve.py --config configs/serve.py add-key TENANT                       new API key (printed once)
  python serve.py --config configs/serve.py import-pickle --tenant T --name N PATH   a reference pickle as a space
  python serve.py --config configs/serve.py import-memory --tenant T --name N DIR    a `m3jax memorize` directory
                                                                                    as a video space

Reference pickles and memory directories are imported only by the admin commands above, never from a request.
Bad settings, a busy port or a malformed name end with one `serve.py: error: ...` line (exit status 2).
"""

from __future__ import annotations

import argparse
import socket
import sys

from m3jax import compile_cache
from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.errors import UserError, run_cli
from m3jax.host_memory import retain_freed_memory
from m3jax.serve.config import ServeConfig


def _listen(host: str, port: int) -> socket.socket:
  """The listening socket, bound before any model loads: a busy port is reported at once, and the address
  printed on start is the one already bound (uvicorn serves on this very socket)."""
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
  return sock


def _store(cfg: ServeConfig):
  from m3jax.serve.app import _embedder
  from m3jax.serve.spaces import SpaceStore
  return SpaceStore(cfg.data_dir, cfg.graph, cfg.search, _embedder(cfg), cfg.snapshot_every)


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n")[0])
  add_config_args(parser)
  sub = parser.add_subparsers(dest="command")
  key = sub.add_parser("add-key", help="create an API key for a tenant (its SHA-256 goes to keys_file)")
  key.add_argument("tenant")
  for name, what in (("import-pickle", "a reference memory-graph pickle"),
                     ("import-memory", "a memory directory written by `m3jax memorize` (a new video space)")):
    imp = sub.add_parser(name, help=f"import {what} as a new space")
    imp.add_argument("--tenant", required=True)
    imp.add_argument("--name", required=True)
    imp.add_argument("path")
  args = parser.parse_args(argv)
  retain_freed_memory()
  compile_cache.enable()
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(ServeConfig(), args.overrides)

  if args.command == "add-key":
    from m3jax.serve.auth import add_key
    if not cfg.keys_file:
      raise UserError("set keys_file to store keys")
    print(add_key(cfg.keys_file, args.tenant))
    return 0
  if args.command in ("import-pickle", "import-memory"):
    store = _store(cfg)
    try:
      if args.command == "import-pickle":
        from m3jax.memory.reference_pickle import load_reference_pickle
        space = store.import_graph(args.tenant, args.name, load_reference_pickle(args.path))
      else:
        space = store.import_memory_dir(args.tenant, args.name, args.path)
    finally:
      store.close()
    print(f"imported {args.path} as space {space.id} ({space.summary()['memories']} memories)")
    return 0

  import uvicorn
  from m3jax.serve.app import create_app
  sock = _listen(cfg.host, cfg.port)
  app = create_app(cfg)                         # bad keys or embedder file: ValueError, one line (run_cli)
  host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
  print(f"m3jax memory service listening on http://{host}:{cfg.port} (API docs at /docs)", flush=True)
  uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
  return 0


if __name__ == "__main__":
  sys.exit(run_cli(main, prog="serve.py"))
