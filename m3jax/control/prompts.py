"""The control and judge protocol strings, byte for byte as the reference uses them.

WHY exact: M3-Agent-Control was RL-trained on these messages (reference §4.2, `m3_agent/control.py` and
`ray_trainer.py`), so any paraphrase is a distribution shift for the released policy; the judge prompt
defines what "correct" means on M3-Bench (§4.6). Functions below compose them the way the reference does.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

SYSTEM_PROMPT = (
  "You are given a question and some relevant knowledge. Your task is to reason about whether the provided "
  "knowledge is sufficient to answer the question. If it is sufficient, output [Answer] followed by the answer. "
  "If it is not sufficient, output [Search] and generate a query that will be encoded into embeddings for a vector "
  "similarity search. The query will help retrieve additional information from a memory bank.\n\n"
  "Question: {question}"
)

FIRST_USER_MESSAGE = "Searched knowledge: {}"

_INSTRUCTION_HEAD = (
  "\n\nOutput the answer in the format:\n"
  "Action: [Answer] or [Search]\n"
  "Content: {content}\n\n"
  "If the answer cannot be derived yet, the {content} should be a single search query that would help retrieve the "
  "missing information. The search {content} needs to be different from the previous.\n"
  "You can get the mapping relationship between character ID and name by using search query such as: "
  "\"What is the name of <character_{i}>\" or \"What is the character id of {name}\".\n"
  "After obtaining the mapping, it is best to use character ID instead of name for searching.\n"
)

# Appended to the last user message before every generation (open-ended M3-Bench questions).
INSTRUCTION = (
  _INSTRUCTION_HEAD
  + "If the answer can be derived from the provided knowledge, the {content} is the specific answer to the question. "
  "Only name can appear in the answer, not character ID like <character_{i}>."
)

# The training variant for multiple-choice items (`instruction_mme`): the answer is a single option letter.
INSTRUCTION_MULTIPLE_CHOICE = (
  _INSTRUCTION_HEAD
  + "If the answer can be derived from the provided knowledge, the {content} is only the letter (A, B, C, or D) of "
  "the correct option."
)

LAST_ROUND_SUFFIX = (
  "\n(The Action of this round must be [Answer]. If there is insufficient information, you can make reasonable "
  "guesses.)"
)

SEARCH_RESULT_PREFIX = "Searched knowledge: "
EMPTY_RESULT_SUFFIX = "\n(The search result is empty. Please try searching from another perspective.)"

JUDGE_SYSTEM_PROMPT = "You are an expert in video understanding."

JUDGE_PROMPT = (
  "You are provided with a question, a ground truth answer, and an answer from an agent model. Your task is to "
  "determine whether the ground truth answer can be logically inferred from the agent's answer, in the context of "
  "the question.\n\n"
  "Do not directly compare the surface forms of the agent answer and the ground truth answer. Instead, assess "
  "whether the meaning expressed by the agent answer supports or implies the ground truth answer. If the ground "
  "truth can be reasonably derived from the agent answer, return \"Yes\". If it cannot, return \"No\".\n\n"
  "Important notes:\n"
  "\t\u2022\tDo not require exact wording or matching structure.\n"
  "\t\u2022\tSemantic inference is sufficient, as long as the agent answer entails or implies the meaning of the "
  "ground truth answer, given the question.\n"
  "\t\u2022\tOnly return \"Yes\" or \"No\", with no additional explanation or formatting.\n\n"
  "Input fields:\n"
  "\t\u2022\tquestion: {question}\n"
  "\t\u2022\tground_truth_answer: {ground_truth_answer}\n"
  "\t\u2022\tagent_answer: {agent_answer}\n\n"
  "Output ('Yes' or 'No'):"
)

Message = dict[str, str]


def system_message(question: str) -> Message:
  return {"role": "system", "content": SYSTEM_PROMPT.format(question=question)}


def round_suffix(round_index: int, max_rounds: int, multiple_choice: bool = False, instruction: bool = True) -> str:
  """What the reference appends to the last user message before generating round `round_index`; without
  `instruction` (the no-inter-turn-instruction protocol) only the first round gets the instruction."""
  text = INSTRUCTION_MULTIPLE_CHOICE if multiple_choice else INSTRUCTION
  if not instruction and round_index > 0:
    text = ""
  if round_index == max_rounds - 1:
    text += LAST_ROUND_SUFFIX
  return text


def search_result_message(memories: Mapping[str, Sequence[str]]) -> str:
  """The user message carrying a tool result: `Searched knowledge: {json}` plus the empty-result hint.

  `ensure_ascii=False` then a utf-8 round trip that drops lone surrogates, as the reference does.
  """
  text = SEARCH_RESULT_PREFIX + json.dumps(dict(memories), ensure_ascii=False).encode("utf-8", "ignore").decode(
    "utf-8")
  if len(memories) == 0:
    text += EMPTY_RESULT_SUFFIX
  return text


def judge_messages(question: str, ground_truth: str, agent_answer: str) -> list[Message]:
  """The judge conversation of `eval_answer` (`generate_messages` with the verify prompt as the user turn)."""
  return [
    {"role": "system", "content": JUDGE_SYSTEM_PROMPT},
    {"role": "user", "content": JUDGE_PROMPT.format(question=question, ground_truth_answer=ground_truth,
                                                    agent_answer=agent_answer)},
  ]


def render_chatml(messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> str:
  """ChatML rendering shared by SmolLM2 and Qwen2/Qwen3 (with a system message present, no tools).

  With Qwen3's `enable_thinking=True` the generation prompt is the plain `<|im_start|>assistant\\n`, so this is
  also the Qwen3 thinking-mode prompt for the first turn. Each message renders independently, which is what lets
  the controller append later turns to a KV cache without re-rendering the conversation.
  """
  text = "".join(render_chatml_message(m["role"], m["content"]) for m in messages)
  return text + (ASSISTANT_PREFIX if add_generation_prompt else "")


ASSISTANT_PREFIX = "<|im_start|>assistant\n"
END_OF_TURN = "<|im_end|>"


def render_chatml_message(role: str, content: str) -> str:
  return f"<|im_start|>{role}\n{content}{END_OF_TURN}\n"
