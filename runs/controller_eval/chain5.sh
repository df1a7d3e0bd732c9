#!/bin/bash
# issue 41: the untrained answerer on the perception-built test memories, beside test_untrained_gold (one eval
# process keeps ~1.1 of the 2 cores busy); frozen checkout /work/wt-eval (96adb8e)
cd /work/main
P=/work/main/.venv/bin/python
name=test_untrained_perception
echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> runs/controller_eval/chain4.log
echo "python bench/controller_eval.py --split test --no-llm-judge --perception-episodes 10 --records runs/controller_eval/$name.jsonl --tasks perception --answerers untrained --slots 16  # from a checkout of 96adb8e (runs/controller_eval/chain5.sh)" > runs/controller_eval/$name.cmd
( time PYTHONPATH=/work/wt-eval $P /work/wt-eval/bench/controller_eval.py --split test --no-llm-judge --perception-episodes 10 --records runs/controller_eval/$name.jsonl --tasks perception --answerers untrained --slots 16 ) > runs/controller_eval/$name.log 2>&1
echo "   rc=$? $(date -u +%T) $(grep '^RESULT' runs/controller_eval/$name.log | tail -1 | cut -c1-160)" >> runs/controller_eval/chain4.log
