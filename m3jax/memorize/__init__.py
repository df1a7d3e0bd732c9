"""m3jax.memorize: a video in, a memory directory out (the agent's memorization job).

  pipeline       `Memorizer`: clips -> perception -> a memory writer -> the memory graph, journalled and resumable
  perceive       one clip's faces and speech resolved against the graph (`perceive_clip`, `PerceptionModels`)
  lockstep       memorization of many videos in lock-step, the perception models' batches shared
  writers        memory writers: template, text LLM (constrained JSON), the trained writer; observations feed them
  omni_writer    the Qwen2.5-Omni writer on clip media
  observations   what a writer sees of a clip (`ClipObservation`) and what it returns (`ClipMemories`)
  perception_pool episodes rendered and memorized end to end, cached on disk (RL's pool, the controller eval's set)

Why a package of its own: memorizing and answering (`control/`) are separate jobs with separate callers (the
`memorize` command, the server's ingest, the perception pool). It sits above `perception/`, `memory/` and the
engine and beside `control/`, which it imports only for the pool's questions (`control.answer.episode_questions`);
`control/` never imports it.
"""
