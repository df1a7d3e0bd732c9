"""Node-route find rate on sized dev gold episodes: is the answer among what the shipped controller's id lookup
("What is the character id of NAME", node route) returns, against the node route on the question itself (names
kept, or replaced by the resolved ids), per node_topk and episode size.

  PYTHONPATH=. python runs/issue43/node/node_probe.py 256 [KIND,KIND...]   # id_lookup,question,question_ids,lookup_question
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
rows = []  # (record, {query kind: query})
for r in records:
  if r.unanswerable: continue
  q = Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip)
  names = ([opening_name(r.question)] if opening_name(r.question) else []) + named_people(r.question)
  with_ids = r.question
  for name in names:
    tag = rules._id_of(q, name)
    if tag: with_ids = re.sub(rf"\b{re.escape(name)}\b", f"<{tag}>", with_ids)
  lookup = f"What is the character id of {names[0]}" if names else r.question
  rows.append((r, {"id_lookup": lookup, "question": r.question, "question_ids": with_ids,
                   "lookup_question": f"{lookup}? {r.question}" if names else r.question}))
KINDS = sys.argv[2].split(",") if len(sys.argv) > 2 else ["id_lookup", "question", "question_ids"]
for k in (5, 10, 20):
  s = MemorySearcher(graphs, embed, dataclasses.replace(ASK_SEARCH, node_topk=k))
  for kind in KINDS:
    t = time.time()
    res = s.search([SearchRequest(r.memory_id, qs[kind], "node", r.before_clip) for r, qs in rows])
    h = collections.Counter(); lens = []
    for (r, _), x in zip(rows, res):
      band = "3-5" if shapes[r.question_id][0] <= 5 else "6-10"
      h[band] += found(r.answer, x.text); h[band + "n"] += 1; lens.append(len(x.text))
    print(f"node_topk={k:2d} {kind:12s}: 3-5 {h['3-5']}/{h['3-5n']} 6-10 {h['6-10']}/{h['6-10n']} "
          f"all {(h['3-5'] + h['6-10']) / len(rows):.2f} chars median {int(np.median(lens))} "
          f"({time.time() - t:.0f}s)", flush=True)
