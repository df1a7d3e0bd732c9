"""m3jax memory service: many memory spaces, batched answers, durable memory, API keys, a viewer.

  python serve.py --config configs/serve.py [--set port=9000 ...]                 serve (127.0.0.1 by default)
  python serve.py --config configs/serve.py add-key TENANT                       new API key (printed once)
  python serve.py --config configs/serve.py import-pickle --tenant T --name N PATH   a reference pickle as a space

Reference pickles are imported only by the admin command above, never from a request.
"""

from __future__ import annotations

import argparse
import sys

from m3jax.config import add_config_args, apply_overrides, load_config
from m3jax.host_memory import retain_freed_memory
from m3jax.serve.config import ServeConfig


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="serve.py", description=__doc__.split("\n")[0])
  add_config_args(parser)
  sub = parser.add_subparsers(dest="command")
  key = sub.add_parser("add-key", help="create an API key for a tenant (its SHA-256 goes to keys_file)")
  key.add_argument("tenant")
  imp = sub.add_parser("import-pickle", help="import a reference memory-graph pickle as a new space")
  imp.add_argument("--tenant", required=True)
  imp.add_argument("--name", required=True)
  imp.add_argument("path")
  args = parser.parse_args(argv)
  retain_freed_memory()
  cfg = load_config(args.config, args.overrides) if args.config else apply_overrides(ServeConfig(), args.overrides)

  if args.command == "add-key":
    from m3jax.serve.auth import add_key
    if not cfg.keys_file:
      parser.error("set keys_file to store keys")
    print(add_key(cfg.keys_file, args.tenant))
    return 0
  if args.command == "import-pickle":
    from m3jax.memory.graph import MemoryGraph
    from m3jax.serve.app import _embedder
    from m3jax.serve.spaces import SpaceStore
    graph = MemoryGraph.from_reference_pickle(args.path)   # dimensions as stored in the pickle
    store = SpaceStore(cfg.data_dir, cfg.graph, cfg.search, _embedder(cfg), cfg.snapshot_every)
    space = store.import_graph(args.tenant, args.name, graph)
    print(f"imported {args.path} as space {space.id} ({space.summary()['memories']} memories)")
    store.close()
    return 0

  import uvicorn
  from m3jax.serve.app import create_app
  uvicorn.run(create_app(cfg), host=cfg.host, port=cfg.port, log_level="warning")
  return 0


if __name__ == "__main__":
  sys.exit(main())
