"""Does the trained controller know when the memory lacks the answer? (issue 19: the unanswerable goal)

  python -m bench.decline_signal                          # the shipped controller, 3 episodes, 5 samples each
  python -m bench.decline_signal --adapter runs/rl_controller/adapter.npz --episodes 6

WHY: the shipped 135M controller declines few unanswerable questions. Before training harder for declines, this
asks whether the policy already carries a signal an abstention rule could read. Two signals, each the policy's own:
- decline log-prob: at its final answer's `Content:`, log P(" The memory does not say.") minus log P(its own
  answer), each scored as a complete answer up to the end-of-turn token (an answer cut at the token limit gets
  that token appended) by one forward pass of the policy;
- disagreement: N sampled trajectories per question (the RL rollout sampling: temperature 0.6, top-p 0.95, top-k
  20); one minus the share of samples giving the most common answer (first sentence, normalised; every decline
  counts as one answer). A policy that guesses when the memory is silent should disagree with itself there.
For each, the AUC of telling unanswerable from answerable questions (0.5 = no signal), and for self-consistency
the accuracy of "majority answer, or decline below an agreement threshold". Questions come from train-split
episodes that training never drew (seeds from 500; `train.py rl` trains on 0-127), so no held-out question picks
a threshold. Final line: RESULT auc_decline_logprob=… auc_disagreement=… n=… unanswerable=… greedy=… vote=…
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys
from collections import Counter

import numpy as np

from m3jax.control.controller import Question
from m3jax.control import make_answerer
from m3jax.eval.judges import JudgeItem, is_decline, normalize_answer
from m3jax.data.memory_qa import make_task
from m3jax.data.questions import HELDOUT_SEED_START, NOT_IN_MEMORY
from m3jax.memory.embedders import make_embedder
from bench.controller_eval import JUDGE
from bench.harness import machine, result_line


def auc(pos: list[float], neg: list[float]) -> float:
  """P(a positive scores above a negative), ties half."""
  return float(np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg]))


def answer_key(answer: str) -> str:
  """What samples vote on: the first sentence, normalised ("Emily. She is the chef." and "Emily." agree); every
  decline is one key."""
  if is_decline(answer):
    return "<decline>"
  return normalize_answer(re.split(r"(?<=[.!?])\s", answer.strip(), maxsplit=1)[0])


class ContinuationScorer:
  """Summed log-probs of continuations after a prefix, under the answerer's (merged) model; jitted per length
  bucket of 256 tokens times a power of two."""

  def __init__(self, model):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @nnx.jit
    def token_logprobs(model, tokens):
      logits, _ = model(tokens)
      lp = jax.nn.log_softmax(logits.astype(jnp.float32), -1)
      return jnp.take_along_axis(lp[:, :-1], tokens[:, 1:, None], -1)[..., 0]

    self.model, self.fn = model, token_logprobs

  def __call__(self, prefix: list[int], continuation: list[int]) -> float:
    ids = prefix + continuation
    width = 256
    while width < len(ids):
      width *= 2
    tokens = np.zeros((1, width), np.int32)
    tokens[0, :len(ids)] = ids
    lp = np.asarray(self.fn(self.model, tokens))[0]
    return float(lp[len(prefix) - 1:len(ids) - 1].sum())


def decline_margins(answerer, trajectories) -> list[float | None]:
  """Per trajectory: log P(decline) - log P(own answer) at the final answer's `Content:` (None: no answer)."""
  tok = answerer.policy.tokenizer
  scorer = ContinuationScorer(answerer.policy.sampler.model)
  end = tok.encode("<|im_end|>", add_special_tokens=False)
  decline = tok.encode(" " + NOT_IN_MEMORY, add_special_tokens=False) + end
  out = []
  for t in trajectories:
    ids, gen = t.token_ids.tolist(), np.asarray(t.generated)
    start = len(ids)
    while start and gen[start - 1]:  # the final turn: the last run of generated tokens
      start -= 1
    turn = ids[start:]
    cut = next((j for j in range(1, len(turn) + 1) if "Content:" in tok.decode(turn[:j])), None)
    if t.response is None or cut is None:
      out.append(None)
      continue
    own = turn[cut:] if turn[-1:] == end else turn[cut:] + end
    prefix = ids[:start + cut]
    out.append(scorer(prefix, decline) - scorer(prefix, own))
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--adapter", default=None, help="the controller's LoRA adapter file (default: the shipped one)")
  ap.add_argument("--episodes", type=int, default=3, help="train-split episodes (about 20 questions each)")
  ap.add_argument("--first-seed", type=int, default=500, help="first episode seed (train split, unused in training)")
  ap.add_argument("--samples", type=int, default=5, help="sampled trajectories per question")
  ap.add_argument("--slots", type=int, default=24, help="controller KV-cache rows (continuous batching)")
  args = ap.parse_args()
  if (args.episodes < 1 or args.samples < 2 or args.slots < 1 or args.first_seed < 128
      or args.first_seed + args.episodes > HELDOUT_SEED_START):
    sys.exit(f"decline_signal: episodes and slots >= 1, samples >= 2, seeds from 128 (0-127 are trained on) to "
             f"{HELDOUT_SEED_START - 1} (held out above)")
  if args.adapter and not pathlib.Path(args.adapter).is_file():
    sys.exit(f"decline_signal: adapter file not found: {args.adapter}")
  print(machine(), flush=True)
  embed = make_embedder("minilm")
  dim = int(np.asarray(embed(["x"])).shape[-1])
  graphs, records = make_task(range(args.first_seed, args.first_seed + args.episodes), embed, dim, split="train")
  qs = [Question(r.question_id, r.question, r.answer, r.memory_id, before_clip=r.before_clip, question_types=r.types)
        for r in records]
  answerer = make_answerer("trained", graphs, embed, adapter=args.adapter)
  answerer.slots = args.slots
  greedy = answerer.answer(qs)
  margins = decline_margins(answerer, answerer.trajectories)
  answerer.policy.config = dataclasses.replace(answerer.policy.config, greedy=False)
  copies = [dataclasses.replace(q, question_id=f"{q.question_id}#{k}") for q in qs for k in range(args.samples)]
  sampled = answerer.answer(copies)

  unans = [r.unanswerable for r in records]
  agree, votes = [], []
  for i in range(len(qs)):
    group = sampled[i * args.samples:(i + 1) * args.samples]
    keys = [answer_key(a) for a in group]
    top, count = Counter(keys).most_common(1)[0]
    agree.append(count / args.samples)
    votes.append((top, group[keys.index(top)]))

  def correct(answers):
    return [v.correct for v in JUDGE.judge([JudgeItem(r.question, r.answer, a) for r, a in zip(records, answers)])]

  m = [(x, u) for x, u in zip(margins, unans) if x is not None]
  auc_lp = auc([x for x, u in m if u], [x for x, u in m if not u])
  auc_dis = auc([1 - a for a, u in zip(agree, unans) if u], [1 - a for a, u in zip(agree, unans) if not u])
  g_ok, v_ok = correct(greedy), correct([a for _, a in votes])
  n_un = sum(unans)
  print(f"{len(qs)} questions from {args.episodes} train-split episodes ({n_un} unanswerable); greedy accuracy "
        f"{np.mean(g_ok):.3f}, majority of {args.samples} samples {np.mean(v_ok):.3f}")
  print(f"decline log-prob margin: AUC {auc_lp:.3f} on {len(m)} answered; median unanswerable "
        f"{np.median([x for x, u in m if u]):.2f}, answerable {np.median([x for x, u in m if not u]):.2f}")
  print(f"disagreement: AUC {auc_dis:.3f}; samples all agree on {sum(a == 1 for a, u in zip(agree, unans) if u)}/"
        f"{n_un} unanswerable, {sum(a == 1 for a, u in zip(agree, unans) if not u)}/{len(qs) - n_un} answerable")
  for tau in (0.4, 0.6, 0.8, 1.0):
    declined = [a < tau or top == "<decline>" for a, (top, _) in zip(agree, votes)]
    ok = [d if u else (not d and v) for d, u, v in zip(declined, unans, v_ok)]
    print(f"  decline below {tau:.0%} agreement: accuracy {np.mean(ok):.3f}, unanswerable declined "
          f"{sum(d for d, u in zip(declined, unans) if u)}/{n_un}, false declines "
          f"{sum(d for d, u in zip(declined, unans) if not u)}/{len(qs) - n_un}")
  print(result_line(auc_decline_logprob=f"{auc_lp:.3f}", auc_disagreement=f"{auc_dis:.3f}", n=len(qs),
                    unanswerable=n_un, greedy=f"{np.mean(g_ok):.3f}", vote=f"{np.mean(v_ok):.3f}"))


if __name__ == "__main__":
  main()
