"""The memory graph: struct-of-arrays columns on the host, mirrored to the device for search.

Nodes share one id counter (ids are time: a clip's nodes have larger ids than every earlier clip's). Faces and
voices live in `EntityBank`s, text (episodic and semantic) in `[T, D]` rows with clip id and flags, edges
(text <-> face/voice, undirected, stored once) in three columns. Every column doubles its capacity when full,
so inserting a clip costs amortised O(clip) and the device shapes change at most log2(size) times. Dead
edges keep their row with weight 0. Text and face crops live in a host list addressed by node id.

Views never copy: `before_clip` becomes a node-id cut plus a clip bound applied as masks, and the ablations
("no_semantic", "no_equivalence") are masks / character rules too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Literal, Sequence

import numpy as np

from m3jax.memory import characters as characters_lib
from m3jax.memory import consolidate
from m3jax.memory import export
from m3jax.memory import tags
from m3jax.memory.arrays import GrowableArray
from m3jax.memory.identity import EntityBank, IdentityError
from m3jax.memory.schema import (ABLATIONS, EPISODIC, FACE, FLAG_EQUIVALENCE, FLAG_HIDDEN, FLAG_SEMANTIC,  # noqa: F401
                                 REFERENCE_TYPE, SEMANTIC, VOICE, Ablation, GraphError)

EmbedFn = Callable[[Sequence[str]], np.ndarray]


@dataclasses.dataclass(frozen=True)
class GraphConfig:
  """Memory graph settings. `mode='reference'` reproduces the public code's voting (±2 steps, union of all
  surviving equivalences); `mode='paper'` follows the paper (±1 steps, each voice joins its best face)."""
  text_dim: int = 384
  face_dim: int = 512
  voice_dim: int = 192
  max_face_embeddings: int = 10
  max_voice_embeddings: int = 20
  face_threshold: float = 0.3
  voice_threshold: float = 0.6
  positive_threshold: float = 0.85
  negative_threshold: float = 0.0
  mode: Literal["paper", "reference"] = "paper"
  seed: int = 0
  initial_capacity: int = 64

  def __post_init__(self):
    if self.mode not in ("paper", "reference"):
      raise ValueError(f"GraphConfig.mode must be 'paper' or 'reference', got {self.mode!r}")
    for name in ("text_dim", "face_dim", "voice_dim", "max_face_embeddings", "max_voice_embeddings",
                 "initial_capacity"):
      if getattr(self, name) <= 0:
        raise ValueError(f"GraphConfig.{name} must be positive, got {getattr(self, name)}")

  @property
  def weight_step(self) -> float:
    """Reinforce/weaken step per call: the reference updates both stored directions, so +-2 per undirected edge."""
    return 2.0 if self.mode == "reference" else 1.0


class MemoryGraph:
  """Entity-centric multimodal memory of one video (see module docstring)."""

  def __init__(self, config: GraphConfig = GraphConfig()):
    c = config
    cap = c.initial_capacity
    self.config = c
    self.node_kind = GrowableArray((), np.int8, cap)
    self.node_clip = GrowableArray((), np.int32, cap, fill=-1)
    self.node_slot = GrowableArray((), np.int32, cap, fill=-1)
    self.faces = EntityBank(c.face_dim, c.max_face_embeddings, c.face_threshold)
    self.voices = EntityBank(c.voice_dim, c.max_voice_embeddings, c.voice_threshold)
    self.text_emb = GrowableArray((c.text_dim,), np.float32, cap)
    self.text_node = GrowableArray((), np.int32, cap, fill=-1)
    self.text_clip = GrowableArray((), np.int32, cap, fill=-1)
    self.text_flags = GrowableArray((), np.int8, cap)
    self.edge_text = GrowableArray((), np.int32, cap, fill=np.iinfo(np.int32).max)   # rows sorted by text
    self.edge_entity = GrowableArray((), np.int32, cap)
    self.edge_weight = GrowableArray((), np.float32, cap)
    self.contents: list[list[str]] = []
    self.text_entities: dict[int, tuple[int, ...]] = {}
    self.edge_of: dict[tuple[int, int], int] = {}
    self.entity_edges: dict[int, list[int]] = {}
    self.text_edges: dict[int, list[int]] = {}
    self.clip_texts: dict[int, list[int]] = {}
    self.equivalences: list[int] = []
    self.index = None
    self.journal: list[tuple] | None = None   # when a list, every insertion appends its replayable record
    self.version = 0
    self._cache: dict = {}
    self._max_clip: int | None = -1

  # ----------------------------------------------------------------------------------------------- basics
  @property
  def next_node_id(self) -> int:
    return self.node_kind.size

  @property
  def num_text(self) -> int:
    return self.text_emb.size

  @property
  def max_clip(self) -> int:
    """Largest clip id holding text (-1 when none); kept incrementally, O(1)."""
    if self._max_clip is None:
      self._max_clip = int(self.text_clip.valid.max()) if self.num_text else -1
    return self._max_clip

  def num_nodes(self) -> int:
    return int(np.count_nonzero(self.node_kind.valid))

  def num_edges(self) -> int:
    """Alive undirected edges (the reference stores each twice)."""
    return int(np.count_nonzero(self.edge_weight.valid > 0))

  def kind(self, node_id: int) -> int:
    return int(self.node_kind.data[node_id]) if 0 <= node_id < self.next_node_id else 0

  def text_of(self, slot: int) -> str:
    return self.contents[int(self.text_node.data[slot])][0]

  def _touch(self) -> None:
    self.version += 1
    self._cache.clear()

  def _new_node(self, kind: int, clip: int, slot: int, contents: list[str]) -> int:
    node_id = self.node_kind.append([kind])
    self.node_clip.append([clip])
    self.node_slot.append([slot])
    self.contents.append(contents)
    return node_id

  # ------------------------------------------------------------------------------------- faces / voices
  def add_faces(self, clusters: Sequence[np.ndarray], crops: Sequence[Sequence[str]] | None = None) -> list[int]:
    """Matches each face cluster `[n, face_dim]` (in order) to a face node or creates one; returns node ids."""
    return self._add_entities(FACE, self.faces, clusters, crops)

  def add_voices(self, segments: Sequence[np.ndarray] | np.ndarray, asr: Sequence[str] | None = None) -> list[int]:
    """Matches each speech segment's embedding `[voice_dim]` (in order) to a voice node; returns node ids."""
    queries = [np.asarray(s, np.float32).reshape(1, -1) for s in segments]
    texts = None if asr is None else [[a] for a in asr]
    return self._add_entities(VOICE, self.voices, queries, texts)

  def add_entity(self, kind: Literal["face", "voice"], embeddings: np.ndarray,
                 contents: Sequence[str] = ()) -> int:
    """Creates a face/voice node without matching (replaying or importing a graph whose identities are known)."""
    bank = self.faces if kind == "face" else self.voices if kind == "voice" else None
    if bank is None:
      raise GraphError(f"entity kind must be 'face' or 'voice', got {kind!r}")
    emb = np.asarray(embeddings, np.float32)
    if emb.ndim != 2 or emb.shape[1] != bank.dim or len(emb) == 0 or not np.all(np.isfinite(emb)):
      raise GraphError(f"expected finite {kind} embeddings of shape [n, {bank.dim}], got {emb.shape}")
    node_id = self.next_node_id
    self.replay_entities(FACE if kind == "face" else VOICE, [(node_id, True, emb, list(contents))])
    return node_id

  def _add_entities(self, kind: int, bank: EntityBank, queries: Sequence[np.ndarray],
                    contents: Sequence[Sequence[str]] | None) -> list[int]:
    queries = [np.asarray(q, np.float32) for q in queries]
    if contents is not None and len(contents) != len(queries):
      raise GraphError(f"{len(queries)} embedding sets but {len(contents)} content lists")
    pending: list[int] = []

    def new_node_id() -> int:
      pending.append(self.next_node_id + len(pending))
      return pending[-1]

    try:
      matches = bank.match_and_insert(queries, new_node_id, self.config.seed)
    except IdentityError as e:
      raise GraphError(str(e)) from None
    ids, outcomes = [], []
    for i, (slot, created) in enumerate(matches):
      items = list(contents[i]) if contents is not None else []
      if created:
        node_id = self._new_node(kind, -1, slot, items)
      else:
        node_id = int(bank.node.data[slot])
        self.contents[node_id].extend(items)
      ids.append(node_id)
      outcomes.append((node_id, created, queries[i], list(items)))   # a copy: `items` may grow with the node
    self._touch()
    self._record(("entities", kind, outcomes))
    return ids

  def replay_entities(self, kind: int, outcomes: Sequence[tuple[int, bool, np.ndarray, Sequence[str]]]) -> None:
    """Applies matching decisions already taken, `(node id, created, embeddings, contents)` per set in order:
    replaying a journal reproduces the graph exactly, with no similarity re-scored against a threshold."""
    bank = self.faces if kind == FACE else self.voices if kind == VOICE else None
    if bank is None:
      raise GraphError(f"entity kind must be FACE or VOICE, got {kind!r}")
    for node_id, created, emb, items in outcomes:
      if created:
        if node_id != self.next_node_id:
          raise GraphError(f"replayed entity node {node_id} but the next node id is {self.next_node_id}")
        self._new_node(kind, -1, bank.add(node_id, emb), list(items))
      else:
        if self.kind(node_id) != kind:
          raise GraphError(f"replayed update of node {node_id}, which is not a {REFERENCE_TYPE[kind]} node")
        bank.merge(int(self.node_slot.data[node_id]), emb, self.config.seed)
        self.contents[node_id].extend(items)
    self._touch()
    self._record(("entities", kind, [(n, c, e, list(items)) for n, c, e, items in outcomes]))

  def _record(self, record: tuple) -> None:
    if self.journal is not None:
      self.journal.append(record)

  # ---------------------------------------------------------------------------------------------- text
  def entity_ids(self, text: str, expand_characters: bool = True) -> list[int]:
    """Node ids of the people a text names (whole tags; `<character_k>` expands to its members)."""
    out: list[int] = []
    chars = None
    for kind, k in tags.parse_entities(text):
      if kind == "face" and self.kind(k) == FACE or kind == "voice" and self.kind(k) == VOICE:
        out.append(k)
      elif kind == "character" and expand_characters:
        chars = chars or self.characters()
        for member in chars.mappings.get(f"character_{k}", []):
          out.append(int(member.split("_")[1]))
    return out

  def add_clip(self, clip_id: int, episodic: Sequence[str], semantic: Sequence[str],
               embed_fn: EmbedFn | None = None, episodic_emb: np.ndarray | None = None,
               semantic_emb: np.ndarray | None = None) -> list[int]:
    """Inserts one clip's memories: episodic nodes first, then semantic ones through consolidation.

    Embeddings are either given (`[n, text_dim]` unit rows) or computed with `embed_fn` in one call.
    Returns the ids of the text nodes created (reinforcing statements create none).
    """
    if not isinstance(clip_id, (int, np.integer)) or clip_id < 0:
      raise GraphError(f"clip id must be a non-negative int, got {clip_id!r}")
    if clip_id < self.max_clip:
      raise GraphError(f"clip {clip_id} inserted after clip {self.max_clip}: node ids are time, insert clips in "
                       "ascending order")
    for s in list(episodic) + list(semantic):
      if not isinstance(s, str):
        raise GraphError(f"memories must be strings, got {type(s).__name__}")
    if episodic_emb is None or semantic_emb is None:
      if embed_fn is None:
        raise GraphError("add_clip needs embeddings or an embed_fn")
      emb = self._check_emb(embed_fn(list(episodic) + list(semantic)), len(episodic) + len(semantic))
      episodic_emb, semantic_emb = emb[: len(episodic)], emb[len(episodic):]
    episodic_emb = self._check_emb(episodic_emb, len(episodic))
    semantic_emb = self._check_emb(semantic_emb, len(semantic))
    clip_id = int(clip_id)
    created: list[int] = []
    first_slot = self.num_text
    for s, e in zip(episodic, episodic_emb):
      created.append(self._add_text(EPISODIC, s, e, clip_id, self.entity_ids(s)))
    for s, e in zip(semantic, semantic_emb):
      node = consolidate.insert_semantic(self, s, e, clip_id, self.entity_ids(s))
      if node is not None:
        created.append(node)
    self._touch()
    if self.index is not None and self.num_text > first_slot:
      rows = np.arange(first_slot, self.num_text)
      self.index.upsert(rows, self.text_emb.data[rows])
    self._record(("clip", clip_id, list(episodic), list(semantic), episodic_emb, semantic_emb))
    return created

  def _check_emb(self, emb: np.ndarray, n: int) -> np.ndarray:
    emb = np.asarray(emb, np.float32)
    if n == 0 and emb.size == 0:
      return np.zeros((0, self.config.text_dim), np.float32)
    if emb.shape != (n, self.config.text_dim):
      raise GraphError(f"expected text embeddings of shape ({n}, {self.config.text_dim}), got {emb.shape}")
    if not np.all(np.isfinite(emb)):
      raise GraphError("text embeddings contain NaN or inf")
    return emb

  def _add_text(self, kind: int, text: str, emb: np.ndarray, clip: int, entities: Sequence[int]) -> int:
    node_id = self._new_node(kind, clip, self.num_text, [text])
    slot = self.append_text_row(kind, text, emb, clip, node_id, entities)
    for e in dict.fromkeys(entities):
      self.set_edge(slot, e, 1.0)
    return node_id

  def append_text_row(self, kind: int, text: str, emb: np.ndarray, clip: int, node_id: int,
                      entities: Sequence[int]) -> int:
    """Appends the text-bank row of node `node_id` (no edges); returns its slot."""
    slot = self.text_emb.append(emb[None])
    flags = (FLAG_SEMANTIC if kind == SEMANTIC else 0) | (FLAG_HIDDEN if tags.is_hidden(text) else 0) | \
        (FLAG_EQUIVALENCE if kind == SEMANTIC and tags.is_equivalence(text) else 0)
    self.text_node.append([node_id])
    self.text_clip.append([clip])
    self.text_flags.append([flags])
    self._max_clip = max(self.max_clip, clip)
    self.text_entities[slot] = tuple(entities)
    self.clip_texts.setdefault(clip, []).append(slot)
    if flags & FLAG_EQUIVALENCE:
      self.equivalences.append(slot)
    return slot

  def set_edge(self, slot: int, entity: int, weight: float) -> None:
    """Sets (overwrites, as the reference's add_edge) the weight of the text-entity edge.

    New edges must come in text-row order (they are created with their text), so edge rows stay sorted by text
    row, which lets the search kernel use sorted segment reductions.
    """
    row = self.edge_of.get((slot, entity))
    if row is None:
      if self.edge_text.size and slot < self.edge_text.data[self.edge_text.size - 1]:
        raise GraphError(f"new edge for text row {slot} after edges of later rows: edges must follow text order")
      row = self.edge_text.append([slot])
      self.edge_entity.append([entity])
      self.edge_weight.append([weight])
      self.edge_of[(slot, entity)] = row
      self.entity_edges.setdefault(entity, []).append(row)
      self.text_edges.setdefault(slot, []).append(row)
    else:
      self.edge_weight.set(row, weight)

  def bump_text_edges(self, slot: int, delta: float) -> None:
    """Adds `delta` to every alive edge of a text node; edges reaching <= 0 die (weight 0)."""
    rows = [r for r in self.text_edges.get(slot, []) if self.edge_weight.data[r] > 0]
    if rows:
      w = self.edge_weight.data[rows] + delta
      self.edge_weight.set(rows, np.where(w > 0, w, 0.0))

  # ------------------------------------------------------------------------------------------- views
  def cut_for(self, before_clip: int | None) -> int:
    """Node-id bound of the `before_clip` view: nodes with id <= cut are visible.

    As the reference's truncation: the last text node of clip `before_clip`; no truncation if that clip has
    no text node.
    """
    if before_clip is None:
      return self.next_node_id
    key = ("cut", before_clip)
    if key not in self._cache:
      slots = self.clip_texts.get(int(before_clip), [])
      self._cache[key] = int(self.text_node.data[slots[-1]]) if slots else self.next_node_id
    return self._cache[key]

  def characters(self, before_clip: int | None = None, ablation: Ablation = "none",
                 mode: str | None = None) -> characters_lib.CharacterMap:
    """Characters of the view (cached until the graph changes)."""
    if ablation not in ABLATIONS:
      raise GraphError(f"unknown ablation {ablation!r}; expected one of {ABLATIONS}")
    mode = mode or self.config.mode
    key = ("chars", self.cut_for(before_clip), ablation, mode)
    if key not in self._cache:
      self._cache[key] = characters_lib.build(self, self.cut_for(before_clip), mode, ablation)
    return self._cache[key]

  def clip_memories(self, clip: int, cut: int, episodic_only: bool = False) -> list[int]:
    """Text slots of a clip visible under `cut`, in insertion order."""
    return [s for s in self.clip_texts.get(clip, []) if self.text_node.data[s] <= cut and
            not (episodic_only and self.text_flags.data[s] & FLAG_SEMANTIC)]

  # ------------------------------------------------------------------------------------- export
  # (persistence: m3jax.memory.store.save_graph / load_graph, and reference_pickle.load_reference_pickle)
  def to_json(self, before_clip: int | None = None) -> dict:
    return export.to_json(self, before_clip)
