"""The full ablation table (hours on this CPU, minutes on an accelerator): SmolLM2-135M-Instruct as the controller,
96 held-out questions, the LLM answering every row, GRPO / DAPO / TAURA with LoRA from one warm start over 3 seeds,
and the no-semantic-memory and no-equivalence rows also on one 4-clip episode memorized from its video by the real
perception.

  python -m m3jax.eval.ablate --config configs/ablate.py
  python -m m3jax.eval.ablate --config configs/ablate.py --set trained_adapter=runs/rl_controller/adapter.npz   # another

The trained controller (the "prompting vs RL" row, and the answerer of the memory rows) is the stage-3 one,
m3jax/data/controller/stage3_dapo.npz (the shipped controller.npz when the table was measured; the table's finished
rows in runs/ablate stay valid), in the protocol its file records; retrieval is MiniLM as it was trained with.
Turns are 48 tokens, as bench/controller_eval.py runs the untrained base and the shipped controller.

Re-running the same command resumes: finished evaluations are kept in out_dir/evals, RL runs in out_dir/rl.
The RL rows alone, in chunks of at most 70 minutes that resume (issue 45):

  timeout -s INT 70m python -m m3jax.eval.ablate --config configs/ablate.py --set "rows=('warm_start','grpo','dapo','taura')"

Every row is graded by the strict judge, which also pays the RL rows' rewards: an answer that lists candidates or
names one beside a decline earns nothing.

Measured (every row but the RL ones, with the stage-2 controller and the contains judge): the "Training log"
section of m3jax/data/controller/MODEL_CARD.md; the RL rows: the same section.
"""

import dataclasses
import pathlib

from m3jax.eval.ablate import AblateConfig
from m3jax.config import load_config

HERE = pathlib.Path(__file__).resolve().parent
RL_STEPS = 10
STAGE3 = HERE.parent / "m3jax" / "data" / "controller" / "stage3_dapo.npz"


def get_config() -> AblateConfig:
  # The RL rows' shared start and budget: the shipped recipe's DAPO stage (configs/rl_controller.py: stage 2's
  # adapter and configs/recipes.py's DAPO, 4 questions x G=4, 48-token turns), cut to RL_STEPS steps.
  # The strict judge pays the RL rows' rewards and grades every row (m3jax.eval.judges).
  rl = dataclasses.replace(load_config(HERE / "rl_controller.py"), steps=RL_STEPS, eval_every=0, judge="strict",
                           out_dir="runs/ablate/rl")
  return AblateConfig(out_dir="runs/ablate", questions=96, embedder="minilm", judge="strict",
                      memory_answerer="llm", trained_adapter=str(STAGE3), max_rounds=5, max_new_tokens=48,
                      rl=rl, rl_seeds=(1, 2, 3), perception_seeds=(1_000_000,))
