"""`m3jax chat`: a turn continued on the kept KV cache answers as a fresh prefill of the whole conversation, and a
conversation that no longer tokenizes to the cached tokens is prefilled again, counted and reported."""

import subprocess
import sys

import numpy as np
import pytest

from m3jax.cli import Chat, chat_config
from m3jax.engine.sampling import Sampler
from m3jax.models.tokenizer import chat_ids

TURNS = ["What is the capital of France?", "And of Italy?", "Which one is bigger?"]
MAX_NEW = 8


@pytest.fixture(scope="module")
def sampler(smollm2):
  model, tok = smollm2
  return Sampler(model, chat_config(tok, MAX_NEW), tokenizer=tok)


def _check_fresh(sampler, chat):
  """The last turn equals the reply to the conversation before it from a new cache, prefilled at once: same
  tokens, log-probs within float32 rounding of the log-prob scale (they differ by far more when the cache is
  missing a token, such as the <|im_end|> sampled last, which is not in the cache until the next turn feeds it)."""
  fresh = sampler.generate([chat_ids(sampler.tokenizer, chat.messages[:-1])])
  assert chat.last.tokens == fresh.tokens and chat.messages[-1]["content"] == fresh.text[0].strip()
  got, want = chat.last.logprobs[0], fresh.logprobs[0]
  np.testing.assert_allclose(got, want, rtol=0, atol=1e-4 * max(1.0, np.abs(want).max()))


def test_continued_turns_equal_fresh_prefills_of_the_conversation(sampler, capsys):
  chat = Chat(sampler, sampler.tokenizer)
  for turn in TURNS:
    chat.say(turn)
    _check_fresh(sampler, chat)
  assert chat.reprefills == 0 and "prefilling" not in capsys.readouterr().err
  cached = chat.last.state.history[0]
  assert cached == chat_ids(sampler.tokenizer, chat.messages, add_generation_prompt=False)[:len(cached)]


def test_a_conversation_that_does_not_round_trip_is_reprefilled_and_reported(sampler, capsys):
  chat = Chat(sampler, sampler.tokenizer)
  chat.say(TURNS[0])
  chat.messages[-1]["content"] += " Indeed."  # the rendered reply no longer matches the sampled tokens
  chat.say(TURNS[1])
  assert chat.reprefills == 1 and "prefilling all" in capsys.readouterr().err
  _check_fresh(sampler, chat)
  chat.say(TURNS[2])  # the re-prefilled cache is continued again
  assert chat.reprefills == 1
  _check_fresh(sampler, chat)


def test_chat_command_reads_turns_from_stdin(sampler):
  chat = Chat(sampler, sampler.tokenizer)
  want = [chat.say(t) for t in TURNS[:2]]
  run = subprocess.run([sys.executable, "-m", "m3jax.cli", "chat", "--max-new-tokens", str(MAX_NEW)],
                       input="\n".join(TURNS[:2]) + "\n", capture_output=True, text=True, timeout=120)
  assert run.returncode == 0, run.stderr
  assert run.stdout.split(">>> ")[1:] == [w + "\n" for w in want] + [""]
  assert "prefilling" not in run.stderr
