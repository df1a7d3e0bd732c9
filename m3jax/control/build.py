"""The one place a controller's policy is built: the LLM (with its adapter), the sampling, the sampler, the policy.

`m3jax ask`, the demo, serve, eval, the ablation and RL rollouts all answer through `Controller(policy, searcher,
control)`; they differ only in which model decodes (base, trained adapter, the learner's live weights), how it
samples (the reference's T=0.6 / top-p 0.95 / top-k 20, or greedy for a trained adapter) and how the sampler
shares work (forked prompts for an RL group, per-row streams across processes). WHY one module: the assembly
was written in four places, and a change to one (the stop tokens, the adapter's recorded protocol) silently
missed the others.
"""

from __future__ import annotations

import dataclasses
import pathlib
from typing import Sequence

from m3jax.control.controller import ControlConfig
from m3jax.control.policy import ActionConstraints, LLMPolicy
from m3jax.control.prompts import END_OF_TURN
from m3jax.engine.sampling import Sampler, SamplingConfig
from m3jax.errors import UserError

# The shipped controller: SmolLM2-135M-Instruct plus a LoRA adapter trained with `train.py rl`
# (configs/rl_controller.py), its metadata naming the protocol it was trained with; numbers in its MODEL_CARD.md.
SHIPPED_CONTROLLER = pathlib.Path(__file__).resolve().parents[1] / "data" / "controller" / "controller.npz"

# The reference samples the controller at T=0.6 / top-p 0.95 / top-k 20 (its control protocol and its RL run)
REFERENCE_SAMPLING = dict(temperature=0.6, top_p=0.95, top_k=20)


@dataclasses.dataclass
class LoadedController:
  """A decoding model and the protocol it answers in. A trained adapter records its own (rounds, inter-turn
  instruction, turn length) and runs greedily, as it was trained and evaluated; a base model takes the caller's."""
  model: object
  tokenizer: object
  control: ControlConfig
  max_new_tokens: int
  greedy: bool


def trained_adapter_path(adapter: str | pathlib.Path | None) -> pathlib.Path:
  """The adapter file a trained answerer loads: `adapter`, else the shipped one; a missing file is a UserError."""
  path = pathlib.Path(adapter) if adapter else SHIPPED_CONTROLLER
  if not path.is_file():
    raise UserError(f"adapter file not found: {adapter}" if adapter else
                    f"the shipped controller {SHIPPED_CONTROLLER} is missing (a damaged install?): pass a LoRA adapter "
                    "file written by `train.py rl` with --adapter")
  return path


def load_controller(llm="smollm2-135m-instruct", adapter: str | pathlib.Path | None = None, *, trained: bool = False,
                    max_new_tokens: int = 48, control: ControlConfig | None = None,
                    greedy: bool = False) -> LoadedController:
  """`llm`: a `load_llm` name/path or a loaded (model, tokenizer) pair. With `trained` (or an `adapter`), the
  adapter file (default: the shipped one) is merged into the weights once and its recorded protocol replaces
  `max_new_tokens`, `control` and `greedy`."""
  from m3jax.models.llm import load_llm
  model, tokenizer = load_llm(llm) if isinstance(llm, (str, pathlib.Path)) else llm
  if not (trained or adapter):
    return LoadedController(model, tokenizer, control or ControlConfig(), max_new_tokens, greedy)
  from m3jax.models.lora import load_adapter_file, merged
  model, info = load_adapter_file(trained_adapter_path(adapter), model, kind="controller")
  recorded = ControlConfig(max_rounds=int(info.get("max_rounds", 5)),
                           inter_turn_instruction=bool(info.get("inter_turn_instruction", True)))
  return LoadedController(merged(model), tokenizer, recorded, int(info.get("max_new_tokens", 192)), greedy=True)


def stop_ids(tokenizer, stops: Sequence[str] = (END_OF_TURN,)) -> tuple[int, ...]:
  """The ids of the stop tokens the tokenizer has as single tokens, in order, without repeats."""
  encoded = (tokenizer.encode(t, add_special_tokens=False) for t in stops)
  return tuple(dict.fromkeys(ids[0] for ids in encoded if len(ids) == 1))


def control_sampling(tokenizer, max_new_tokens: int, *, greedy: bool = False, seed: int = 0,
                     stops: Sequence[str] = (END_OF_TURN,), **overrides) -> SamplingConfig:
  """A controller turn's sampling: the reference's unless `overrides` (temperature, top_p, top_k) say otherwise;
  a turn stops at the end-of-turn token (and any other `stops` the tokenizer has)."""
  return SamplingConfig(max_new_tokens=max_new_tokens, greedy=greedy, stop_token_ids=stop_ids(tokenizer, stops),
                        seed=seed, **{**REFERENCE_SAMPLING, **overrides})


def build_policy(model, tokenizer, sampling: SamplingConfig, *, constrain_rounds: int | None = None,
                 min_searches: int = 0, reuse_kv: bool = True, share_prefix: bool | None = None,
                 row_ids: Sequence[int] | None = None) -> LLMPolicy:
  """The LLM policy over a fresh sampler of `model` (its counters are `policy.sampler`'s). `constrain_rounds`:
  decode every turn inside the action format, the last of that many rounds answer-only (`ActionConstraints`, for
  an untrained base). `min_searches`: the first that many rounds may only search (`ActionConstraints`; the
  rest as `constrain_rounds` says, free without it). `share_prefix`: fork identical prompts' caches (an RL
  group). `row_ids`: per-episode sampling streams (see `LLMPolicy`)."""
  actions = None
  if constrain_rounds is not None or min_searches:
    actions = ActionConstraints.build(tokenizer, model.cfg.vocab_size, sampling.stop_token_ids, constrain_rounds,
                                      min_searches)
  sampler = Sampler(model, sampling, tokenizer, share_prefix=share_prefix)
  return LLMPolicy(sampler, tokenizer, sampling, reuse_kv=reuse_kv, actions=actions, row_ids=row_ids)
