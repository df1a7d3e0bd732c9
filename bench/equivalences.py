"""Face–voice equivalences of memorized talking episodes with and without the active-speaker cue (issue 44, 2-3).

  python -m bench.equivalences --episodes 8 --seed0 200            # train seeds: the reported numbers
  python -m bench.equivalences --episodes 4 --seed0 1000000        # dev seeds

Each episode (`--clips` clips, 2 and 3 people alternating, `talking_faces`: the speaker's mouth moves) is rendered
and memorized end to end twice into the perception pool (`--root`, reused on a re-run): `speaker_fps=0` (today's
rule: a clip with one face and one voice votes for that pair) and `speaker_fps=5` (the cue's confident pairs vote,
nothing else). Against the script (`eval.scoring`: a face is the person of its screen slot, a voice segment the
speaker of the utterance it overlaps most):
  * per clip, the pairs that voted: precision (face and voice are one person) and recall (of the people who are
    on screen and speak in the clip, with a face and a voice perceived), on clips showing 1, 2 and 3 faces;
  * per memory, the graph's characters: joined (face node, voice node) pairs that are one person (precision) and
    the people whose face and voice are joined (recall), and identity purity / completeness;
  * the rules answerer's strict accuracy on each episode's own questions (a dev-style number: these are train
    seeds), with the paired cue − no cue difference over the same questions;
  * seconds to memorize an episode (render included) and the cue's share.
Test seeds (>= 2,000,000) are refused: the test split measures the shipped default, in bench.controller_eval.
Final line: RESULT clip_precision_2face=… clip_recall_2face=… (and _1face, _3face, for cue and nocue) graph_precision…

Measured 2026-12-05 (Intel Xeon Processor, 2 cores, load 5-7 from other jobs), 8 train episodes from seed 200
(runs/equivalences/train.log): the cue's clip votes are right 39 of 39 and find every speaking person on screen
(1-face clips 16/16, 2-face 21/21, 3-face 2/2); the one-face-one-voice rule votes only in the 16 1-face clips (2-
and 3-face recall 0). Each episode has solo clips, so both graphs end up joining all 16 people rightly; the cue joins
them from the first clip that shows them speaking, and the rules answerer gains +0.025 [+0.005, +0.049] strict
(0.490 vs 0.466, 204 questions; a dev-style number). The cue costs 0.4-4.8 s per 4-clip episode.
End to end on the 10 test episodes of bench.controller_eval, rendered talking and memorized with the cue
(`--talking-faces --speaker-fps 5`; runs/controller_eval/test_cue_*), against the same questions on today's still
renders without it: rules 0.542 vs 0.515, +0.027 [+0.008, +0.050]; the shipped controller 0.401 both, +0.000
[-0.011, +0.011] (strict, paired bootstrap, 262 questions). A 4-clip episode memorized in 33-43 s alone.
"""

from __future__ import annotations

import argparse
import json
import pathlib
from collections import defaultdict

import numpy as np

from bench import harness
from m3jax.control.answer import RuleAnswerer
from m3jax.control.controller import Question
from m3jax.data.episodes import EpisodeConfig, make_episode
from m3jax.data.questions import TEST_SEED_START
from m3jax.eval.judges import RuleJudge, score_answers
from m3jax.eval.scoring import face_person, identity_scores, load_observations, speech_person, utterance_spans
from m3jax.eval.stats import accuracy_interval, paired_bootstrap
from m3jax.memorize.perceive import PerceptionConfig
from m3jax.memorize.perception_pool import entry_key, perceived_episodes
from m3jax.memorize.pipeline import MemorizeConfig

SETTINGS = {"nocue": 0.0, "cue": 5.0}


def clip_pairs(ep, obs) -> list[tuple[int, int, int]]:
  """Per clip (faces shown, right votes, votes, people with face and voice perceived who speak, found of them)."""
  said = utterance_spans(ep)
  out = []
  for o in obs:
    faces = {f.node_id: face_person(ep, o, f) for f in o.faces}
    voices = defaultdict(list)
    for s in o.speech:
      voices[s.node_id].append(speech_person(said, o, s))
    voice = {v: max(set(p), key=p.count) for v, p in voices.items()}
    if o.speakers is not None:
      votes = [(f, v) for f, v, _ in o.speakers]
    else:
      votes = [(o.faces[0].node_id, o.voice_ids[0])] if len(o.faces) == 1 and len(voice) == 1 else []
    right = {faces[f] for f, v in votes if faces.get(f) is not None and faces[f] == voice.get(v)}
    gold = set(faces.values()) & set(voice.values())
    out.append((len(ep.clips[o.clip].present), len(right), len(votes), len(gold), len(right & gold)))
  return out


def graph_pairs(ep, obs, graph) -> tuple[int, int, int, int]:
  """(joined face–voice node pairs that are one person, joined pairs, people joined, people with both a face and
  a voice node)."""
  said = utterance_spans(ep)
  face = {f"face_{f.node_id}": face_person(ep, o, f) for o in obs for f in o.faces}
  voices = defaultdict(list)
  for o in obs:
    for s in o.speech:
      voices[f"voice_{s.node_id}"].append(speech_person(said, o, s))
  voice = {v: max(set(p), key=p.count) for v, p in voices.items()}
  reverse = graph.characters().reverse
  joined = [(pf, pv) for f, pf in face.items() for v, pv in voice.items()
            if f in reverse and reverse[f] == reverse.get(v)]
  return (sum(a == b for a, b in joined), len(joined), len({a for a, b in joined if a == b}),
          len(set(face.values()) & set(voice.values())))


