"""The generation engine: how tokens are produced, not what the networks are (`models/`) or what they say
(`control/`, `memorize/`).

* `sampling.Sampler` — jitted prefill and an on-device decode loop over a donated, bucketed KV cache; multi-turn
  continuation (`continue_`), forked shared prefixes, and slots that take a new conversation while the others
  keep decoding (`empty_state` / `reset_rows`: the control loop's continuous batching,
  `slots.run_slots` schedules them).
* `prefill` — the sampler's prefill device programs (whole batch, groups of rows, forked shared prompts).
* `decode` — the sampler's decode device program (`SamplingConfig`, `sample_token`, the jitted `lax.while_loop`
  that samples and feeds a token per row per step), which `sampling` launches and resumes from the host.
* `slots.run_slots` — continuous batching's scheduler: fills free slots from a request source, runs a step, hands
  each ended request on and frees its slot for the next call (the controller's stream, RL rollouts, serve's
  joining).
* `constrained` — byte automata (JSON string lists, prefixed lines) compiled into per-state token masks that the
  decode loop applies.
* `omni_generate` — Qwen2.5-Omni generation: thinker prefill with media, then the sampler's decode.

Imports flow down only: the engine uses `models/`; control, memorize, RL, eval and serve call the engine.
"""
