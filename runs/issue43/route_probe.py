"""Where the answer of a dev question over sized gold episodes can be found by one search with the person ids
resolved: the clip route the policy's fact queries take (top-2 clips scoring >= 0.5, the answering path's tools),
the node route ("character id" queries: top-20 memories), and the rules answerer's top-6 re-ranked memories.

  PYTHONPATH=. python runs/issue43/route_probe.py [N]
"""
import collections, re, sys
import numpy as np
from bench.controller_eval import split_task
from bench.harness import machine
from m3jax.control.answer import ASK_SEARCH, RuleAnswerer, named_people, opening_name
from m3jax.control.controller import Question
from m3jax.eval.judges import normalize_answer
from m3jax.memory.search import MemorySearcher, SearchRequest
from m3jax.data.memory_qa import EpisodeSizes
from m3jax.memory.embedders import make_embedder

print(machine(), flush=True)
n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
embed = make_embedder("minilm")
dim = int(np.asarray(embed(["x"])).shape[-1])
graphs, records, shapes = split_task(n, "dev", embed, dim, EpisodeSizes(clips=(3, 10), people=(2, 3)))
searcher = MemorySearcher(graphs, embed, ASK_SEARCH)
rules = RuleAnswerer(graphs, embed)
found = lambda ans, text: f" {normalize_answer(ans)} " in f" {normalize_answer(text)} "
hits = collections.defaultdict(lambda: collections.Counter())
for r in records:
  if r.unanswerable:
    continue
  q = Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip)
  query = r.question
  for name in ([opening_name(r.question)] if opening_name(r.question) else []) + named_people(r.question):
    tag = rules._id_of(q, name)
    if tag:
      query = re.sub(rf"\b{re.escape(name)}\b", f"<{tag}>", query)
  clip, node = searcher.search([SearchRequest(r.memory_id, query, "clip", r.before_clip),
                                SearchRequest(r.memory_id, query, "node", r.before_clip)])
  top6 = rules._top(q, query, 6) or ""
  clips = shapes[r.question_id][0]
  band = "3-5 clips" if clips <= 5 else "6-10 clips"
  for key, text in (("clip route", clip.text), ("node route", node.text), ("rules top-6", top6)):
    hits[band][key] += found(r.answer, text)
    hits["all"][key] += found(r.answer, text)
  hits[band]["n"] += 1
  hits["all"]["n"] += 1
for band in ("3-5 clips", "6-10 clips", "all"):
  h = hits[band]
  print(f"{band}: n={h['n']} " + " ".join(f"{k}={h[k]}/{h['n']} ({h[k] / max(h['n'], 1):.2f})"
                                            for k in ("clip route", "node route", "rules top-6")), flush=True)
