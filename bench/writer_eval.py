"""Memory writers on held-out episodes: gold-fact recall, precision, hallucinations, and QA over their memories.

  python -m bench.writer_eval                                   # 10 held-out episodes: template, untrained llm
  python -m bench.writer_eval --adapter runs/sft_writer/writer.npz # + the trained writer
  python -m bench.writer_eval --episodes 2 --writers template,trained --adapter FILE  # what fits a busy CPU
  python -m bench.writer_eval --writers template,ceiling --answerer rules        # what an honest writer can reach
  python -m bench.writer_eval --split test --writers template,trained --adapter m3jax/data/writer/writer.npz
  python -m bench.writer_eval --asr base --talking-faces --speaker-fps 5 --answerer rules \
      --against runs/writer_eval_cue/still_tiny.jsonl   # new perception against the old one's records (dev)

Each evaluated episode (`--split dev`: seeds from 1_000_000, never trained on but used for choices; `--split test`:
seeds from 2_000_000 with the test phrasings, touched only by final evaluations) is rendered and perceived for real once (faces,
voices, Whisper; cached in --work, `writer_data.perceive_episode`); every writer then writes the memories of the
same observations. Writers: `template` (the default), `llm` (the untrained base), `trained` (`--adapter`) and
`ceiling`, which writes each clip's SFT target (`writer_data.clip_target`: the gold memories kept where the clip's
perception supports them, with the perceived ids). No writer that invents nothing can do better than `ceiling`, so
its recall bounds what perception allows: a gold fact perception missed (an undetected face, a misheard value, a
voice confused with another's) is lost to every honest writer. Per writer:
  recall      gold memories (the script's, `Episode.gold_memories`) matched by a written one: same people
              through the clip's perception, same content words (`m3jax.sft.writer_metrics`);
  precision   stored memories (after the writer's validation) that match some gold memory;
  valid tags  the writer's own memories (before validation) with at least one tag, all of the clip's;
  halluc.     per clip: tags the clip's perception does not hold + cast names no transcript of the clip says
              (before validation: what the model invented, whether or not validation then dropped it);
  dropped     memories validation removed (naming entities the clip does not hold, or an equivalence that is
              not one face and one voice);
  s/clip      the writer's wall time per clip;
  QA          the episode's questions answered over a memory rebuilt from the same perception with this
              writer's memories (`writer_metrics.replay_graph`), by `--answerer`: the shipped trained controller
              (the product's answerer, the default) or the rules baseline; one answerer for every writer.
              Judged `strict` (first sentence, no other candidate of the slot) with `contains` beside it, each
              with its 95% Wilson interval; every writer − template with a paired bootstrap interval;
  fallbacks   clips where an LLM writer's output did not parse and the template's memories were stored instead.
Final line: RESULT recall_trained=… recall_template=… precision_trained=… hallucinated_per_clip=… (the trained
writer's) qa_trained_writer=… qa_template_writer=… (strict; n/a without --adapter) … recall_ceiling=…
qa_ceiling_writer=… then per writer qa_W_lo/_hi, qa_W_contains, diff_W (W − template, strict, with _lo/_hi),
fallbacks_W, split=… judge=strict
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import time

from m3jax.control.answer import episode_questions
from m3jax.control import ANSWERERS, make_answerer
from m3jax.eval.demo import qa_verdicts
from m3jax.eval.scoring import utterance_spans
from m3jax.memorize.pipeline import default_graph_config
from m3jax.memorize.observations import ClipMemories
from m3jax.memorize.perceive import PerceptionConfig, PerceptionModels
from m3jax.perception.asr_models import ASR_MODELS, DEFAULT_ASR
from m3jax.memorize.writers import (CONTRACT_KEYS, LLMWriter, TemplateWriter, WriterOutputError,
                                 parse_writer_output, read_adapter_card, writer_chat)
from m3jax.data.episodes import make_episode
from m3jax.data.questions import HELDOUT_SEED_START, TEST_SEED_START
from m3jax.eval.stats import accuracy_interval, paired_bootstrap
from m3jax.memory.graph import MemoryGraph
from m3jax.sft.writer_data import clip_target, perceive_episode
from m3jax.sft.writer_metrics import ClipPeople, WriterScore, replay_graph, score_clip
from bench.harness import machine, result_line

ROOT = pathlib.Path(__file__).resolve().parents[1]
WRITERS = ("template", "llm", "trained", "ceiling")


def _recipe_episode():
  """The episode shape configs/sft_writer.py trains on (evaluated here with held-out seeds)."""
  spec = importlib.util.spec_from_file_location("sft_writer", ROOT / "configs" / "sft_writer.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.WRITER_EPISODE


class Recording:
  """A completion backend that keeps its last reply per conversation (the writer's raw output, pre-validation)."""

  def __init__(self, complete):
    self.complete, self.last = complete, []

  def __call__(self, conversations):
    self.last = self.complete(conversations)
    return self.last


class CeilingWriter:
  """Writes each clip's SFT target: the gold memories its perception supports (see the module docstring)."""

  def __init__(self, episode):
    self.episode, self.spans = episode, utterance_spans(episode)

  def write(self, observations):
    out = []
    for obs in observations:
      target = clip_target(self.episode, obs, self.spans)
      out.append(ClipMemories(tuple(target[CONTRACT_KEYS[0]]), tuple(target[CONTRACT_KEYS[1]])))
    return out


def write_episode(kind: str, backend, instruction: str | None, observations, episode=None):
  """(stored memories, raw memories, seconds, dropped, fell back) per clip of one episode, one clip at a time;
  `fell back`: an LLM writer's output did not parse, so the template's memories were stored."""
  if kind == "template":
    writer = TemplateWriter()
  elif kind == "ceiling":
    writer = CeilingWriter(episode)
  else:
    writer = LLMWriter(backend, **({"instruction": instruction} if instruction else {}))
  out = []
  for obs in observations:
    if backend is not None:
      backend.last = []
    dropped, failures = getattr(writer, "dropped", 0), getattr(writer, "failures", 0)
    t = time.perf_counter()
    mem = writer.write([obs])[0]
    dt = time.perf_counter() - t
    raw = list(mem.episodic) + list(mem.semantic)
    if backend is not None and backend.last:
      try:
        epi, sem = parse_writer_output(backend.last[0])
        raw = epi + sem
      except WriterOutputError:  # fell back to the template memories
        pass
    out.append((mem, raw, dt, getattr(writer, "dropped", 0) - dropped, getattr(writer, "failures", 0) > failures))
  return out


def _question_key(question_id: str) -> str:
  return question_id.replace("_talking_", "_")  # a talking rendering asks the still one's questions


def read_against(path: str, answerer: str) -> dict[str, dict]:
  """An earlier run's `--records` by the same answerer, keyed by question (one line per question)."""
  try:
    rows = [json.loads(line) for line in pathlib.Path(path).read_text().splitlines() if line.strip()]
  except (OSError, json.JSONDecodeError) as e:
    raise SystemExit(f"writer_eval --against {path}: unreadable ({e})") from None
  other = {r.get("answerer", "not recorded") for r in rows} - {answerer}
  if other:
    raise SystemExit(f"writer_eval --against {path}: answered by {', '.join(sorted(other))}, not {answerer}")
  return {_question_key(r["id"]): r for r in rows}


def against_differences(against: dict[str, dict], questions, verdicts, writers) -> dict[str, tuple]:
  """Per writer that both runs have: strict QA here − there, paired over the same questions (refuses others)."""
  keys = [_question_key(q.question_id) for q in questions]
  if sorted(keys) != sorted(against):
    raise SystemExit("writer_eval --against: that run answered other questions (same --split and --episodes?)")
  return {w: paired_bootstrap(verdicts[w, "strict"], [against[k][w]["strict"] for k in keys])
          for w in writers if all(w in against[k] for k in keys)}


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--split", default="dev", choices=("dev", "test"),
                  help="dev: seeds 1000000, ... (choices); test: seeds 2000000, ... (the final evaluation)")
  ap.add_argument("--episodes", type=int, default=10, help="evaluated episodes (the split's first seeds)")
  ap.add_argument("--adapter", default=None, help="a trained writer's adapter file (adds the trained writer)")
  ap.add_argument("--writers", default=None, help="comma-separated subset of template,llm,trained,ceiling")
  ap.add_argument("--llm", default="smollm2-135m-instruct", help="the untrained llm writer's LLM")
  ap.add_argument("--work", default="runs/writer_eval", help="rendered episodes + cached perception")
  ap.add_argument("--max-new-tokens", type=int, default=384)
  ap.add_argument("--answerer", default="trained", choices=ANSWERERS, help="who answers the QA questions")
  ap.add_argument("--slots", type=int, default=24, help="controller KV-cache rows (continuous batching)")
  ap.add_argument("--records", default=None, help="per-question JSONL: question, truth, each writer's answer and "
                  "verdicts")
  ap.add_argument("--asr", default=DEFAULT_ASR, choices=sorted(ASR_MODELS), help="the Whisper model that hears")
  ap.add_argument("--talking-faces", action="store_true", help="episodes show the speaker's mouth moving")
  ap.add_argument("--speaker-fps", type=float, default=0.0, help="perceive with the active-speaker cue at this rate")
  ap.add_argument("--against", default=None, help="--records of an earlier run on the same questions (e.g. other "
                  "perception): each writer's QA minus its QA there, paired")
  args = ap.parse_args()
  if args.episodes < 1:
    ap.error("--episodes must be >= 1")
  against = read_against(args.against, args.answerer) if args.against else None
  if args.work == ap.get_default("work") and (args.asr != DEFAULT_ASR or args.speaker_fps):
    args.work += f"_{args.asr}" + (f"_cue{args.speaker_fps:g}" if args.speaker_fps else "")
  writers = args.writers.split(",") if args.writers else ["template", "llm"] + (["trained"] if args.adapter else [])
  if any(w not in WRITERS for w in writers) or ("trained" in writers and not args.adapter):
    ap.error(f"--writers {args.writers!r}: choose from {','.join(WRITERS)} (trained needs --adapter)")
  print(machine(), flush=True)
  base = dataclasses.replace(_recipe_episode(), talking_faces=args.talking_faces)
  perception = PerceptionConfig(speaker_fps=args.speaker_fps)
  models: list[PerceptionModels] = []

  def load_models() -> PerceptionModels:
    if not models:
      models.append(PerceptionModels.load(asr=args.asr))
    return models[0]

  t = time.perf_counter()
  first = TEST_SEED_START if args.split == "test" else HELDOUT_SEED_START
  episodes = [perceive_episode(make_episode(dataclasses.replace(base, seed=first + i)), args.work, perception,
                               models=load_models, asr=args.asr) for i in range(args.episodes)]
  print(f"{args.episodes} {args.split} episodes rendered and perceived (or loaded) in {time.perf_counter() - t:.0f} s",
        flush=True)
  embed = load_models().text
  backends = {}
  if "llm" in writers:
    backends["llm"] = (Recording(writer_chat(args.llm, args.max_new_tokens)), None)
  if "trained" in writers:
    card = read_adapter_card(args.adapter)
    backends["trained"] = (Recording(writer_chat(card["base_llm"], args.max_new_tokens, adapter=args.adapter,
                                                 frequency_penalty=0.0)), card["instruction"])
  scores = {w: WriterScore() for w in writers}
  graphs = {w: [] for w in writers}  # one memory per (writer, episode), answered together at the end
  questions: list = []
  distractors: list[tuple[str, ...]] = []  # per question: the other values of its slot (the strict judge)
  dropped = {w: 0 for w in writers}
  fallbacks = {w: 0 for w in writers}
  for seen in episodes:
    ep = seen.episode
    spans = utterance_spans(ep)
    questions += [dataclasses.replace(q, graph_index=len(graphs[writers[0]])) for q in episode_questions(ep)]
    distractors += [tuple(q.get("distractors", ())) for q in ep.qa_list]
    for w in writers:
      backend, instruction = backends.get(w, (None, None))
      written = write_episode(w, backend, instruction, seen.observations, ep)
      for obs, (mem, raw, dt, n_dropped, fell_back) in zip(seen.observations, written):
        score_clip(scores[w], ep.gold_memories[obs.clip], mem, raw, obs, ClipPeople.of(ep, obs, spans))
        scores[w].seconds += dt
        dropped[w] += n_dropped
        fallbacks[w] += fell_back
      graphs[w].append(replay_graph(MemoryGraph(default_graph_config()), seen.entities, [m for m, *_ in written],
                                    [o.clip for o in seen.observations], embed))
    print(f"{ep.id}: " + ", ".join(f"{w} recall {scores[w].recall:.3f}" for w in writers), flush=True)
  answers, verdicts = {}, {}
  for w in writers:
    t = time.perf_counter()
    answerer = make_answerer(args.answerer, graphs[w], embed)
    answerer.slots = args.slots
    answers[w] = answerer.answer(questions)
    for judge in ("strict", "contains"):
      verdicts[w, judge] = qa_verdicts(questions, answers[w], judge, distractors)
    print(f"QA over the {w} writer's memories ({args.answerer} answerer): strict {sum(verdicts[w, 'strict'])}/"
          f"{len(questions)}, contains {sum(verdicts[w, 'contains'])} in {time.perf_counter() - t:.0f} s", flush=True)
  if args.records:
    with open(args.records, "w") as f:
      for i, (q, d) in enumerate(zip(questions, distractors)):
        f.write(json.dumps({"id": q.question_id, "question": q.question, "truth": q.answer, "distractors": d,
                            "answerer": args.answerer,
                            **{w: {"answer": answers[w][i], "strict": verdicts[w, "strict"][i],
                                   "contains": verdicts[w, "contains"][i]} for w in writers}}) + "\n")
  qa = {(w, j): accuracy_interval(verdicts[w, j]) for w in writers for j in ("strict", "contains")}
  acc = {w: qa[w, "strict"][0] for w in writers}
  diffs = {w: paired_bootstrap(verdicts[w, "strict"], verdicts["template", "strict"])
           for w in writers if w != "template" and "template" in writers}
  for w in writers:
    s = scores[w]
    a, lo, hi = qa[w, "strict"]
    print(f"{w:9s} recall {s.recall:.3f} ({s.recalled}/{s.gold})  precision {s.precision:.3f} ({s.correct}/"
          f"{s.written})  valid tags {s.valid_tag_share:.3f}  hallucinated/clip {s.hallucinated_per_clip:.2f}  "
          f"dropped {dropped[w]}  fallbacks {fallbacks[w]}  s/clip {s.seconds_per_clip:.2f}  "
          f"QA strict {a:.3f} [{lo:.3f}, {hi:.3f}] contains {qa[w, 'contains'][0]:.3f}"
          + (f"  − template {diffs[w][0]:+.3f} [{diffs[w][1]:+.3f}, {diffs[w][2]:+.3f}]" if w in diffs else ""))

  def fmt(w, value):
    return f"{value:.3f}" if w in scores else "n/a"

  def recall(w):
    return fmt(w, scores[w].recall if w in scores else 0)
  tr = scores.get("trained")
  fields = {"recall_trained": recall("trained"), "recall_template": recall("template"),
            "precision_trained": fmt("trained", tr.precision if tr else 0),
            "hallucinated_per_clip": fmt("trained", tr.hallucinated_per_clip if tr else 0),
            "qa_trained_writer": fmt("trained", acc.get("trained", 0)),
            "qa_template_writer": fmt("template", acc.get("template", 0)),
            "recall_llm": recall("llm"), "recall_ceiling": recall("ceiling"),
            "qa_ceiling_writer": fmt("ceiling", acc.get("ceiling", 0)), "episodes": args.episodes,
            "qa_answerer": args.answerer, "n": len(questions)}
  for w in writers:
    fields.update({f"qa_{w}_lo": f"{qa[w, 'strict'][1]:.3f}", f"qa_{w}_hi": f"{qa[w, 'strict'][2]:.3f}",
                   f"qa_{w}_contains": f"{qa[w, 'contains'][0]:.3f}", f"fallbacks_{w}": fallbacks[w]})
  for w, d in diffs.items():
    fields.update({f"diff_{w}": f"{d[0]:.3f}", f"diff_{w}_lo": f"{d[1]:.3f}", f"diff_{w}_hi": f"{d[2]:.3f}"})
  if against is not None:
    for w, d in against_differences(against, questions, verdicts, writers).items():
      print(f"{w:9s} QA strict − the same writer in {args.against}: {d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]")
      fields.update({f"vs_against_{w}": f"{d[0]:.3f}", f"vs_against_{w}_lo": f"{d[1]:.3f}",
                     f"vs_against_{w}_hi": f"{d[2]:.3f}"})
  print(result_line(**fields, asr=args.asr, speaker_fps=args.speaker_fps, split=args.split, judge="strict"))


if __name__ == "__main__":
  main()
