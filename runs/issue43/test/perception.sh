# issue 43: the test evaluation on perception-built memories of 4 test episodes (runs/issue43/test/PLAN.md)
set -e
export PYTHONPATH=.
PY=${PY:-.venv/bin/python}
ARGS="--split test --tasks perception --perception-episodes 4 --no-llm-judge"
time $PY -m bench.controller_eval $ARGS --answerers trained,rules --adapter runs/issue43/test/candidate_curriculum74_f16.npz --records runs/issue43/test/perception_candidate.jsonl > runs/issue43/test/perception_candidate.log 2>&1
time $PY -m bench.controller_eval $ARGS --answerers trained --records runs/issue43/test/perception_shipped.jsonl > runs/issue43/test/perception_shipped.log 2>&1
