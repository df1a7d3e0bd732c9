# this run finished at step 100/100 (2026-12-08) and its checkpoint was dropped: nothing continues it.
# It started with: python train.py rl --config configs/rl_controller_curriculum.py --max-minutes 75
