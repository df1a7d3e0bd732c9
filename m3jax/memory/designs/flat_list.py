"""Baseline: a flat episodic list. Every episodic memory is one row; retrieval is plain top-k cosine over all rows
before the question's clip. No entities (face/voice tags stay raw text, so there are no characters and no node
route), no semantic memory, no consolidation."""

from __future__ import annotations

from m3jax.memory.designs import register
from m3jax.memory.designs.base import ClipPerception, TextRows


@register
class FlatList(TextRows):
  name = "flat_list"

  def rows_for(self, clip: ClipPerception) -> list[str]:
    return list(clip.episodic)
