"""The rules answerer on a hand-made memory: a "who" question is answered by a memory that names someone.

A well-formed memory can name nobody (the gold semantic memory of a house rule is the rule itself,
`episodes.utterance_fact`); when it is the best match for "Who gave the house rule about the milk?" the answer
must still come from a memory naming the speaker (seen: the trained writer's rule line was returned verbatim)."""

import numpy as np

from m3jax.control.answer import RuleAnswerer
from m3jax.control.controller import Question
from m3jax.memory import GraphConfig, MemoryGraph
from m3jax.memory.fixture_embedder import HashedBowEmbedder


def _graph(embed) -> MemoryGraph:
  g = MemoryGraph(GraphConfig(text_dim=embed.dim, face_dim=4, voice_dim=4))
  rng = np.random.default_rng(0)
  face = g.add_entity("face", rng.normal(size=(1, 4)))
  voice = g.add_entity("voice", rng.normal(size=(1, 4)))
  rule = "In this house, the milk goes in the fridge door."
  g.add_clip(0, [f"<face_{face}> is present.", f"<voice_{voice}> says: \"in this house, the milk goes in the fridge "
                 "door.\""], [f"Equivalence: <face_{face}>, <voice_{voice}>", f"<voice_{voice}>'s name is Sophie.",
                              rule], embed_fn=embed)
  return g


def test_who_questions_take_a_memory_naming_someone():
  embed = HashedBowEmbedder.builtin()
  answerer = RuleAnswerer([_graph(embed)], embed)
  questions = [Question("gave", "Who gave the house rule about the milk?", "Sophie.", 0),
               Question("said", "Who said the milk goes in the fridge door?", "Sophie.", 0)]
  gave, said = answerer.answer(questions)
  assert "Sophie" in gave and said == "Sophie"
  rule = answerer.answer([Question("where", "Where does the milk go in this house?", "Fridge door.", 0)])[0]
  assert "fridge door" in rule.lower()  # other questions still take the best memory, tagged or not


def test_a_name_that_opens_the_question_is_resolved_when_the_memory_knows_it():
  from m3jax.control.answer import named_people, opening_name
  from m3jax.data.questions import NOT_IN_MEMORY
  assert named_people("Victoria's drink of choice?") == ["Victoria"]  # possessive: surely a name
  assert (named_people("Victoria lost her keys; where are they?"), opening_name("Victoria lost her keys?")) == (
      [], "Victoria")
  assert opening_name("Tomorrow, who goes to the museum?") == "Tomorrow" and opening_name("Where is it?") is None
  embed = HashedBowEmbedder.builtin()
  answerer = RuleAnswerer([_graph(embed)], embed)
  opened, possessive, unknown, plain = answerer.answer([
      Question("o", "Sophie told us a house rule; where does the milk go?", "Fridge door.", 0),
      Question("p", "Sophie's rule: where does the milk go?", "Fridge door.", 0),
      Question("u", "Anna's rule: where does the milk go?", NOT_IN_MEMORY, 0),
      Question("t", "Tomorrow, where does the milk go?", "Fridge door.", 0)])
  assert "fridge door" in opened.lower() and "fridge door" in possessive.lower()
  assert unknown == NOT_IN_MEMORY  # a possessive opening the memory does not know is someone it lacks
  assert "fridge door" in plain.lower()  # an opening word the memory does not know is no name: no decline
