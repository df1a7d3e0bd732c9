python bench/controller_eval.py --split test --n 300 --answerers trained,rules --no-llm-judge --perception-episodes 10 --records runs/controller_eval/test.jsonl
