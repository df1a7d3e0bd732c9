"""One config object for the memory: graph settings and search-tool settings (see configs/memory.py)."""

from __future__ import annotations

import dataclasses

from m3jax.memory.graph import GraphConfig
from m3jax.memory.search import SearchConfig


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  graph: GraphConfig = GraphConfig()
  search: SearchConfig = SearchConfig()
