#!/bin/bash
# issue 44: the writers on dev episodes under three perceptions: still/tiny.en (today's default), talking/tiny.en/cue,
# talking/base/cue, each later one paired against the first over the same questions (`--against`).
#   bash runs/writer_eval_cue/chain.sh            template and ceiling writers, the rules answerer (~3 min a run)
#   bash runs/writer_eval_cue/chain.sh trained    + the trained writer on the new perception (~3 min)
#   bash runs/writer_eval_cue/chain.sh answerer   the product's answerer (the trained controller), template writer
cd "$(dirname "$0")/../.." || exit 1
P=${PYTHON:-.venv/bin/python}
D=runs/writer_eval_cue
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/chain.log
  ( time PYTHONPATH=. $P bench/writer_eval.py --split dev --writers template,ceiling --answerer rules \
      --records $D/$name.jsonl "$@" ) > $D/$name.log 2>&1
  echo "   rc=$? $(date -u +%T) $(grep '^RESULT' $D/$name.log | tail -1 | cut -c1-200)" >> $D/chain.log; }
[ -z "$1" ] && run still_tiny --work /tmp/we/still_tiny
[ -z "$1" ] && run talking_tiny_cue --work /tmp/we/talking_tiny_cue --talking-faces --speaker-fps 5 --against $D/still_tiny.jsonl
[ -z "$1" ] && run talking_base_cue --work /tmp/we/talking_base_cue --talking-faces --speaker-fps 5 --asr base --against $D/still_tiny.jsonl
# then the trained writer (m3jax/data/writer/writer.npz, trained on still/tiny.en perception) on the new perception
[ "$1" = trained ] && run talking_base_cue_trained --work /tmp/we/talking_base_cue --talking-faces --speaker-fps 5 \
    --asr base --writers template,trained,ceiling --adapter m3jax/data/writer/writer.npz
# then the product's answerer (the shipped trained controller) over the template writer's memories, old and new
[ "$1" = answerer ] && run still_tiny_trained_answerer --work /tmp/we/still_tiny --answerer trained --writers template
[ "$1" = answerer ] && run talking_base_cue_trained_answerer --work /tmp/we/talking_base_cue --talking-faces \
    --speaker-fps 5 --asr base --answerer trained --writers template --against $D/still_tiny_trained_answerer.jsonl
