"""The memory service; /ask answers with the shipped trained controller (answerer=retrieval: the rule baseline).

  python serve.py --config configs/serve.py add-key alice          # prints a new key once; stores its hash
  python serve.py --config configs/serve.py --set port=8765        # serves on 127.0.0.1:8765

The graph, memorization and search settings are ServeConfig's defaults: the graph calibrated for the embedded
perception models and the search `m3jax ask` uses (m3jax.control.answer.ASK_SEARCH), so the service and the CLI
retrieve alike.
"""

from m3jax.serve.config import ServeConfig


def get_config() -> ServeConfig:
  return ServeConfig(host="127.0.0.1", port=8765, data_dir="serve_data", keys_file="serve_data/keys.txt",
                     embedder="minilm", answerer="trained", max_batch=64, max_wait_ms=5.0,
                     warmup_lengths=(16, 24, 32))
