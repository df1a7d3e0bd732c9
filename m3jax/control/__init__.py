"""m3jax.control: a question in, an answer out by searching memory (the agent's control job).

  controller     `Controller`: the multi-round loop (think, search memory, answer), batched and streamed
  policy         `LLMPolicy` over the engine's sampler (constrained or free-form turns), `ChatCompleter`
  prompts        the reference's messages (system, first user, round suffix, search results, judge)
  parsing        a turn's action (`[Search]` / `[Answer]`) and its search route
  trajectory     what one question's rounds were, for evaluation and RL
  answer         answerers over memory graphs: the LLM controller and the rules baseline; `episode_questions`

Why a package of its own: the control loop is what RL trains, eval scores and the server runs, and it needs
nothing of memorization. It sits above the engine, `memory/` and `data/`, below `memorize/` (which asks the pool's
questions with it) and below the programs.
"""
