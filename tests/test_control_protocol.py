"""Protocol strings against the reference text, parsing edge cases, routing, annotation loading."""

import json

import pytest

from m3jax.control import prompts
from m3jax.control.parsing import ParsedTurn, choice_letter, parse_turn, parse_turn_reference, route_for
from m3jax.data.m3bench import AnnotationError, bundled_annotations, load_annotations, normalize_label, \
  parse_annotations, timestamp_to_before_clip

# The reference's `system_prompt` (m3_agent/control.py), one line as written there.
REFERENCE_SYSTEM_PROMPT = "You are given a question and some relevant knowledge. Your task is to reason about whether the provided knowledge is sufficient to answer the question. If it is sufficient, output [Answer] followed by the answer. If it is not sufficient, output [Search] and generate a query that will be encoded into embeddings for a vector similarity search. The query will help retrieve additional information from a memory bank.\n\nQuestion: {question}"  # noqa: E501

# The reference's f-string source (m3_agent/control.py), doubled braces included, resolved by Python itself.
REFERENCE_INSTRUCTION_SOURCE = '''f"""

Output the answer in the format:
Action: [Answer] or [Search]
Content: {{content}}

If the answer cannot be derived yet, the {{content}} should be a single search query that would help retrieve the missing information. The search {{content}} needs to be different from the previous.
You can get the mapping relationship between character ID and name by using search query such as: "What is the name of <character_{{i}}>" or "What is the character id of {{name}}".
After obtaining the mapping, it is best to use character ID instead of name for searching.
If the answer can be derived from the provided knowledge, the {{content}} is the specific answer to the question. Only name can appear in the answer, not character ID like <character_{{i}}>."""'''


def test_instruction_matches_reference_source():
  assert prompts.INSTRUCTION == eval(REFERENCE_INSTRUCTION_SOURCE)  # noqa: S307 (a literal)
  assert prompts.INSTRUCTION.startswith("\n\nOutput the answer in the format:\nAction: [Answer] or [Search]\n")


def test_system_first_user_last_round_and_multiple_choice_strings():
  assert prompts.SYSTEM_PROMPT == REFERENCE_SYSTEM_PROMPT
  assert prompts.system_message("Who?")["content"].endswith("memory bank.\n\nQuestion: Who?")
  assert prompts.FIRST_USER_MESSAGE == "Searched knowledge: {}"
  assert prompts.LAST_ROUND_SUFFIX == ("\n(The Action of this round must be [Answer]. If there is insufficient "
                                       "information, you can make reasonable guesses.)")
  assert prompts.round_suffix(3, 5) == prompts.INSTRUCTION
  assert prompts.round_suffix(4, 5) == prompts.INSTRUCTION + prompts.LAST_ROUND_SUFFIX
  mc = prompts.round_suffix(0, 5, multiple_choice=True)
  assert mc.endswith("the {content} is only the letter (A, B, C, or D) of the correct option.")
  assert mc.split("\n")[:-1] == prompts.INSTRUCTION.split("\n")[:-1]


def test_search_result_message_and_judge_prompt():
  mem = {"CLIP_3": ["<character_0> pours coffee", "Café ☕"]}
  assert prompts.search_result_message(mem) == "Searched knowledge: " + json.dumps(mem, ensure_ascii=False)
  assert "Café ☕" in prompts.search_result_message(mem)
  assert prompts.search_result_message({}) == ("Searched knowledge: {}\n(The search result is empty. Please try "
                                               "searching from another perspective.)")
  msgs = prompts.judge_messages("Q?", "Paris", "It is Paris")
  assert msgs[0] == {"role": "system", "content": "You are an expert in video understanding."}
  user = msgs[1]["content"]
  assert user.startswith("You are provided with a question, a ground truth answer, and an answer from an agent")
  assert "\t•\tquestion: Q?\n\t•\tground_truth_answer: Paris\n\t•\tagent_answer: It is Paris\n\n" in user
  assert user.endswith("Output ('Yes' or 'No'):")


def test_chatml_rendering_is_incremental():
  msgs = [prompts.system_message("Q"), {"role": "user", "content": "hi"}]
  full = prompts.render_chatml(msgs)
  assert full == "<|im_start|>system\n" + msgs[0]["content"] + "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n" \
    "<|im_start|>assistant\n"
  more = msgs + [{"role": "assistant", "content": "A"}, {"role": "user", "content": "B"}]
  assert prompts.render_chatml(more) == full + "A<|im_end|>\n" + prompts.render_chatml_message("user", "B") + \
    prompts.ASSISTANT_PREFIX


