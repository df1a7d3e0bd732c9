"""Retrieval benchmark: m3jax memory search vs a per-query Python/numpy port of the reference, side by side.

  python -m bench.retrieval [--n-large 1000000] [--questions 256]

(1) 256 questions over the medium fixture graph: the reference algorithm per query (a) re-loading the pickle,
    truncating and refreshing characters for every search as the reference control loop does, (b) with the
    graph (and its truncated views) kept in memory; vs m3jax answering all 256 in one batched search call.
(2) Scale: N clustered 384-d unit vectors (embedding-like, not i.i.d.): ScaNN recall@10 against exact search and
    its query throughput vs exact numpy (matmul + argpartition).
(3) Insertion: one clip (30 memories, 3 people) into an N-text graph vs a 1k-text graph (graph update + device
    sync; inserts alternate between the graphs; the ratio uses the 20th percentile of 55 timed inserts, robust to
    preemption on a shared machine, and the median is printed too; the ScaNN upsert is timed separately).
Final line: RESULT reload_ratio=... inmemory_ratio=... scann_recall10=... scann_speedup=... insert_cost_1m_over_1k=...
"""

from __future__ import annotations

import argparse
import copy
import gc
import pathlib
import time

import numpy as np

from m3jax.memory import GraphConfig, MemoryGraph, MemorySearcher, SearchRequest
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.graph import EPISODIC, FACE, FLAG_SEMANTIC, SEMANTIC
from m3jax.memory.index import ScannIndex
from m3jax.memory.store import from_columns
from m3jax.memory.reference_pickle import load_reference_pickle
from tests import reference_search as rs  # the reference oracle
from bench.harness import machine, result_line

TESTS = pathlib.Path(__file__).resolve().parents[1] / "tests"
FIX = TESTS / "fixtures" / "official_graphs"


def questions(n: int) -> list[dict]:
  """The 22 medium fixture queries, then distinct rephrasings ("... again, take k") up to n."""
  base = rs.fixture_queries(FIX / "medium.queries.json")
  out = []
  for i in range(n):
    q = dict(base[i % len(base)])
    if i >= len(base):
      q["query"] = f"{q['query']} again, take {i // len(base)}"
    out.append(q)
  return out


class TableEmbedder:
  """The fixture embedder behind a lookup table filled before timing, shared by both sides, so that the timings
  compare search, not the (pure-Python, stand-in) embedder. Unknown texts are embedded on the fly."""

  def __init__(self, texts):
    self.base = HashedBowEmbedder.from_json(FIX / "medium.embedder.json")
    self.table = dict(zip(texts, self.base(list(texts))))

  def __call__(self, texts):
    return np.stack([self.table[t] if t in self.table else self.base([t])[0] for t in texts])


def bench_medium(n_q: int) -> tuple[float, float]:
  qs = questions(n_q)
  path = FIX / "medium.pkl"
  graph = load_reference_pickle(path)
  from m3jax.memory import tags
  variants = {v for q in qs for bc in (q["before_clip"],) for v in
              tags.back_translate(q["query"], graph.characters(bc).mappings)}
  emb = TableEmbedder(sorted(variants))

  reqs = [SearchRequest(0, q["query"], q["route"], q["before_clip"], tuple(q["search_kwargs"]["current_clips"]))
          for q in qs]
  t = time.perf_counter()
  MemorySearcher([graph], emb).search(reqs)
  t_first = time.perf_counter() - t
  # rounds interleave the three contenders so that load drift on a shared machine hits them alike
  rounds = []
  for _ in range(3):
    t = time.perf_counter()
    ref_reload = [rs.answer(path, q["query"], q["route"], q["before_clip"],
                            list(q["search_kwargs"]["current_clips"]), emb) for q in qs]
    t_reload = time.perf_counter() - t
    t_mem = _reference_in_memory(path, qs, emb)
    times = []
    for _ in range(5):                      # fresh searcher each time: its caches start empty
      t = time.perf_counter()
      ours = MemorySearcher([graph], emb).search(reqs)
      times.append(time.perf_counter() - t)
    rounds.append((t_reload, t_mem, float(np.median(times))))
  t_reload, t_mem, t_ours = (float(np.median(x)) for x in zip(*rounds))
  from m3jax.memory.search import SearchConfig
  ours_ref_excl = MemorySearcher([graph], emb, SearchConfig(exclusion="reference")).search(reqs)
  agree = sum(a.text == b for a, b in zip(ours_ref_excl, ref_reload))
  print(f"[medium] {n_q} questions (embeddings from a shared lookup table), medians of 3 interleaved rounds: "
        f"reference reload {t_reload:.3f}s, reference in-memory {t_mem:.3f}s, m3jax batched {t_ours * 1e3:.1f}ms "
        f"(first call incl. compile {t_first:.2f}s); identical answers {agree}/{n_q} (m3jax with "
        f"exclusion='reference'); answers changed by backfill {sum(a.text != b for a, b in zip(ours, ref_reload))}")
  return (float(np.median([r[0] / r[2] for r in rounds])), float(np.median([r[1] / r[2] for r in rounds])))


