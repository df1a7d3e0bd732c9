# continues this run from its newest checkpoint (run from the repository root)
python train.py rl --config configs/rl_controller_curriculum.py --max-minutes 30
