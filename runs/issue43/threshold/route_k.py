"""Clip-route find rate vs clip_topk / threshold on sized dev gold episodes (ids resolved as the rules answerer does).

  PYTHONPATH=. python runs/issue43/threshold/route_k.py 256
"""
import collections, dataclasses, re, sys, time
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
rules = RuleAnswerer(graphs, embed)
found = lambda ans, text: f" {normalize_answer(ans)} " in f" {normalize_answer(text)} "
qs = []
for r in records:
  if r.unanswerable: continue
  q = Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip)
  query = r.question
  for name in ([opening_name(r.question)] if opening_name(r.question) else []) + named_people(r.question):
    tag = rules._id_of(q, name)
    if tag: query = re.sub(rf"\b{re.escape(name)}\b", f"<{tag}>", query)
  qs.append((r, query))
for k, thr in ((2, 0.5), (3, 0.5), (4, 0.5), (2, 0.3), (3, 0.3), (4, 0.3), (6, 0.0)):
  t = time.time()
  s = MemorySearcher(graphs, embed, dataclasses.replace(ASK_SEARCH, clip_topk=k, threshold=thr))
  res = s.search([SearchRequest(r.memory_id, q, "clip", r.before_clip) for r, q in qs])
  h = collections.Counter(); lens = []
  for (r, q), x in zip(qs, res):
    band = "3-5" if shapes[r.question_id][0] <= 5 else "6-10"
    h[band] += found(r.answer, x.text); h[band + "n"] += 1; lens.append(len(x.text))
  print(f"clip_topk={k} threshold={thr}: 3-5 {h['3-5']}/{h['3-5n']} 6-10 {h['6-10']}/{h['6-10n']} "
        f"all {(h['3-5'] + h['6-10']) / len(qs):.2f} chars median {int(np.median(lens))} ({time.time() - t:.0f}s)", flush=True)