def ratio(a: int, b: int) -> str:
  return f"{a / b:.3f}" if b else "NA"


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--episodes", type=int, default=8)
  ap.add_argument("--seed0", type=int, default=200, help="first seed (train < 1,000,000; dev 1,000,000+)")
  ap.add_argument("--clips", type=int, default=4)
  ap.add_argument("--root", default="runs/equivalences_pool", help="perception pool directory (entries reused)")
  args = ap.parse_args()
  if args.seed0 + args.episodes > TEST_SEED_START or args.episodes < 1:
    raise SystemExit(f"bench.equivalences: --episodes >= 1 and seeds below {TEST_SEED_START:,} (test seeds are the "
                     f"final evaluation's), got seeds {args.seed0}..{args.seed0 + args.episodes - 1}")
  print(harness.machine(), flush=True)
  from m3jax.memory.embedders import make_embedder
  embed = make_embedder("minilm")
  judge = RuleJudge("strict")
  fields, verdicts = {}, {}
  for name, fps in SETTINGS.items():
    memorize = MemorizeConfig(perception=PerceptionConfig(speaker_fps=fps))
    clips, graph_tot, ident, seconds, correct = defaultdict(lambda: np.zeros(4, int)), np.zeros(4, int), [], [], []
    for k in range(args.episodes):
      ep_cfg = EpisodeConfig(seed=args.seed0 + k, num_clips=args.clips, num_characters=2 + k % 2, talking_faces=True)
      graphs, records, _, stats = perceived_episodes(args.root, [ep_cfg.seed], ep_cfg, memorize, progress=False)
      ep = make_episode(ep_cfg)
      mem = pathlib.Path(args.root) / f"{ep.id}_{entry_key(ep_cfg, memorize)}" / "memory"
      obs = load_observations(mem)
      for faces, *row in clip_pairs(ep, obs):
        clips[min(faces, 3)] += row
      graph_tot += graph_pairs(ep, obs, graphs[0])
      ident.append(identity_scores(ep, obs, graphs[0]))
      seconds.append(stats[0]["build_seconds"])
      manifest = json.loads((mem / "manifest.json").read_text()) if (mem / "manifest.json").exists() else {}
      answers = RuleAnswerer(graphs, embed).answer(
          [Question(r.question_id, r.question, r.answer, 0, before_clip=r.before_clip, question_types=r.types)
           for r in records])
      correct += score_answers(judge, records, answers)["correct"]
      print(f"[{name}] {ep.id} ({ep_cfg.num_characters} people): {stats[0]['build_seconds']:.0f} s to memorize"
            f"{'' if stats[0]['cached'] else ' (built now)'}; speakers stage "
            f"{manifest.get('timings', {}).get('speakers', 0.0):.1f} s", flush=True)
    verdicts[name] = correct
    for faces, (right, votes, gold, found) in sorted(clips.items()):
      print(f"[{name}] clips with {faces} face(s): votes {votes}, right {right} (precision {ratio(right, votes)}); "
            f"people on screen who speak {gold}, found {found} (recall {ratio(found, gold)})")
      fields[f"clip_precision_{faces}face_{name}"] = ratio(right, votes)
      fields[f"clip_recall_{faces}face_{name}"] = ratio(found, gold)
    right, joined, people, both = graph_tot
    purity = np.mean([s["purity"] for s in ident])
    completeness = np.mean([s["completeness"] for s in ident])
    acc, lo, hi = accuracy_interval(correct)
    print(f"[{name}] graphs: joined face–voice pairs {joined}, one person {right} (precision {ratio(right, joined)}); "
          f"people joined {people} of {both} (recall {ratio(people, both)}); identity purity {purity:.3f}, "
          f"completeness {completeness:.3f}; rules answerer strict {acc:.3f} [{lo:.3f}, {hi:.3f}] on "
          f"{len(correct)} questions; {np.median(seconds):.0f} s per episode (median)", flush=True)
    fields.update({f"graph_precision_{name}": ratio(right, joined), f"graph_recall_{name}": ratio(people, both),
                   f"purity_{name}": f"{purity:.3f}", f"completeness_{name}": f"{completeness:.3f}",
                   f"rules_{name}": f"{acc:.3f}"})
  d, lo, hi = paired_bootstrap(verdicts["cue"], verdicts["nocue"])
  print(f"rules answerer, cue − no cue: strict {d:+.3f} [{lo:+.3f}, {hi:+.3f}] (paired bootstrap, 95%, "
        f"{len(verdicts['cue'])} questions)")
  print(harness.result_line(**fields, rules_diff=f"{d:.3f}", rules_diff_lo=f"{lo:.3f}", rules_diff_hi=f"{hi:.3f}",
                            episodes=args.episodes, seed0=args.seed0))


if __name__ == "__main__":
  main()
