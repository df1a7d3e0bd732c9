"""python train.py rl --config configs/rl_controller_ladder_sized.py --max-minutes 85
bash runs/rl_ladder_sized/continue.cmd   # each next chunk

Issue 43's second controller run on episodes of every size: configs/rl_controller_sized.py (strict judge, half of
the questions from the perception pool, gold episodes of 3-10 clips and 2-3 people, the same 64-question dev
curve) from a different warm start: stage 1's adapter (m3jax/data/controller/stage1_hindsight.npz) cloned on the
`ladder` teacher (`m3jax.rl.warm_start.ladder_turn`: resolve the names to ids, search the question with the ids,
answer after that search, never repeat a query) for 24 steps, instead of the shipped adapter, whose `direct`
teacher answers after the first search that returns memories.

WHY: a dev measurement. The shipped controller's one search is the id lookup (62 of its 64 searches on the sized
dev questions, runs/issue43/threshold): it answers from the top-20 memories of the people the question names and
scores 0.469 against the rules answerer's 0.703, losing from 5 clips on. Its first sentence is wrong where it
fails (cutting answers to their first sentence turns 30 strict hits into 31), so the loss is in reading, not in
listing. The rules answerer searches the question itself with the ids resolved, about 3 searches a question.
On 3-clip episodes the ladder teacher lost (0.479, MODEL_CARD.md) because the id lookup had already retrieved
every clip and the fact search came back empty; episodes of 3-10 clips leave clips for it to find.

MEASURED (dev, stopped): after the 24 cloning steps the dev curve's step 0 is 22/64 = 0.344, against 36/64 =
0.562 for configs/rl_controller_sized.py's step 0 on the same 64 questions (AMD EPYC Zen 4, 2 cores). The clone
searches 2.4 times a question but reads the longer results worse. The run was stopped after 4 DAPO steps
(runs/rl_ladder_sized) and rl_sized goes on from the shipped adapter.
"""

import dataclasses
import pathlib

from m3jax.config import load_config
from m3jax.rl.program import RLConfig

HERE = pathlib.Path(__file__).resolve().parent
STAGE1 = HERE.parent / "m3jax" / "data" / "controller" / "stage1_hindsight.npz"


def get_config() -> RLConfig:
  sized = load_config(HERE / "rl_controller_sized.py")
  return dataclasses.replace(sized, init_adapter=str(STAGE1), warm_start_expert="ladder", warm_start_steps=24,
                             seed=4, out_dir="runs/rl_ladder_sized")
