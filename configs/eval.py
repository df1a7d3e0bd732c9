"""python -m m3jax.eval --config configs/eval.py --set graphs_dir=/path/to/memory_graphs/robot \
      --set output=results/robot.jsonl

M3-Bench evaluation with the reference control protocol (5 rounds, the controller's sampling of
configs/recipes.py: T=0.6 / top-p 0.95 / top-k 20).

The annotations default to the robot file shipped in the package (m3jax/data/m3bench_annotations/); the web split:
--set annotations=m3jax/data/m3bench_annotations/web.json (with its graphs_dir and output).

Greedy decoding: --set greedy=true. Judge: --set judge=http (M3JAX_JUDGE_BASE_URL / _API_KEY / _MODEL), or a rule
judge (exact, contains, f1, choice). Multiple-choice (VideoMME-style letters): --set multiple_choice=true judge=choice.
"""

import pathlib

from m3jax.config import load_module
from m3jax.data.m3bench import bundled_annotations
from m3jax.eval.evaluate import EvalConfig

recipes = load_module(pathlib.Path(__file__).resolve().parent / "recipes.py")


def get_config() -> EvalConfig:
  return EvalConfig(
    annotations=str(bundled_annotations("robot")),
    graphs_dir="data/memory_graphs/robot",
    output="results/robot.jsonl",
    model="smollm2-135m-instruct",
    embedder="minilm",
    judge="llm",
    batch_size=64,
    max_rounds=5,
    max_new_tokens=1024,
    **recipes.CONTROLLER_SAMPLING,  # T=0.6 / top-p 0.95 / top-k 20
  )
