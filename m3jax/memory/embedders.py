"""The one text-embedder factory: memories are written and searched with the embedder named here.

A graph's text vectors are only comparable with queries embedded by the same model, so every entry point (ask,
serve, memorize, eval, RL, the benchmarks) asks this factory by name instead of building its own: the name is
what a config, a manifest or a flag records.
"""

from __future__ import annotations

EMBEDDERS = ("minilm", "hashed")


def make_embedder(name: str = "minilm", dim: int | None = None):
  """`minilm` -> the MiniLM sentence embedder (the memorizer's); `hashed` -> the fixture graphs' hashed
  bag-of-words embedder (built in; `dim` overrides its width); a path to a `*.embedder.json` spec -> that hashed
  embedder."""
  if name == "minilm":
    from m3jax.models.bert import TextEmbedder
    return TextEmbedder.from_pretrained()
  from m3jax.memory.fixture_embedder import HashedBowEmbedder
  if name == "hashed":
    return HashedBowEmbedder.builtin() if dim is None else HashedBowEmbedder.builtin(dim=dim)
  if str(name).endswith(".json"):
    return HashedBowEmbedder.from_json(name)
  raise ValueError(f"embedder must be {', '.join(EMBEDDERS)} or a path to a *.embedder.json spec, got {name!r}")
