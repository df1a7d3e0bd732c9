"""Settings several configs share, written once: the controller's sampling and the DAPO recipe.

  recipes = load_module(pathlib.Path(__file__).resolve().parent / "recipes.py")   # in a config beside this file

Not a config itself (no `get_config`): `m3jax.config.load_module` runs it by path, so it loads from any directory,
in tests, in the ablation runner and on every process of a multi-host run. WHY: configs/rl_smollm2.py,
configs/rl_controller_warm.py (and the stages and ablation rows built on it) and configs/eval.py each spelled out
these numbers; a change to the recipe now reaches all of them.
"""

from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.losses import LossConfig

# The reference samples the controller at T=0.6 / top-p 0.95 / top-k 20, in its control protocol and its RL run;
# rollouts sample with it and the learner scores log-probs at the same temperature
CONTROLLER_SAMPLING = dict(temperature=0.6, top_p=0.95, top_k=20)


def dapo(*, sampling_rounds: int, kl_coef: float, lr: float, weight_decay: float, **learner) -> dict:
  """`RLConfig` fields of DAPO as this repository runs it, the controller's sampling included: clip-higher
  0.2 / 0.28 with dual clip 3, token-mean loss, dynamic sampling (mixed-outcome groups only, up to `sampling_rounds`
  rollout rounds, no carry-over), one epoch per rollout batch, AdamW at a constant `lr` with grad-norm clip 1.0,
  GRPO advantages, the `contains` judge, and the learner's log-probs at the sampling temperature. The arguments
  are what the configs choose differently; `learner` takes further `LearnerConfig` fields (mini_batches,
  micro_batch, remat, length_bucket)."""
  return dict(
      **CONTROLLER_SAMPLING, judge="contains", advantage="grpo",
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=sampling_rounds, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="token-mean",
                                            kl_coef=kl_coef),
                            optim=OptimConfig(lr=lr, schedule="constant", weight_decay=weight_decay, grad_clip=1.0),
                            temperature=CONTROLLER_SAMPLING["temperature"], epochs=1,
                            layer_loop="scan",  # 30 layers: one compiled layer, not 30
                            **learner))
