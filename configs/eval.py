"""M3-Bench evaluation with the reference control protocol (5 rounds, T=0.6 / top-p 0.95 / top-k 20).

  python -m m3jax.eval --config configs/eval.py --set annotations=../shared/data/m3bench/robot.json \
      --set graphs_dir=/path/to/memory_graphs/robot --set output=results/robot.jsonl

Greedy decoding: --set greedy=true. Judge: --set judge=http (M3JAX_JUDGE_BASE_URL / _API_KEY / _MODEL), or a rule
judge (exact, contains, f1, choice). Multiple-choice (VideoMME-style letters): --set multiple_choice=true judge=choice.
"""

from m3jax.eval import EvalConfig


def get_config() -> EvalConfig:
  return EvalConfig(
    annotations="../shared/data/m3bench/robot.json",
    graphs_dir="data/memory_graphs/robot",
    output="results/robot.jsonl",
    model="smollm2-135m-instruct",
    embedder="minilm",
    judge="llm",
    batch_size=64,
    max_rounds=5,
    max_new_tokens=1024,
    temperature=0.6,
    top_p=0.95,
    top_k=20,
  )
