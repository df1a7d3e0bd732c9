"""Constrained decoding: the JSON-contract automaton, its token tables, the sampler's masking, the text writer."""

import json

import jax.numpy as jnp
import numpy as np
import pytest

from m3jax.memorize.observations import ClipObservation, FaceObservation, SpeechObservation
from m3jax.control.policy import ChatCompleter
from m3jax.memorize.writers import CONTRACT_KEYS, LLMWriter, parse_writer_output, writer_constraint
from m3jax.engine.constrained import DEAD, TokenConstraint, compile_constraint, json_string_lists, token_bytes
from m3jax.models.decoder import Decoder, DecoderConfig
from m3jax.engine.sampling import Sampler, SamplingConfig

DFA = json_string_lists(CONTRACT_KEYS)
VALID = [
    '{"video_description": [], "high_level_conclusions": []}',
    '{\n\t"video_description": [\n\t\t"<face_1> waves.",  "Tab\\tand \\"quote\\" and \\u00e9"\n\t],\n'
    '\t"high_level_conclusions": ["Equivalence: <face_1>, <voice_2>"]\n}',
    '{"video_description":["caf\u00e9 \u4e2d\u6587 {not a brace} [x]"],"high_level_conclusions":["a","b"]}',
]
INVALID = [
    '{"video_descriptions": [], "high_level_conclusions": []}',     # other key spelling: not this automaton's
    '{"high_level_conclusions": [], "video_description": []}',      # key order
    '{"video_description": ["raw\nnewline"], "high_level_conclusions": []}',
    '{"video_description": [1], "high_level_conclusions": []}',
    '{"video_description": ["\\x"], "high_level_conclusions": []}',
    '{"video_description": [], "high_level_conclusions": [],}',
    '[]',
]


def _accepts(text: str) -> bool:
  s = DFA.run(text.encode())
  return s != DEAD and bool(DFA.accepting[s])


def test_automaton_accepts_exactly_the_contract():
  for text in VALID:
    assert _accepts(text), text
    json.loads(text)
  for text in INVALID:
    assert not _accepts(text), text


def test_closing_repairs_every_cut_of_a_valid_reply():
  text = VALID[1]
  for cut in range(1, len(text)):
    prefix = text[:cut]
    tail = DFA.closing(prefix.encode())
    assert tail is not None, prefix
    obj = json.loads(prefix + tail.decode())
    assert list(obj) == list(CONTRACT_KEYS)
  assert DFA.closing(b'{"video_description": [1') is None
  assert DFA.closing(VALID[0].encode()) == b""


def test_token_tables_equal_a_bytewise_run(smollm2):
  model, tok = smollm2
  tokens = token_bytes(tok)
  stop = tok.encode("<|im_end|>", add_special_tokens=False)[:1]
  c = writer_constraint(tok, model.cfg.vocab_size, stop)
  allowed, nxt = np.asarray(c.allowed), np.asarray(c.next_state)
  assert tokens[stop[0]] is None and tokens[tok.encode("{", add_special_tokens=False)[0]] == b"{"
  rng = np.random.default_rng(0)
  for s, v in zip(rng.integers(1, DFA.num_states, 3000), rng.integers(0, len(tokens), 3000)):
    want = DFA.run(tokens[v], int(s)) if tokens[v] else DEAD
    assert allowed[s, v] == (want != DEAD), (s, v, tokens[v])
    if want != DEAD:
      assert nxt[s, v] == want
  assert allowed[np.flatnonzero(DFA.accepting), stop[0]].all() and not allowed[c.start, stop[0]]
  assert np.array_equal(np.asarray(c.final), DFA.accepting)   # the contract's only accepting state is its end
  # the byte-level pieces decode back to the tokenizer's own text
  checked = 0
  for v in rng.integers(0, len(tokens), 300):
    try:
      text = tokens[v].decode() if tokens[v] else None
    except UnicodeDecodeError:    # a piece of a multi-byte character
      continue
    if text is not None:
      assert text == tok.decode([int(v)]), v
      checked += 1
  assert checked > 200


def _tiny(vocab: int) -> Decoder:
  return Decoder(DecoderConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                               num_kv_heads=1, head_dim=16))


