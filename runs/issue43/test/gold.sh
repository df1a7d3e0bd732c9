# issue 43: the test evaluation on gold graphs (runs/issue43/test/PLAN.md); run from the repository root
set -e
export PYTHONPATH=.
PY=${PY:-.venv/bin/python}
ARGS="--split test --n 200 --sizes 3-10x2-3 --tasks gold --no-llm-judge"
time $PY -m bench.controller_eval $ARGS --answerers trained,rules --adapter runs/issue43/test/candidate_curriculum74_f16.npz --records runs/issue43/test/gold_candidate.jsonl > runs/issue43/test/gold_candidate.log 2>&1
time $PY -m bench.controller_eval $ARGS --answerers trained --records runs/issue43/test/gold_shipped.jsonl > runs/issue43/test/gold_shipped.log 2>&1
