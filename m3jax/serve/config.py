"""Settings of the memory service (`python serve.py --config configs/serve.py --set port=9000`)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from m3jax.control.answer import ASK_SEARCH
from m3jax.memorize.pipeline import MemorizeConfig, default_graph_config
from m3jax.memory.graph import GraphConfig
from m3jax.memory.search import SearchConfig


@dataclasses.dataclass(frozen=True)
class ServeConfig:
  host: str = "127.0.0.1"
  port: int = 8765
  data_dir: str = "serve_data"            # spaces, SQLite metadata, uploads
  keys_file: str = ""                     # lines `tenant:sha256hex` (written by `serve.py add-key`)
  keys_env: str = "M3JAX_SERVE_KEYS"      # same format, comma separated; merged with the file
  embedder: str = "minilm"                # minilm | hashed (bag-of-words; tests) | a fixture `*.embedder.json`
  # trained: llm + the shipped controller LoRA adapter (or `adapter`); retrieval: the deterministic rule answerer
  # (a baseline, no LLM loaded); controller: the llm as prompted
  answerer: Literal["retrieval", "controller", "trained"] = "trained"
  llm: str = "smollm2-135m-instruct"
  adapter: str = ""                       # answerer=trained: a LoRA adapter file ("" = the shipped one)
  max_new_tokens: int = 192
  max_rounds: int = 5
  max_batch: int = 64                     # questions per answering batch (joining: per hand-over)
  slots: int = 16                         # KV-cache rows a batch's questions share (continuous batching; 0 = the
                                          # whole batch as one static batch)
  # a question asked while others are being answered joins them in a free KV-cache row at once instead of waiting
  # for their batch to end (needs slots > 0). Off by default: it has not measured faster at low concurrency
  # (bench/serve_joining.py, Intel Xeon, 16 questions 2 s apart, 8 slots: mean latency 10.9 s either way, p95
  # 17.7 s vs 15.9 s static, load 1.7, since a joined call decodes only its fed rows; before that 36.4 s vs 19.8 s
  # at load 3.9); it won at 8 questions 1 s apart, 4 slots (34.6 s vs 50.2 s)
  join_running: bool = False
  max_wait_ms: float = 5.0                # static batches: how long the first queued question waits for company
  max_questions_per_request: int = 256
  max_upload_mb: float = 512.0
  max_body_kb: int = 1024                 # JSON bodies
  max_memories_per_clip: int = 512
  allowed_dirs: tuple[str, ...] = ()      # local videos may be ingested only from under these directories
  snapshot_every: int = 64                # clips between graph snapshots (the SQLite clip log covers the rest)
  job_yield_ms: float = 200.0             # an ingest job waits up to this long for queued questions to drain
  warmup_lengths: tuple[int, ...] = ()    # question token lengths whose embedder shapes (every batch bucket) are
                                          # compiled in the background at start-up; /healthz says `warm` when done
  # one graph config for every space; video spaces memorize with `memorize` (its writer included) on this graph,
  # so it is calibrated for the embedded perception models (m3jax.memorize.pipeline.default_graph_config)
  graph: GraphConfig = dataclasses.field(default_factory=default_graph_config)
  memorize: MemorizeConfig = MemorizeConfig()
  search: SearchConfig = ASK_SEARCH         # the retrieval `m3jax ask` uses (m3jax.control.answer), not a copy

  @property
  def memorize_config(self) -> MemorizeConfig:
    """What ingestion jobs run: `memorize` on the service's `graph`."""
    return dataclasses.replace(self.memorize, graph=self.graph)

  def __post_init__(self):
    if not 0 < self.port < 65536:
      raise ValueError(f"ServeConfig.port must be in 1..65535, got {self.port}")
    if self.embedder not in ("minilm", "hashed") and not self.embedder.endswith(".embedder.json"):
      raise ValueError(f"ServeConfig.embedder must be minilm, hashed or a *.embedder.json, got {self.embedder!r}")
    if self.answerer not in ("trained", "controller", "retrieval"):
      raise ValueError(f"ServeConfig.answerer must be trained/controller/retrieval, got {self.answerer!r}")
    if self.join_running and not self.slots:
      raise ValueError("ServeConfig.join_running needs slots > 0 (joined questions take free KV-cache rows)")
    if self.max_batch < 1 or self.max_wait_ms < 0 or self.max_questions_per_request < 1 or self.slots < 0:
      raise ValueError("ServeConfig.max_batch/max_questions_per_request must be >= 1, max_wait_ms and slots >= 0")
    if self.max_upload_mb <= 0 or self.max_body_kb <= 0 or self.snapshot_every < 1:
      raise ValueError("ServeConfig.max_upload_mb/max_body_kb/snapshot_every must be positive")
    if any(n < 1 for n in self.warmup_lengths):
      raise ValueError(f"ServeConfig.warmup_lengths must be positive token counts, got {self.warmup_lengths}")
    if self.embedder == "minilm" and self.graph.text_dim != 384:
      raise ValueError(f"the minilm embedder gives 384-d vectors; graph.text_dim is {self.graph.text_dim}")