def _reference_in_memory(path, qs, emb) -> float:
  """The reference algorithm with the graph loaded once and each truncated view built once and kept."""
  t = time.perf_counter()
  base = rs.load(path)
  views: dict = {}
  for q in qs:
    bc = q["before_clip"]
    if bc not in views:
      views[bc] = copy.deepcopy(base)
      if bc is not None:
        rs.truncate(views[bc], bc)
      rs.refresh_equivalences(views[bc])
    g = views[bc]
    if q["route"] == "node":
      mem = rs.search(g, q["query"], [], emb, topk=20, mem_wise=True, before_clip=bc)
    else:
      mem = rs.search(g, q["query"], list(q["search_kwargs"]["current_clips"]), emb, topk=2, mode="max",
                      threshold=0.5, before_clip=bc)
    rs.format_result(mem)
  return time.perf_counter() - t


def clustered(n: int, d: int, n_clusters: int, rng: np.random.Generator, centers=None) -> np.ndarray:
  if centers is None:
    centers = rng.standard_normal((n_clusters, d), dtype=np.float32)
  out = np.empty((n, d), np.float32)
  step = 100_000
  for s in range(0, n, step):
    m = min(step, n - s)
    x = centers[rng.integers(0, len(centers), m)] + 0.9 * rng.standard_normal((m, d), dtype=np.float32)
    out[s : s + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
  return out


def bench_scann(db: np.ndarray, queries: np.ndarray) -> tuple[float, float, ScannIndex]:
  t = time.perf_counter()
  truth = np.empty((len(queries), 10), np.int64)
  for s in range(0, len(queries), 50):
    sc = queries[s : s + 50] @ db.T
    top = np.argpartition(-sc, 10, axis=1)[:, :10]
    truth[s : s + 50] = np.take_along_axis(top, np.argsort(-np.take_along_axis(sc, top, 1), 1), 1)
  t_exact = (time.perf_counter() - t) / len(queries)
  t = time.perf_counter()
  index = ScannIndex.build(db, num_neighbors=10)       # sqrt(N) leaves, 1/8 searched, reorder 300
  t_build = time.perf_counter() - t
  index.search(queries[:10], 10)
  t = time.perf_counter()
  for _ in range(3):
    _, ids = index.search(queries, 10)
  t_scann = (time.perf_counter() - t) / (3 * len(queries))
  recall = float(np.mean([len(set(a) & set(b)) / 10 for a, b in zip(ids, truth)]))
  print(f"[scann] {len(db)} x {db.shape[1]}: build {t_build:.1f}s, recall@10 {recall:.4f}, "
        f"exact numpy {len(queries) / (t_exact * len(queries)):.0f} q/s, ScaNN {1 / t_scann:.0f} q/s")
  return recall, t_exact / t_scann, index


def bulk_graph(vectors: np.ndarray, n_people: int, rng: np.random.Generator) -> MemoryGraph:
  """A graph of len(vectors) text nodes (30 per clip, 10 % naming one of n_people faces), built from columns."""
  n, d = vectors.shape
  cfg = GraphConfig(text_dim=d, face_dim=8, voice_dim=8)
  kinds = np.concatenate([np.full(n_people, FACE, np.int8), np.where(np.arange(n) % 3 == 2, SEMANTIC, EPISODIC)])
  clip = np.arange(n, dtype=np.int32) // 30
  faces = rng.standard_normal((n_people, 8)).astype(np.float32)
  face_emb = np.zeros((n_people, 10, 8), np.float32)
  face_emb[:, 0] = faces / np.linalg.norm(faces, axis=1, keepdims=True)
  linked = np.nonzero(rng.random(n) < 0.1)[0]
  who = rng.integers(0, n_people, len(linked))
  flags = np.where(kinds[n_people:] == SEMANTIC, FLAG_SEMANTIC, 0).astype(np.int8)
  columns = {
      "node_kind": kinds, "node_clip": np.concatenate([np.full(n_people, -1), clip]).astype(np.int32),
      "node_slot": np.concatenate([np.arange(n_people), np.arange(n)]).astype(np.int32),
      "text_emb": vectors, "text_node": np.arange(n_people, n_people + n, dtype=np.int32), "text_clip": clip,
      "text_flags": flags, "edge_text": linked.astype(np.int32), "edge_entity": who.astype(np.int32),
      "edge_weight": np.ones(len(linked), np.float32),
      "face_emb": face_emb, "face_count": np.ones(n_people, np.int32),
      "face_node": np.arange(n_people, dtype=np.int32), "face_updates": np.zeros(n_people, np.int32),
      "voice_emb": np.zeros((0, 20, 8), np.float32), "voice_count": np.zeros(0, np.int32),
      "voice_node": np.zeros(0, np.int32), "voice_updates": np.zeros(0, np.int32)}
  entities = [[] for _ in range(n)]
  for s, p in zip(linked.tolist(), who.tolist()):
    entities[s] = [p]
  contents = [[] for _ in range(n_people)] + [[f"memory {i}"] for i in range(n)]
  clip_texts: dict[int, list[int]] = {}
  for c, s in zip(clip.tolist(), range(n)):
    clip_texts.setdefault(c, []).append(s)
  return from_columns(cfg, columns, contents, entities, clip_texts)


def insert_costs(graphs: list[MemoryGraph], rng: np.random.Generator, reps: int = 60) -> list[tuple[float, float]]:
  """(20th percentile, median) seconds to insert one clip (20 episodic + 10 semantic, 3 people) and sync the
  device columns, per graph. Inserts alternate between the graphs so that load on a shared machine hits them
  alike; the low percentile is the robust estimate of the cost when other processes preempt this one."""
  times: list[list[float]] = [[] for _ in graphs]
  for g in graphs:
    for c in _device_columns(g):
      c.device()
  for r in range(reps):
    for g, out in zip(graphs, times):
      d = g.config.text_dim
      clip = g.max_clip + 1
      epi = [f"<face_{i % 3}> does step {i} of clip {clip}" for i in range(20)]
      sem = [f"<face_{i % 3}> likes thing {i} seen in clip {clip}" for i in range(10)]
      e = rng.standard_normal((30, d)).astype(np.float32)
      e /= np.linalg.norm(e, axis=1, keepdims=True)
      t = time.perf_counter()
      g.add_clip(clip, epi, sem, episodic_emb=e[:20], semantic_emb=e[20:])
      for c in _device_columns(g):
        c.device().block_until_ready()
      out.append(time.perf_counter() - t)
  return [(float(np.percentile(t[5:], 20)), float(np.median(t[5:]))) for t in times]   # first: compiles


def _device_columns(g: MemoryGraph):
  return (g.text_emb, g.text_clip, g.text_node, g.text_flags, g.edge_text, g.edge_entity, g.edge_weight)


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("--questions", type=int, default=256)
  ap.add_argument("--n-large", type=int, default=1_000_000)
  ap.add_argument("--n-queries", type=int, default=200)
  args = ap.parse_args()
  print(machine(), flush=True)
  reload_ratio, inmemory_ratio = bench_medium(args.questions)

  rng = np.random.default_rng(0)
  centers = rng.standard_normal((2000, 384), dtype=np.float32)
  t = time.perf_counter()
  db = clustered(args.n_large, 384, 2000, rng, centers)
  queries = clustered(args.n_queries, 384, 2000, rng, centers)
  print(f"[data] generated {len(db)} clustered vectors in {time.perf_counter() - t:.1f}s")
  recall, speedup, index = bench_scann(db, queries)
  index.upsert(np.arange(len(db), len(db) + 30), clustered(30, 384, 2000, rng, centers))   # one-time set-up
  t_upsert = []
  for k in range(1, 6):
    new = clustered(30, 384, 2000, rng, centers)
    t = time.perf_counter()
    index.upsert(np.arange(len(db) + 30 * k, len(db) + 30 * (k + 1)), new)
    t_upsert.append(time.perf_counter() - t)
  t_upsert = float(np.median(t_upsert))
  del index                        # memory: the graph below holds its own copy of the vectors, host and device
  gc.collect()

  t = time.perf_counter()
  n_db = len(db)
  big = bulk_graph(db, 1000, rng)
  del db
  gc.collect()
  print(f"[insert] bulk-built a {big.num_text}-text graph in {time.perf_counter() - t:.1f}s")
  small = bulk_graph(clustered(1000, 384, 2000, rng, centers), 10, rng)
  c_big, c_small = insert_costs([big, small], rng)
  print(f"[insert] one clip (p20 / median): {c_big[0] * 1e3:.2f} / {c_big[1] * 1e3:.2f} ms into {big.num_text} "
        f"texts, {c_small[0] * 1e3:.2f} / {c_small[1] * 1e3:.2f} ms into {small.num_text}; ScaNN upsert of the "
        f"clip's 30 rows into the {n_db}-row index {t_upsert * 1e3:.1f} ms")
  print(result_line(reload_ratio=f"{reload_ratio:.1f}", inmemory_ratio=f"{inmemory_ratio:.1f}",
                    scann_recall10=f"{recall:.4f}", scann_speedup=f"{speedup:.1f}",
                    insert_cost_1m_over_1k=f"{c_big[0] / c_small[0]:.2f}"))


if __name__ == "__main__":
  main()
