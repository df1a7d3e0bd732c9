"""The memory service (retrieval answers until an LLM is chosen with answerer=controller).

  python serve.py --config configs/serve.py add-key alice          # prints a new key once; stores its hash
  python serve.py --config configs/serve.py --set port=8765        # serves on 127.0.0.1:8765
"""

from m3jax.memory.graph import GraphConfig
from m3jax.memory.search import SearchConfig
from m3jax.serve.config import ServeConfig


def get_config() -> ServeConfig:
  return ServeConfig(host="127.0.0.1", port=8765, data_dir="serve_data", keys_file="serve_data/keys.txt",
                     embedder="minilm", answerer="retrieval", max_batch=64, max_wait_ms=5.0,
                     warmup_lengths=(16, 24, 32),
                     graph=GraphConfig(text_dim=384, mode="paper"),
                     search=SearchConfig(clip_topk=2, node_topk=20, threshold=0.5, backend="exact"))
