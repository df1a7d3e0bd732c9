"""m3jax.eval: scoring the agent. Programs at the top layer, beside rl/, sft/ and serve/.

  evaluate       M3-Bench evaluation (`python -m m3jax.eval`, `m3jax eval`): annotations + graphs -> judged JSONL
  report         the summary and plots of an evaluation JSONL
  stats          Wilson intervals and the paired bootstrap
  judges         answer judges (local LLM, OpenAI-compatible server, rules; `strict` and `contains`)
  ablate         the paper's ablations from one command (`python -m m3jax.eval.ablate`); ablate_report its rows
  demo           the end-to-end demo (`m3jax demo`): memorize an episode, answer it, score it; `make_answerer`
  scoring        memorized people against the episode script (face / speech person, identity purity)

Why a package of its own: evaluation, reports, ablations and judges are one job (turning answers into numbers)
and import from every layer below; nothing below the programs imports them.
"""
