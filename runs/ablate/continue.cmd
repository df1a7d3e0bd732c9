# Issue 45: the ablation's RL rows (configs/ablate.py), in chunks that resume: finished evaluations are in
# runs/ablate/evals, the RL run in progress checkpoints under runs/ablate/rl/<run>/ckpt every step.
timeout -s INT 70m python -m m3jax.eval.ablate --config configs/ablate.py --set "rows=('warm_start','grpo','dapo','taura')"
