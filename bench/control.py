"""Control-loop throughput: m3jax batched controller vs a straightforward transformers port of the reference loop.

  python -m bench.control [--questions 64] [--baseline-questions 64] [--max-new-tokens 64]

Questions come from the official-format fixture graphs (small + medium, their `*.queries.json` questions cycled
to `--questions`), with SmolLM2-135M-Instruct as the policy and the reference protocol (5 rounds, T=0.6,
top-p 0.95, top-k 20, stop at <|im_end|>), `--max-new-tokens` per turn.

* m3jax: all questions in one batch, KV continuation across rounds, batched jitted graph search
  (`MemorySearcher`), timed after a warm-up run that compiles every shape bucket.
* m3jax re-prefill: the same, but every round re-prefills each whole conversation (`LLMPolicy(reuse_kv=False)`).
* reference (transformers, PyTorch): one question at a time, `apply_chat_template` + `generate` on the full
  conversation each round, reference regex parse, and per search the reference's reload-pickle / truncate /
  refresh / search (`tests/reference_search.py`, `answer`).

Final line: `RESULT control_ratio=<m3jax q/s / reference q/s> kv_reuse_gain=<kv q/s / re-prefill q/s> ...`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import pathlib
import re
import time

from m3jax.control.controller import Controller, ControlConfig, Question
from m3jax.control.policy import LLMPolicy
from m3jax.control.prompts import FIRST_USER_MESSAGE, round_suffix, system_message
from m3jax.memory.fixture_embedder import HashedBowEmbedder
from m3jax.memory.search import MemorySearcher, SearchConfig
from m3jax.memory.reference_pickle import load_reference_pickle
from m3jax.models.llm import load_llm
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.models.weights.gguf import smollm2_path
from tests import reference_search  # the reference oracle
from bench.harness import machine, require, result_line

TESTS = pathlib.Path(__file__).resolve().parents[1] / "tests"
FIXTURES = TESTS / "fixtures" / "official_graphs"
GRAPHS = ("small", "medium")
MAX_ROUNDS = 5
# Tool results make each round's chunk ~0.5-1k tokens; power-of-two buckets pad those (and the cache the chunk
# attends to) by up to 2x, 1.5x steps by at most 1.5x, for a few more compilations.
FINE_BUCKETS = (64, 128, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 32768)


def bench_questions(n: int) -> list[Question]:
  pool = []
  for gi, name in enumerate(GRAPHS):
    for q in json.loads((FIXTURES / f"{name}.queries.json").read_text())["queries"]:
      if q["query"].endswith("?"):
        pool.append(Question(q["id"], q["query"], q["intent"], graph_index=gi, graph_key=name,
                             before_clip=q["before_clip"]))
  pool = list({q.question: q for q in pool}.values())
  return [Question(f"{q.question_id}_{i}", q.question, q.answer, q.graph_index, q.graph_key, q.before_clip)
          for i, q in ((i, pool[i % len(pool)]) for i in range(n))]


def run_m3jax(questions, model, tok, sampling, searcher, reuse_kv: bool, seed: int):
  sampling = dataclasses.replace(sampling, seed=seed)
  policy = LLMPolicy(Sampler(model, sampling, tok), tok, sampling, reuse_kv=reuse_kv)
  start = time.perf_counter()
  trajs = Controller(policy, searcher, ControlConfig(max_rounds=MAX_ROUNDS)).run(questions)
  elapsed = time.perf_counter() - start
  return elapsed, trajs


def run_reference(questions, max_new_tokens: int, embed, seed: int):
  """The reference control loop (m3_agent/control.py) one question at a time, in PyTorch via transformers."""
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  path = smollm2_path()
  tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, torch_dtype=torch.float32)
  model.eval()
  torch.manual_seed(seed)
  pattern = r"Action: \[(.*)\].*Content: (.*)"
  eos = tok.convert_tokens_to_ids("<|im_end|>")
  start, generated, answered = time.perf_counter(), 0, 0
  for q in questions:
    conv = [system_message(q.question), {"role": "user", "content": FIRST_USER_MESSAGE}]
    current_clips: list[int] = []
    for idx in range(MAX_ROUNDS):
      conv[-1]["content"] += round_suffix(idx, MAX_ROUNDS)
      ids = tok.apply_chat_template(conv, tokenize=True, add_generation_prompt=True, return_tensors="pt",
                                    return_dict=True)["input_ids"]
      with torch.no_grad():
        out = model.generate(ids, do_sample=True, temperature=0.6, top_p=0.95, top_k=20,
                             max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=eos)
      new = out[0, ids.shape[1]:]
      generated += int(new.shape[0])
      text = tok.decode(new, skip_special_tokens=True)
      conv.append({"role": "assistant", "content": text})
      match = re.search(pattern, text.split("</think>")[-1], re.DOTALL)
      action, content = (match.group(1), match.group(2)) if match else ("Search", None)
      if action == "Answer":
        answered += 1
        break
      if idx == MAX_ROUNDS - 1:
        break
      if content:
        route = "node" if "character id" in content else "clip"
        result = reference_search.answer(FIXTURES / f"{q.graph_key}.pkl", content, route, q.before_clip,
                                         current_clips, embed, reload=True)
      else:
        result = "Searched knowledge: {}\n(The search result is empty. Please try searching from another perspective.)"
      conv.append({"role": "user", "content": result})
  return time.perf_counter() - start, generated, answered


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--questions", type=int, default=64)
  parser.add_argument("--baseline-questions", type=int, default=64,
                      help="questions for the one-at-a-time reference (its q/s is a per-question rate)")
  parser.add_argument("--max-new-tokens", type=int, default=64)
  parser.add_argument("--no-warmup", dest="warmup", action="store_false",
                      help="time the first m3jax run (compilation included) instead of a second, warm one")
  parser.add_argument("--buckets", choices=("fine", "pow2"), default="fine",
                      help="sequence-length buckets: 1.5x steps (less padded prefill) or the sampler's powers of two")
  args = parser.parse_args()
  require({"torch": "torch", "transformers": "transformers"})  # the competitor's packages (bench/setup)
  print(machine(), flush=True)

  embed = HashedBowEmbedder.from_json(FIXTURES / "small.embedder.json")
  graphs = [load_reference_pickle(FIXTURES / f"{g}.pkl") for g in GRAPHS]
  searcher = MemorySearcher(graphs, embed, SearchConfig(exclusion="reference"))
  questions = bench_questions(args.questions)
  model, tok = load_llm()
  buckets = FINE_BUCKETS if args.buckets == "fine" else SamplingConfig().length_buckets
  sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=0.6, top_p=0.95, top_k=20,
                            stop_token_ids=(tok.convert_tokens_to_ids("<|im_end|>"),), seed=0,
                            length_buckets=buckets)

  results = {}
  for name, reuse in (("m3jax_kv", True), ("m3jax_reprefill", False)):
    warm = run_m3jax(questions, model, tok, sampling, searcher, reuse, seed=1)[0] if args.warmup else 0.0
    elapsed, trajs = run_m3jax(questions, model, tok, sampling, searcher, reuse, seed=2)
    gen = sum(int(t.generated.sum()) for t in trajs)
    rounds = sum(len(t.rounds) for t in trajs)
    results[name] = len(questions) / elapsed
    print(f"{name}: {len(questions)} questions in {elapsed:.1f}s (warm-up {warm:.1f}s; 0 = none, compile included) = {results[name]:.3f} q/s, "
          f"{gen / elapsed:.1f} gen tok/s, {rounds / len(questions):.2f} rounds/q, "
          f"{sum(t.finished for t in trajs)} answered", flush=True)

  base_q = bench_questions(args.baseline_questions)
  elapsed, gen, answered = run_reference(base_q, args.max_new_tokens, embed, seed=2)
  results["reference"] = len(base_q) / elapsed
  print(f"reference (transformers, one at a time): {len(base_q)} questions in {elapsed:.1f}s = "
        f"{results['reference']:.3f} q/s, {gen / elapsed:.1f} gen tok/s, {answered} answered", flush=True)
  print(result_line(control_ratio=f"{results['m3jax_kv'] / results['reference']:.2f}",
                    kv_reuse_gain=f"{results['m3jax_kv'] / results['m3jax_reprefill']:.2f}",
                    m3jax_qps=f"{results['m3jax_kv']:.3f}", reprefill_qps=f"{results['m3jax_reprefill']:.3f}",
                    reference_qps=f"{results['reference']:.3f}", questions=len(questions),
                    baseline_questions=len(base_q), max_new_tokens=args.max_new_tokens, warm=int(args.warmup),
                    buckets=args.buckets))


if __name__ == "__main__":
  main()
