"""The full ablation table (hours on this CPU, minutes on an accelerator): SmolLM2-135M-Instruct as the controller,
96 held-out questions, the LLM answering every row, GRPO / DAPO / TAURA with LoRA from one warm start over 3 seeds,
and the no-semantic-memory and no-equivalence rows also on one 4-clip episode memorized from its video by the real
perception.

  python -m m3jax.ablate --config configs/ablate.py
  python -m m3jax.ablate --config configs/ablate.py --set trained_adapter=runs/rl_controller/adapter.npz   # another

The trained controller (the "prompting vs RL" row, and the answerer of the memory rows) is the shipped one,
m3jax/data/controller/controller.npz, in the protocol its file records; retrieval is MiniLM as it was trained with.
Turns are 48 tokens, as bench/controller_eval.py runs the untrained base and the shipped controller.

Re-running the same command resumes: finished evaluations are kept in out_dir/evals, RL runs in out_dir/rl.

Measured with the stage-2 controller (now m3jax/data/controller/stage2_direct.npz; the shipped one is stage 3 since;
Intel Xeon, 2 cores; every row but the RL ones, `--set "rows=('base','no_semantic','no_equivalence',
'reference_mode','designs','prompting','rl','no_instruction','no_reasoning')"`, about 45 min beside other jobs;
accuracy on the 96 held-out questions ± standard error; the perception-built episode asks 21):
  M3 graph, shipped controller 0.573 ± 0.050 | no semantic memory 0.531 (−4.2; with the rules answerer 0.667 →
  0.250, −41.7) | no equivalences 0.562 (−1.0) | reference graph mode 0.573 (+0.0) | perception-built episode
  0.429 ± 0.108, no semantic memory 0.381 (−4.8), no equivalences 0.429 (+0.0) | flat_list design 0.240 (−33.3),
  clip_summary 0.219 (−35.4): neither answers search_node, which the controller asked for in 154 of 173 searches |
  untrained base (prompting) 0.021 → trained 0.573 (+55.2; paper +8 to +10) | the controller was trained without
  the inter-turn instruction: adding it gives 0.365 (−20.8) | no reasoning: n/a (SmolLM2 has no thinking step).
The RL rows (GRPO / DAPO / TAURA from stage 2's adapter, RL_STEPS steps x 3 seeds each at the shipped DAPO
recipe's batch) have not been run yet (issue 45).
"""

import dataclasses
import pathlib

from m3jax.ablate import AblateConfig
from m3jax.agent.answer import SHIPPED_CONTROLLER
from m3jax.config import load_config

HERE = pathlib.Path(__file__).resolve().parent
RL_STEPS = 3


def get_config() -> AblateConfig:
  # The RL rows' shared start and budget: the shipped recipe's DAPO stage (configs/rl_controller.py: stage 2's
  # adapter, 4 questions x G=4, lr 2e-4, 48-token turns, no inter-turn instruction), cut to RL_STEPS steps.
  rl = dataclasses.replace(load_config(HERE / "rl_controller.py"), steps=RL_STEPS, eval_every=0,
                           out_dir="runs/ablate/rl")
  return AblateConfig(out_dir="runs/ablate", questions=96, embedder="minilm", judge="contains",
                      memory_answerer="llm", trained_adapter=str(SHIPPED_CONTROLLER), max_rounds=5, max_new_tokens=48,
                      rl=rl, rl_seeds=(1, 2, 3), perception_seeds=(1_000_000,))
