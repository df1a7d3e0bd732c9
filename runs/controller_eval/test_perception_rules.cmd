python bench/controller_eval.py --split test --tasks perception --answerers rules --no-llm-judge --perception-episodes 10 --records runs/controller_eval/test_perception_rules.jsonl
