"""m3jax.control: a question in, an answer out by searching memory (the agent's control job).

  controller     `Controller`: the multi-round loop (think, search memory, answer), batched and streamed
  build          the one place a controller is assembled: `load_controller` (base or trained adapter),
                 `control_sampling`, `build_policy` (sampler + `LLMPolicy`); ask, demo, serve, eval, the
                 ablation and RL rollouts all build through it
  policy         `LLMPolicy` over the engine's sampler (constrained or free-form turns), `ChatCompleter`
  prompts        the reference's messages (system, first user, round suffix, search results, judge)
  parsing        a turn's action (`[Search]` / `[Answer]`) and its search route
  trajectory     what one question's rounds were, for evaluation and RL
  answer         answerers over memory graphs: the LLM controller and the rules baseline (`make_answerer`);
                 `episode_questions`

Why a package of its own: the control loop is what RL trains, eval scores and the server runs, and it needs
nothing of memorization. It sits above the engine, `memory/` and `data/`, below `memorize/` (which asks the pool's
questions with it) and below the programs. Callers import the short API below from the package.
"""

from m3jax.control.answer import ANSWERERS, LLMAnswerer, RuleAnswerer, episode_questions, make_answerer
from m3jax.control.build import (SHIPPED_CONTROLLER, LoadedController, build_policy, control_sampling,
                                 load_controller, trained_adapter_path)
from m3jax.control.controller import ControlConfig, Controller, Question
from m3jax.control.trajectory import Trajectory

__all__ = ["ANSWERERS", "ControlConfig", "Controller", "LLMAnswerer", "LoadedController", "Question",
           "RuleAnswerer", "SHIPPED_CONTROLLER", "Trajectory", "build_policy", "control_sampling",
           "episode_questions", "load_controller", "make_answerer", "trained_adapter_path"]
