"""Baseline: a per-clip summary store. Each clip becomes one row, its memories (episodic, then semantic when
`semantic=True`) joined into one paragraph and cut at `max_chars`; retrieval is top-k clips by the cosine of that
one embedding. No entities, so no node route. WHY: it tests whether the graph's per-memory granularity and entity
links matter, against the common "summarise each chunk, retrieve chunks" memory."""

from __future__ import annotations

from m3jax.memory.designs import register
from m3jax.memory.designs.base import ClipPerception, DesignError, EmbedFn, TextRows


@register
class ClipSummary(TextRows):
  name = "clip_summary"

  def __init__(self, embed_fn: EmbedFn, topk: int = 2, max_chars: int = 2000, semantic: bool = True):
    super().__init__(embed_fn, topk=topk)
    self.options.update(max_chars=max_chars, semantic=semantic)
    if max_chars < 1:
      raise DesignError(f"clip_summary: max_chars must be >= 1, got {max_chars}")
    self.max_chars, self.semantic = max_chars, semantic

  def rows_for(self, clip: ClipPerception) -> list[str]:
    text = " ".join(list(clip.episodic) + (list(clip.semantic) if self.semantic else []))
    return [text[: self.max_chars]] if text else []
