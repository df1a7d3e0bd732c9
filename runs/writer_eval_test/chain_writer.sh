#!/bin/bash
# issue 41: the trained writer on the test split (frozen checkout /work/wt-eval at 5ea477f); rules answerer first
# (cheap, a sure result), then the product's trained answerer over the same cached perception
cd /work/main
P=/work/main/.venv/bin/python
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> runs/controller_eval/chain3.log
  ( time PYTHONPATH=/work/wt-eval $P /work/wt-eval/bench/writer_eval.py --split test --writers template,trained,ceiling --adapter m3jax/data/writer/writer.npz --records runs/writer_eval_test/$name.jsonl "$@" ) > runs/writer_eval_test/$name.log 2>&1
  echo "   rc=$? $(date -u +%T) $(grep '^RESULT' runs/writer_eval_test/$name.log | tail -1 | cut -c1-160)" >> runs/controller_eval/chain3.log; }
mkdir -p runs/writer_eval_test
run writer_test_rules --answerer rules
run writer_test_trained --answerer trained
