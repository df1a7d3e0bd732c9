python bench/controller_eval.py --split test --no-llm-judge --perception-episodes 10 --records runs/controller_eval/test_perception_trained.jsonl --tasks perception --answerers trained