def test_sampler_follows_a_hand_made_automaton():
  """start --5--> 1 --7--> 2 (accepting); state 3 allows nothing: rows end exactly when the automaton says."""
  V = 64
  allowed = np.zeros((4, V), bool)
  nxt = np.zeros((4, V), np.int32)
  allowed[0, 5], nxt[0, 5] = True, 1
  allowed[1, 7], nxt[1, 7] = True, 2
  final = np.array([False, False, True, False])
  sampler = Sampler(_tiny(V), SamplingConfig(max_new_tokens=8, temperature=1.0))
  c = TokenConstraint(jnp.asarray(allowed), jnp.asarray(nxt), jnp.asarray(final), jnp.int32(0))
  out = sampler.generate([[1, 2, 3], [4]], constraint=c, seed=3)
  assert out.tokens == [[5, 7], [5, 7]]
  assert all(np.all(lp == 0.0) for lp in out.logprobs)      # one allowed token: probability 1 after masking
  stuck = c._replace(start=jnp.int32(3))
  assert sampler.generate([[1, 2]], constraint=stuck).tokens == [[]]
  free = sampler.generate([[1, 2]], SamplingConfig(max_new_tokens=8, temperature=1.0))
  assert len(free.tokens[0]) == 8                            # without a constraint: unchanged behaviour


def test_random_model_output_is_always_a_valid_contract_prefix(smollm2):
  """A random model samples freely inside the mask: every reply stays a valid prefix and parses after repair."""
  _, tok = smollm2
  V = len(tok)
  stop = tok.encode("<|im_end|>", add_special_tokens=False)[:1]
  c = compile_constraint(DFA, token_bytes(tok), V, stop)
  sampler = Sampler(_tiny(V), SamplingConfig(max_new_tokens=48, temperature=1.0, stop_token_ids=tuple(stop)), tok)
  prompts = [tok.encode("Write JSON.", add_special_tokens=False), [1, 2, 3, 4, 5, 6, 7]] * 3
  out = sampler.generate(prompts, constraint=c, seed=11)
  assert len(set(map(tuple, out.tokens))) > 1
  for ids in out.tokens:
    text = tok.decode(ids, skip_special_tokens=True)
    assert DFA.run(text.encode()) != DEAD, text
    epi, sem = parse_writer_output(text)
    assert isinstance(epi, list) and isinstance(sem, list)


def test_frequency_penalty_stops_greedy_repetition():
  sampler = Sampler(_tiny(64), SamplingConfig(max_new_tokens=24, greedy=True))
  plain = sampler.generate([[1, 2, 3]]).tokens[0]
  assert len(set(plain)) < len(plain)                        # a random tiny model loops greedily
  penalised = sampler.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=24, greedy=True,
                                                           frequency_penalty=1e4)).tokens[0]
  assert len(set(penalised)) == len(penalised) and penalised[0] == plain[0]
  presence = sampler.generate([[1, 2, 3]], SamplingConfig(max_new_tokens=24, greedy=True,
                                                          presence_penalty=1e4)).tokens[0]
  assert presence == penalised


def test_vocab_mismatch_is_a_clear_error(smollm2):
  _, tok = smollm2
  c = compile_constraint(DFA, token_bytes(tok), len(tok))
  with pytest.raises(ValueError, match="constraint covers"):
    Sampler(_tiny(64), SamplingConfig(max_new_tokens=4)).generate([[1]], constraint=c)


@pytest.mark.slow
def test_llm_writer_on_smollm2_writes_parsed_memories(smollm2):
  """The embedded 135M model never wrote the contract unaided; constrained, its replies parse (no fallback)."""
  model, tok = smollm2
  stop = tuple(tok.encode("<|im_end|>", add_special_tokens=False)[:1])
  cfg = SamplingConfig(max_new_tokens=64, greedy=True, stop_token_ids=stop)
  chat = ChatCompleter(Sampler(model, cfg), tok, cfg, writer_constraint(tok, model.cfg.vocab_size, stop))
  writer = LLMWriter(chat, max_retries=0)
  clip = ClipObservation(0, 0.0, 30.0, (FaceObservation(3, 10, 0.0, 29.0),),
                         (SpeechObservation(5, 1.0, 4.0, "Hi, my name is Anna. I love green tea."),))
  mem = writer.write([clip])[0]
  assert writer.failures == 0
  assert mem.episodic and not any("is present." in m for m in mem.episodic)   # the model's words, not templates
