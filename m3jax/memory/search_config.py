"""The search tools' settings (`search_clip` / `search_node`): top-k, threshold, aggregation, backend.

Its own module so the retrieval backends (`index.py`) read it without importing the searcher that calls them.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from m3jax.memory.schema import ABLATIONS


@dataclasses.dataclass(frozen=True)
class SearchConfig:
  clip_topk: int = 2
  node_topk: int = 20
  threshold: float = 0.5
  # Node-route queries are ranked together with the question they serve (SearchRequest.context). WHY: the
  # controller's node searches are id lookups ("What is the character id of Emily"), whose top 20 memories are
  # the person's, in no relation to what was asked; ranked with the question, they hold the answer more often.
  node_context: bool = False
  clip_mode: Literal["max", "mean", "sum"] = "max"
  exclusion: Literal["backfill", "reference"] = "backfill"
  ablation: Literal["none", "no_semantic", "no_equivalence"] = "none"
  max_variants: int = 100
  backend: Literal["exact", "scann", "auto"] = "exact"
  scann_min_texts: int = 100_000
  scann_candidates: int = 512
  tpu_approx_topk: bool = True        # node route uses jax.lax.approx_max_k when running on TPU
  seed: int = 0
  embed_cache_size: int = 65536

  def __post_init__(self):
    if self.clip_mode not in ("max", "mean", "sum"):
      raise ValueError(f"SearchConfig.clip_mode must be max/mean/sum, got {self.clip_mode!r}")
    if self.exclusion not in ("backfill", "reference"):
      raise ValueError(f"SearchConfig.exclusion must be backfill/reference, got {self.exclusion!r}")
    if self.ablation not in ABLATIONS:
      raise ValueError(f"SearchConfig.ablation must be one of {ABLATIONS}, got {self.ablation!r}")
    if self.backend not in ("exact", "scann", "auto"):
      raise ValueError(f"SearchConfig.backend must be exact/scann/auto, got {self.backend!r}")
    if self.clip_topk <= 0 or self.node_topk <= 0 or self.max_variants <= 0:
      raise ValueError("SearchConfig top-k and max_variants must be positive")
