"""The interface a memory design implements, and the searcher that puts any list of designs behind the
controller's search tools.

WHY an interface: the paper's M3 graph is one answer to "what should a long-running agent remember and how should
it find it again"; an ablation that swaps the memory must keep everything else (controller, prompts, judge,
questions) fixed. A design sees each clip once (`update`), answers the two search tools (`retrieve`: the clip
route returns whole clips, the node route the memories linked to the people a query names), and persists itself
(`save` / `load`). A design that has no entities cannot answer the node route; it says so in `routes`, and the
searcher answers such a request with the empty result (and counts it) instead of failing, so a table can report it.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import pathlib
from typing import Any, Callable, ClassVar, Sequence

import numpy as np

from m3jax.memory.search import SearchRequest, SearchResult, format_result

EmbedFn = Callable[[Sequence[str]], np.ndarray]
MANIFEST = "design.json"


class DesignError(ValueError):
  """An unknown design, a bad option, or a saved design that cannot be read."""


@dataclasses.dataclass(frozen=True)
class ClipPerception:
  """One clip as a memory sees it: the people first perceived in it (`new_entities`, ("face" | "voice",
  embeddings `[n, dim]`) in order; a design with entities creates them before the clip's text, so their node ids
  are the ones the text's `<face_k>` / `<voice_k>` tags use) and the episodic and semantic memories written for it."""
  clip_id: int
  episodic: tuple[str, ...]
  semantic: tuple[str, ...] = ()
  new_entities: tuple[tuple[str, np.ndarray], ...] = ()


class MemoryDesign(abc.ABC):
  """A memory program. Subclasses set `name` (the registry key) and `routes` (the search tools they answer)."""
  name: ClassVar[str]
  routes: ClassVar[tuple[str, ...]] = ("clip", "node")

  def __init__(self, embed_fn: EmbedFn, **options: Any):
    self.embed_fn = embed_fn
    self.options = options

  @abc.abstractmethod
  def update(self, clip: ClipPerception) -> None:
    """Memorizes one clip (clips arrive in ascending id)."""

  @abc.abstractmethod
  def retrieve(self, query: str, route: str = "clip", before_clip: int | None = None,
               exclude_clips: Sequence[int] = ()) -> SearchResult:
    """The search tool's answer for `query` over the memory as it stood after clip `before_clip`."""

  def save(self, path: str | pathlib.Path) -> None:
    """Writes `design.json` (name, options) and the design's own state (`save_state`) under `path`."""
    path = pathlib.Path(path)
    path.mkdir(parents=True, exist_ok=True)
    self.save_state(path)
    (path / MANIFEST).write_text(json.dumps({"design": self.name, "options": self.options}))

  @abc.abstractmethod
  def save_state(self, path: pathlib.Path) -> None:
    ...

  @abc.abstractmethod
  def load_state(self, path: pathlib.Path) -> None:
    ...

  @classmethod
  def batch_searcher(cls, designs: Sequence["MemoryDesign"]):
    """A searcher answering requests over all `designs` at once (None: `retrieve` one request at a time)."""
    return None


class TextRows(MemoryDesign):
  """Shared state of the baselines: text rows with their clip id and unit embeddings, top-k by cosine, grouped by
  clip in the reference's `Searched knowledge` format. Subclasses decide what a row is (`rows_for`)."""
  routes = ("clip",)

  def __init__(self, embed_fn: EmbedFn, topk: int = 10):
    super().__init__(embed_fn, topk=topk)
    if topk < 1:
      raise DesignError(f"{self.name}: topk must be >= 1, got {topk}")
    self.topk = topk
    self.texts: list[str] = []
    self.clips: list[int] = []
    self.emb = np.zeros((0, 0), np.float32)

  @abc.abstractmethod
  def rows_for(self, clip: ClipPerception) -> list[str]:
    ...

  def update(self, clip: ClipPerception) -> None:
    rows = self.rows_for(clip)
    if self.clips and clip.clip_id < self.clips[-1]:
      raise DesignError(f"{self.name}: clip {clip.clip_id} after clip {self.clips[-1]} (insert in ascending order)")
    if not rows:
      return
    emb = np.asarray(self.embed_fn(rows), np.float32)
    self.emb = emb if not self.texts else np.concatenate([self.emb, emb])
    self.texts += rows
    self.clips += [int(clip.clip_id)] * len(rows)

  def retrieve(self, query: str, route: str = "clip", before_clip: int | None = None,
               exclude_clips: Sequence[int] = ()) -> SearchResult:
    clips = np.asarray(self.clips, np.int64)
    keep = ~np.isin(clips, list(exclude_clips))
    if before_clip is not None:
      keep &= clips <= before_clip
    if not self.texts or not keep.any():
      return SearchResult(format_result({}), [], {})
    scores = np.where(keep, self.emb @ np.asarray(self.embed_fn([query]), np.float32)[0], -np.inf)
    top = [int(i) for i in np.argsort(-scores, kind="stable")[: self.topk] if keep[i]]
    memories: dict[str, list[str]] = {}
    for i in sorted(top, key=lambda i: (self.clips[i], i)):
      memories.setdefault(f"CLIP_{self.clips[i]}", []).append(self.texts[i])
    return SearchResult(format_result(memories), sorted({self.clips[i] for i in top}), memories)

  def save_state(self, path: pathlib.Path) -> None:
    np.save(path / "emb.npy", self.emb)
    (path / "rows.json").write_text(json.dumps({"texts": self.texts, "clips": self.clips}, ensure_ascii=False))

  def load_state(self, path: pathlib.Path) -> None:
    rows = json.loads((path / "rows.json").read_text())
    self.texts, self.clips = list(rows["texts"]), [int(c) for c in rows["clips"]]
    self.emb = np.load(path / "emb.npy", allow_pickle=False)
    if len(self.emb) != len(self.texts):
      raise DesignError(f"saved {self.name} design at {path} is damaged: {len(self.emb)} embeddings for "
                        f"{len(self.texts)} rows")


class DesignSearcher:
  """The controller's `Searcher` over a list of designs (`graph_index` = position in the list). Requests a design
  cannot answer (its `routes` lack the route) get the empty result and are counted in `unsupported`."""

  def __init__(self, designs: Sequence[MemoryDesign]):
    self.designs = list(designs)
    self.requests = {"clip": 0, "node": 0}
    self.unsupported = {"clip": 0, "node": 0}
    kinds = {type(d) for d in self.designs}
    self.batch = next(iter(kinds)).batch_searcher(self.designs) if len(kinds) == 1 else None

  def search(self, requests: Sequence[SearchRequest]) -> list[SearchResult]:
    out: list[SearchResult | None] = [None] * len(requests)
    batched = []
    for i, r in enumerate(requests):
      self.requests[r.route] = self.requests.get(r.route, 0) + 1
      design = self.designs[r.graph_index]
      if r.route not in design.routes:
        self.unsupported[r.route] = self.unsupported.get(r.route, 0) + 1
        out[i] = SearchResult(format_result({}), [], {})
      elif self.batch is not None:
        batched.append(i)
      else:
        out[i] = design.retrieve(r.query, r.route, r.before_clip, r.exclude_clips)
    if batched:
      for i, result in zip(batched, self.batch.search([requests[i] for i in batched])):
        out[i] = result
    return out
