"""m3jax.data: what the agent is trained and tested on, generated or shipped.

  script         the cast (real photos, voices, names) and the seeded script of an episode
  episodes       `make_episode`: a script plus its questions and gold memories (`EpisodeConfig`)
  episode_render an episode as an mp4 (photos, espeak-ng speech, optional talking mouths)
  questions      question families, the train / dev / test split by seed and phrasing (`split_of`)
  phrasings      each family's phrasings per split
  memory_qa      gold memory graphs and their questions for RL and evaluation
  m3bench        M3-Bench annotations (the released robot/web files ship in m3bench_annotations/)
"""
