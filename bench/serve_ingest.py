"""Ingestion cost per clip over a long video: the memory service's video-space path, early clips vs late ones.

  python -m bench.serve_ingest [--clips 96] [--embedder hashed|minilm]

A generated episode of `--clips` 30-s clips (96 = 48 minutes) is fed clip by clip as the perception stage
would hand it over (no decoding, no perception models: those cost the same for every clip, whatever the clip
index, and would only hide the part that grows): each present character's face cluster and each speaker's voice
segments (seeded embeddings around one per character, so identities are matched and merged as in a real run),
then the episode's gold memories inserted through the memorizer's graph. Per clip, timed:
  insert   the graph insertions (entity matching, text embedding, consolidation)
  now      what the service does after a clip: the memorizer's checkpoint (a journal of the clip, O(clip), or a
           snapshot at doubling intervals) + replaying that journal on the space's searchable graph
  before   what it did before: a full graph save (the old checkpoint), a full reload of the graph from disk and
           a new searcher for it, every clip (O(graph) per clip, O(N^2) over the video)
`insert` is the same code either way and, on a small run, mostly jit compilations of new shapes, so the growth
is measured on the per-clip publish cost (`now` vs `before`). Early = median over clips 1-8, late = median over
the last 8 (mean and max printed too: snapshots are spikes).
Final line: RESULT clips=... now_early_ms=... now_late_ms=... now_growth=... before_early_ms=... before_late_ms=...
before_growth=... insert_median_ms=... cpu="..." load=...
"""

from __future__ import annotations

import argparse
import os
import pathlib
import tempfile
import time

import numpy as np

from m3jax.memorize.pipeline import Memorizer
from m3jax.memorize.observations import ClipMemories, ClipObservation
from m3jax.data.episodes import EpisodeConfig, make_episode, render_gold
from m3jax.memory.search import MemorySearcher
from m3jax.memory.store import load_graph, save_graph
from m3jax.serve.config import ServeConfig
from m3jax.serve.spaces import SpaceStore
from bench.harness import cpu_model, machine, result_line


def _unit(x: np.ndarray) -> np.ndarray:
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--clips", type=int, default=96)
  ap.add_argument("--embedder", choices=("hashed", "minilm"), default="hashed")
  args = ap.parse_args()
  print(machine(), flush=True)
  cfg = ServeConfig(embedder=args.embedder, data_dir="")
  if args.embedder == "minilm":
    from m3jax.models.bert import TextEmbedder
    embed = TextEmbedder.from_pretrained()
  else:
    from m3jax.memory.fixture_embedder import HashedBowEmbedder
    embed = HashedBowEmbedder((), (), cfg.graph.text_dim)
  ep = make_episode(EpisodeConfig(seed=7, num_clips=args.clips, num_characters=3))
  rng = np.random.default_rng(0)
  face_of = {c.name: _unit(rng.normal(size=cfg.graph.face_dim)) for c in ep.characters}
  voice_of = {c.name: _unit(rng.normal(size=cfg.graph.voice_dim)) for c in ep.characters}

  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    store = SpaceStore(tmp / "data", cfg.graph, cfg.search, embed)
    space = store.create("bench", "long-video", "video")
    # the per-clip steps of Memorizer.memorize after perception (its checkpoint is called directly: no video)
    memorizer = Memorizer(store.space_dir(space.id) / "memdir", cfg.memorize_config)
    source, _ = memorizer._source_for(tmp / "episode.mp4", "sha256:bench", append=False)
    face_ids, voice_ids = {}, {}
    rows = []
    for script in ep.clips:
      clip = script.clip
      gold = ep.gold_memories[clip]
      t0 = time.perf_counter()
      memorizer.graph.journal = []
      faces = list(dict.fromkeys(script.present + tuple(u.speaker for u in script.utterances)))
      ids = memorizer.graph.add_faces([_unit(face_of[n] + 0.05 * rng.normal(size=(4, cfg.graph.face_dim)))
                                       for n in faces], crops=[[f"crop of {n}"] for n in faces])
      face_ids.update(zip(faces, ids))
      spoken = memorizer.graph.add_voices(
          _unit(np.stack([voice_of[u.speaker] for u in script.utterances])
                + 0.05 * rng.normal(size=(len(script.utterances), cfg.graph.voice_dim))),
          asr=[u.text for u in script.utterances])
      voice_ids.update((u.speaker, v) for u, v in zip(script.utterances, spoken))
      episodic = [render_gold(s, face_ids, voice_ids) for s in gold["episodic"]]
      semantic = [render_gold(s, face_ids, voice_ids) for s in gold["semantic"]]
      memorizer.graph.add_clip(clip, episodic, semantic, embed_fn=embed)
      t1 = time.perf_counter()
      memorizer._checkpoint(source, clip, ClipObservation(clip, clip * 30.0, 30.0),
                            ClipMemories(tuple(episodic), tuple(semantic)))
      t2 = time.perf_counter()
      store.apply_journal(space, memorizer.graph.journal)
      memorizer.graph.journal = None
      t3 = time.perf_counter()
      save_graph(memorizer.graph, tmp / "old_checkpoint")          # the old path: full save, full reload, new searcher
      MemorySearcher([load_graph(tmp / "old_checkpoint")], embed, cfg.search)
      t4 = time.perf_counter()
      rows.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
    assert space.graph.to_json() == memorizer.graph.to_json()    # the searchable copy is the memorized graph
    store.close()

  ms = np.asarray(rows) * 1000
  now, before = ms[:, 1] + ms[:, 2], ms[:, 3]
  early, late = slice(1, 9), slice(len(rows) - 8, len(rows))
  print(f"{len(rows)} clips ({len(rows) * 30 / 60:.0f} min), graph: {space.graph.next_node_id} nodes, "
        f"{space.graph.num_text} memories, embedder {args.embedder}")
  print("clip   insert_ms   now: checkpoint_ms  replay_ms   before: save+reload+searcher_ms")
  for i in list(range(0, min(len(rows), 10))) + list(range(max(10, len(rows) - 10), len(rows))):
    print(f"{i:4d}   {ms[i, 0]:9.1f}   {ms[i, 1]:18.1f}  {ms[i, 2]:9.1f}   {ms[i, 3]:30.1f}")
  for name, x in (("now", now), ("before", before)):
    print(f"{name:>6} per clip: early median {np.median(x[early]):.1f} ms, late median {np.median(x[late]):.1f} ms, "
          f"mean {x.mean():.1f} ms, max {x.max():.1f} ms (clip {int(x.argmax())})")
  growth = lambda x: np.median(x[late]) / np.median(x[early])
  print(result_line(clips=len(rows), now_early_ms=f"{np.median(now[early]):.1f}",
                    now_late_ms=f"{np.median(now[late]):.1f}", now_growth=f"{growth(now):.2f}",
                    before_early_ms=f"{np.median(before[early]):.1f}", before_late_ms=f"{np.median(before[late]):.1f}",
                    before_growth=f"{growth(before):.2f}", now_mean_ms=f"{now.mean():.1f}",
                    before_mean_ms=f"{before.mean():.1f}", insert_median_ms=f"{np.median(ms[:, 0]):.1f}",
                    cpu=cpu_model(), load=f"{os.getloadavg()[0]:.1f}"))


if __name__ == "__main__":
  main()
