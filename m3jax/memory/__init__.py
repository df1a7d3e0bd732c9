"""m3jax.memory: the entity-centric multimodal memory graph on device and the controller's search tools.

Public seam:
  MemoryGraph, GraphConfig            graph.py    insert faces/voices/clips, characters, views
  save_graph, load_graph              store.py    versioned persistence (load_reference_pickle: reference_pickle.py)
  SearchRequest, SearchResult,
  SearchConfig, MemorySearcher        search.py   batched search_clip / search_node in one jitted call
  ScannIndex, attach_scann            index.py    approximate retrieval backend for large graphs
  MemoryConfig                        config.py   graph + search settings (configs/memory.py)
  make_embedder                       embedders.py the one text-embedder factory (minilm, hashed, a spec file)
  make_design, MemoryDesign, ...      designs/    memory designs as programs (the graph and baselines), by name
Node kinds, flags and errors live in schema.py, which imports nothing of the package; the graph's helper modules
(characters, consolidate, export, index) read it through graph_view.GraphView and the search settings live in
search_config.py, so the package has no import circles, type-only ones included.
"""

from m3jax.memory.graph import GraphConfig, GraphError, MemoryGraph
from m3jax.memory.search import MemorySearcher, SearchConfig, SearchError, SearchRequest, SearchResult
from m3jax.memory.config import MemoryConfig
from m3jax.memory.embedders import make_embedder
from m3jax.memory.store import load_graph, save_graph

__all__ = ["GraphConfig", "GraphError", "MemoryConfig", "MemoryGraph", "MemorySearcher", "SearchConfig",
           "SearchError", "SearchRequest", "SearchResult", "load_graph", "make_embedder", "save_graph"]
