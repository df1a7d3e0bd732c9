"""What the memory graph's columns hold: node kinds, text flags, the ablation names, and its errors.

The bottom of `m3jax.memory`: the graph, its persistence, export, consolidation, character building and the
search kernel all read these, and this module reads none of them, so no module of the package needs another only
for a constant.
"""

from typing import Literal

FACE, VOICE, EPISODIC, SEMANTIC = 1, 2, 3, 4  # node kinds
REFERENCE_TYPE = {FACE: "img", VOICE: "voice", EPISODIC: "episodic", SEMANTIC: "semantic"}  # the reference's names
FLAG_SEMANTIC, FLAG_HIDDEN, FLAG_EQUIVALENCE = 1, 2, 4  # text-row flags (bits)
Ablation = Literal["none", "no_semantic", "no_equivalence"]
ABLATIONS = ("none", "no_semantic", "no_equivalence")


class GraphError(ValueError):
  """Invalid input to the memory graph (nothing stored is changed when this is raised)."""


class GraphFormatError(GraphError):
  """A saved graph that cannot be read (newer format, missing or damaged files)."""
