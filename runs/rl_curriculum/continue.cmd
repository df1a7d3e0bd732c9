# this run finished (step 100/100, 2026-12-08); a rerun of this command only reports that
python train.py rl --config configs/rl_controller_curriculum.py --max-minutes 30
