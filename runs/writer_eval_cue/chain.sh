#!/bin/bash
# issue 44: the template and ceiling writers on dev episodes under three perceptions, the rules answerer
# (the trained answerer takes ~30 min a writer here): still/tiny.en (today's default), talking/tiny.en/cue,
# talking/base/cue; each later one paired against the first over the same questions.
cd "$(dirname "$0")/../.." || exit 1
P=${PYTHON:-.venv/bin/python}
D=runs/writer_eval_cue
run() { name=$1; shift; echo "== $name $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" >> $D/chain.log
  ( time PYTHONPATH=. $P bench/writer_eval.py --split dev --writers template,ceiling --answerer rules \
      --records $D/$name.jsonl "$@" ) > $D/$name.log 2>&1
  echo "   rc=$? $(date -u +%T) $(grep '^RESULT' $D/$name.log | tail -1 | cut -c1-200)" >> $D/chain.log; }
run still_tiny --work /tmp/we/still_tiny
run talking_tiny_cue --work /tmp/we/talking_tiny_cue --talking-faces --speaker-fps 5 --against $D/still_tiny.jsonl
run talking_base_cue --work /tmp/we/talking_base_cue --talking-faces --speaker-fps 5 --asr base --against $D/still_tiny.jsonl
