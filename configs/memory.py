"""Memory graph and search tools (paper voting, exact backend, backfill of seen clips).

  python -c "from m3jax.config import load_config; print(load_config('configs/memory.py', ['graph.mode=reference']))"
"""

from m3jax.memory.config import MemoryConfig
from m3jax.memory.graph import GraphConfig
from m3jax.memory.search import SearchConfig


def get_config() -> MemoryConfig:
  return MemoryConfig(graph=GraphConfig(text_dim=384, mode="paper"),
                      search=SearchConfig(clip_topk=2, node_topk=20, threshold=0.5, backend="auto"))
