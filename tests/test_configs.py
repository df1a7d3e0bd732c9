"""configs/recipes.py: the shared DAPO recipe and controller sampling load with every config that uses them, from
any directory and process, and the configs built on them kept every value they had when each spelled them out."""

import dataclasses
import os
import pathlib
import subprocess
import sys

from m3jax.config import load_config, load_module

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
USERS = ("rl_smollm2.py", "rl_controller_warm.py", "rl_controller_direct.py", "rl_controller.py", "ablate.py",
         "eval.py")
RUNS = ("rl_controller_strict.py", "rl_controller_sized.py", "rl_controller_ladder_sized.py")  # issue 43's runs


def test_the_configs_load_the_recipe_from_another_directory_and_process(tmp_path):
  """As `python train.py rl --config /abs/path`, the ablation runner (configs/ablate.py loads rl_controller.py,
  which loads the stages before it) or a multi-host worker would: a fresh interpreter whose working directory is
  neither the repository nor configs/, by absolute and by relative path."""
  relative = os.path.relpath(CONFIGS, tmp_path)
  script = ("import sys\nfrom m3jax.config import load_config\n"
            f"for name in {USERS + RUNS!r}:\n"
            f"  for path in ({str(CONFIGS)!r} + '/' + name, {relative!r} + '/' + name):\n"
            "    load_config(path)\n"
            "print('loaded', 'configs' in sys.modules, 'recipes' in sys.modules)\n")
  env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
  out = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip() == "loaded False False"  # by path: no `configs` package, nothing left on sys.path


def test_the_rl_and_eval_configs_use_the_shared_recipe():
  recipes = load_module(CONFIGS / "recipes.py")
  sampling = recipes.CONTROLLER_SAMPLING
  dapo = recipes.dapo(sampling_rounds=1, kl_coef=0.0, lr=1.0, weight_decay=0.0)
  rl = {name: load_config(CONFIGS / name) for name in USERS if name not in ("ablate.py", "eval.py")}
  ablate = load_config(CONFIGS / "ablate.py")
  assert ablate.judge == ablate.rl.judge == "strict"  # issue 45: the ablation's RL rows are paid and graded strictly
  rl["ablate.py"] = dataclasses.replace(ablate.rl, judge=dapo["judge"])
  for name, cfg in rl.items():
    assert {k: getattr(cfg, k) for k in sampling} == sampling, name
    assert (cfg.judge, cfg.advantage) == (dapo["judge"], dapo["advantage"]), name
    assert cfg.learner.temperature == sampling["temperature"], name
    for part in ("clip_low", "clip_high", "dual_clip", "agg_mode"):
      assert getattr(cfg.learner.loss, part) == getattr(dapo["learner"].loss, part), (name, part)
    assert (cfg.learner.optim.schedule, cfg.learner.optim.grad_clip) == ("constant", 1.0), name
    assert cfg.sampling.enabled and not cfg.sampling.carry_over, name
  evaluation = load_config(CONFIGS / "eval.py")
  assert {k: getattr(evaluation, k) for k in sampling} == sampling


def test_the_recipe_kept_the_values_the_configs_spelled_out():
  """rl_smollm2.py and rl_controller_warm.py as they were before configs/recipes.py, written out in full: the move
  to the shared recipe changed no value (a deliberate recipe change updates these too)."""
  from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
  from m3jax.rl.learner import LearnerConfig, OptimConfig
  from m3jax.rl.losses import LossConfig
  from m3jax.rl.program import RLConfig

  smollm2 = RLConfig(
      model="smollm2-135m-instruct", train_seeds=(0, 200), eval_seeds=(1_000_000, 1_000_020), steps=200,
      batch_questions=32, group_size=2, max_rounds=5, max_new_tokens=256, temperature=0.6, top_p=0.95, top_k=20,
      judge="contains", advantage="grpo", seq_bucket=512, max_seq_len=8192,
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=4, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, dual_clip=3.0, agg_mode="token-mean",
                                            kl_coef=0.001),
                            optim=OptimConfig(lr=1e-6, schedule="constant", weight_decay=0.01, grad_clip=1.0),
                            temperature=0.6, epochs=1, mini_batches=2, micro_batch=4, remat=True,
                            layer_loop="scan"),
      eval_every=20, eval_questions=64, out_dir="runs/rl_smollm2", save_every=10)
  warm = RLConfig(
      model="smollm2-135m-instruct", embedder="minilm", train_seeds=(0, 128), eval_seeds=(1_000_000, 1_000_008),
      lora_rank=8, lora_alpha=16.0, seed=1,
      warm_start_steps=30, warm_start_questions=16, warm_start_lr=1e-3,
      steps=0, batch_questions=4, group_size=4, max_rounds=5, inter_turn_instruction=False, max_new_tokens=48,
      temperature=0.6, top_p=0.95, top_k=20, judge="contains", advantage="grpo", recompute_old_logp=False,
      seq_bucket=128, max_seq_len=2048,
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=2, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, agg_mode="token-mean", kl_coef=0.0),
                            optim=OptimConfig(lr=3e-5, schedule="constant", weight_decay=0.0, grad_clip=1.0),
                            temperature=0.6, epochs=1, mini_batches=1, micro_batch=2, length_bucket=64,
                            share_prefix=4, remat=False, layer_loop="scan"),
      eval_every=1, eval_questions=24, out_dir="runs/rl_controller_warm", save_every=1)
  assert load_config(CONFIGS / "rl_smollm2.py") == smollm2
  assert load_config(CONFIGS / "rl_controller_warm.py") == warm


def test_the_strict_run_is_the_shipped_recipe_paid_by_the_strict_judge_on_the_pool():
  """configs/rl_controller_strict.py (issue 43) changes what the policy sees and how it is paid, nothing else."""
  shipped, strict = load_config(CONFIGS / "rl_controller.py"), load_config(CONFIGS / "rl_controller_strict.py")
  changed = {f.name for f in dataclasses.fields(strict) if getattr(strict, f.name) != getattr(shipped, f.name)}
  assert changed == {"init_adapter", "judge", "steps", "seed", "pool_seeds", "pool_ratio",
                     "eval_questions", "out_dir"}
  assert strict.outcome_judge == "strict" and pathlib.Path(strict.init_adapter).name == "stage3_dapo.npz"
  assert strict.steps >= 150 and strict.batch_questions * strict.group_size >= 16 and 0 < strict.pool_ratio < 1


def test_the_sized_run_is_the_strict_run_on_episodes_of_every_size():
  """configs/rl_controller_sized.py (issue 43) changes the episodes' sizes and the run's directory, nothing else."""
  strict, sized = load_config(CONFIGS / "rl_controller_strict.py"), load_config(CONFIGS / "rl_controller_sized.py")
  changed = {f.name for f in dataclasses.fields(sized) if getattr(sized, f.name) != getattr(strict, f.name)}
  assert changed == {"episode_sizes", "out_dir"}
  assert (sized.episode_sizes.clips, sized.episode_sizes.people) == ((3, 10), (2, 3))
