#!/bin/bash
# issue 41 re-scoring, session 2026-12-05c: one task per run so each finished run keeps its JSONL;
# frozen checkout /work/wt-eval (96adb8e); outputs under /work/main/runs/controller_eval
cd /work/main
P=/work/main/.venv/bin/python
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> runs/controller_eval/chain4.log
  echo "python bench/controller_eval.py --split test --no-llm-judge --perception-episodes 10 --records runs/controller_eval/$name.jsonl $*  # from a checkout of 96adb8e (runs/controller_eval/chain4.sh)" > runs/controller_eval/$name.cmd
  ( time PYTHONPATH=/work/wt-eval $P /work/wt-eval/bench/controller_eval.py --split test --no-llm-judge --perception-episodes 10 --records runs/controller_eval/$name.jsonl "$@" ) > runs/controller_eval/$name.log 2>&1
  echo "   rc=$? $(date -u +%T) $(grep '^RESULT' runs/controller_eval/$name.log | tail -1 | cut -c1-160)" >> runs/controller_eval/chain4.log; }
run test_stage2_perception --tasks perception --answerers trained --adapter m3jax/data/controller/stage2_direct.npz
run test_untrained_gold --n 300 --tasks gold --answerers untrained --slots 16
run test_untrained_perception --tasks perception --answerers untrained --slots 16