@pytest.mark.parametrize("text,expected", [
  ("<think>hmm</think>\nAction: [Answer]\nContent: Paris", ParsedTurn("answer", "Paris")),
  ("Action: [Search]\nContent: What is the name of <character_0>", ParsedTurn("search",
                                                                               "What is the name of <character_0>")),
  # lower-case action and field names, surrounding whitespace, trailing end-of-turn token
  ("action: [answer]\ncontent:   Bob  <|im_end|>", ParsedTurn("answer", "Bob")),
  ("ACTION: [ Search ]\nCONTENT: red kite\n\nI hope this query helps.", ParsedTurn("search", "red kite")),
  # extra text around; the last Action wins (models restate the format first)
  ("The format is Action: [Answer] or [Search].\nSo:\nAction: [Search]\nContent: where is the vase",
   ParsedTurn("search", "where is the vase")),
  ("Sure! **Action:** [Answer]\n**Content:** The blue vase.", ParsedTurn("answer", "The blue vase.")),
  # a multi-line answer is kept whole up to its first blank line: candidates piled up after it are not the answer
  ("Action: [Answer]\nContent: Alice.\nShe made coffee.", ParsedTurn("answer", "Alice.\nShe made coffee.")),
  ("Action: [Answer]\nContent: Sophie.\n \nSame as before.\n\nThe memory does not say.",
   ParsedTurn("answer", "Sophie.")),
  # a decoding loop ends at its first repeat; sentences that merely share words are kept
  ("Action: [Answer]\nContent: On the shelf. On the desk. On the desk. On the de", ParsedTurn("answer",
                                                                                      "On the shelf. On the desk.")),
  ("Action: [Answer]\nContent: Dr. Smith. Dr. Jones.", ParsedTurn("answer", "Dr. Smith. Dr. Jones.")),
  ("Action: [Answer]\nContent: On the sofa. On the desk. On the sofa. On the desk.", ParsedTurn("answer",
                                                                                          "On the sofa. On the desk.")),
  ("Action: [Answer]\nContent: Tea.\nContent: Tea.\nContent: Coffee.", ParsedTurn("answer", "Tea.")),
  # thinking mentions an action but the visible part is what counts
  ("<think>Action: [Answer] Content: X</think>Action: [Search]\nContent: Y", ParsedTurn("search", "Y")),
  # truncated thinking (no </think>) is a format error, not an action parsed from scratch text
  ("<think>Maybe Action: [Answer]\nContent: guess", ParsedTurn("format_error", None)),
  # empty content, missing content, missing action, unknown action, empty text
  ("Action: [Answer]\nContent:   ", ParsedTurn("format_error", None)),
  ("Action: [Answer]", ParsedTurn("format_error", None)),
  ("The answer is Paris.", ParsedTurn("format_error", None)),
  ("Action: [Think]\nContent: x", ParsedTurn("format_error", None)),
  ("", ParsedTurn("format_error", None)),
])
def test_parse_turn_edge_cases(text, expected):
  assert parse_turn(text) == expected


def test_reference_parse_is_fragile_where_robust_parse_is_not():
  assert parse_turn_reference("action: [answer]\ncontent: Bob") == ParsedTurn("format_error", None)
  assert parse_turn_reference("Action: [answer]\nContent: Bob") == ParsedTurn("search", "Bob")
  assert parse_turn_reference("Action: [Answer]\nContent: Bob\n") == ParsedTurn("answer", "Bob\n")
  assert parse_turn("Action: [answer]\nContent: Bob") == ParsedTurn("answer", "Bob")


def test_routing_and_choice_letters():
  assert route_for("What is the character id of Alice") == "node"
  assert route_for("character id of Bob?") == "node"
  assert route_for("What is the Character ID of Alice") == "clip"  # case-sensitive, as trained
  assert route_for("What is the name of <character_0>") == "clip"
  assert route_for("who broke the vase") == "clip"
  assert [choice_letter(a) for a in ("B", "(c)", "D. the red one", " a) yes", "Because", "")] == \
    ["B", "C", "D", "A", None, None]


def test_annotations_load_with_label_normalisation():
  robot = load_annotations(bundled_annotations("robot"))
  web = load_annotations(bundled_annotations("web"))
  assert (len(robot), len({q.video_id for q in robot})) == (1276, 100)
  assert (len(web), len({q.video_id for q in web})) == (3214, 920)
  types = {t for q in robot + web for t in q.types}
  assert types == {"Multi-Evidence Reasoning", "Person Understanding", "Cross-Modal Reasoning",
                   "General Knowledge Extraction", "Multi-Hop Reasoning"}
  assert sum("Multi-Evidence Reasoning" in q.types for q in robot) == 842
  assert all(q.before_clip == timestamp_to_before_clip(q.timestamp) for q in robot)
  assert all(q.before_clip is None for q in web)
  assert timestamp_to_before_clip("16:10") == 31 and timestamp_to_before_clip("00:43") == 0
  assert normalize_label("Human  Understanding") == "Person Understanding"


def test_annotation_errors_name_the_problem():
  with pytest.raises(AnnotationError, match="v1.*no qa_list"):
    parse_annotations({"v1": {"mem_path": "x"}})
  with pytest.raises(AnnotationError, match="v1_Q1.*'answer'"):
    parse_annotations({"v1": {"qa_list": [{"question": "q", "question_id": "v1_Q1"}]}})
  with pytest.raises(AnnotationError, match="duplicate"):
    parse_annotations({"v1": {"qa_list": [{"question": "q", "answer": "a", "question_id": "x"}] * 2}})
  with pytest.raises(AnnotationError, match="timestamp"):
    timestamp_to_before_clip("1m30")
  q = parse_annotations({"v": {"mem_path": "m.pkl", "qa_list": [
    {"question": "q", "answer": "a", "before_clip": 9, "evidence_clips": [2, 5], "options": ["x", "y"]}]}})[0]
  assert (q.evidence_distance, q.multiple_choice, q.prompt_text()) == (4, True, "q\nA. x\nB. y")
