"""The demo's answers on one memorized test episode, for a before/after check of a refactor (issue 42):

  PYTHONPATH=OLD_CHECKOUT python runs/issue42/same_answers.py MEMORY_DIR > old.json
  PYTHONPATH=.            python runs/issue42/same_answers.py MEMORY_DIR > new.json && cmp old.json new.json

Every answerer the demo offers (trained, untrained, rules) answers the demo episode's questions over the memory.
"""
import json
import sys

from m3jax.data.episodes import make_episode
from m3jax.memorize.perception_pool import DEMO_EPISODE
from m3jax.memorize.pipeline import load_memory
from m3jax.models.bert import TextEmbedder

try:
  from m3jax.control import episode_questions, make_answerer
except ImportError:  # before the refactor
  from m3jax.control.answer import episode_questions
  from m3jax.eval.demo import make_answerer

graph = load_memory(sys.argv[1])
questions = episode_questions(make_episode(DEMO_EPISODE))
embed = TextEmbedder.from_pretrained()
out = {kind: make_answerer(kind, [graph], embed).answer(questions) for kind in ("trained", "untrained", "rules")}
json.dump(out, sys.stdout, indent=1)
