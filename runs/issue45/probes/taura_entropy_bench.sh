#!/bin/bash
# issue 45: TAURA's step with the learner's entropy pass (recompute_old_logp=True: the pass the old code ran for
# TAURA, whose log-probs now also serve as old_logp) against entropies from the rollout (the recipe's
# recompute_old_logp=False), 2 steps each, cold, one after the other.
cd /work/main
for mode in rollout learner; do
  extra=""; [ $mode = learner ] && extra="--set recompute_old_logp=True"
  echo "== $mode $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  rm -rf /tmp/rlt_$mode
  PYTHONPATH=. .venv/bin/python -m bench.rl_throughput --steps 2 --out /tmp/rlt_$mode --set advantage=taura $extra \
    > runs/issue45/zen4/rl_throughput_taura_$mode.log 2>&1
  echo "   rc=$? $(date -u +%T)"; grep -E "^step|^RESULT" runs/issue45/zen4/rl_throughput_taura_$mode.log | cut -c1-330
done
