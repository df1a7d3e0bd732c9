"""python train.py rl --config configs/rl_controller_warm.py --set out_dir=runs/rl_controller_warm

Stage 1 of the shipped controller's recipe (stage 2: configs/rl_controller_direct.py; the result of this stage ships as
m3jax/data/controller/stage1_hindsight.npz, float16, and stage 2 starts from it): SmolLM2-135M-Instruct
with rank-8 LoRA adapters on every projection, written to OUT_DIR/adapter.npz (`--answerer trained --adapter
FILE`), on a 2-core CPU: 30 behaviour-cloning warm-start steps (16 training questions each, lr 1e-3) on the
hindsight expert's trajectories (`m3jax.rl.warm_start`), the held-out greedy accuracy at step 0, then `steps` DAPO
steps (`--set steps=50 --set eval_every=5`): token-mean loss, clip-higher 0.2/0.28, dynamic sampling
(mixed-outcome groups only), no KL term (DAPO drops it), one on-policy update per rollout batch so the sampler's
log-probs are the old policy's, greedy held-out accuracy every `eval_every` steps. The protocol is the
reference's 5-round [Search]/[Answer] loop over search_clip/search_node with the instruction in the first user
message only (`inter_turn_instruction=False`), which keeps trajectories short enough to train here; the answerer
reads that setting from the adapter. Training graphs come from episode seeds 0..127 (train split).

Measured on an AMD EPYC (2 cores, shared):
- stage1_hindsight.npz (these settings, code of commit af4fc6d; it shipped alone until stage 2 replaced it): 30 warm-start steps in 97 min (90-110 s/step
  quiet, 160-400 s loaded), final loss 0.075, held-out accuracy 0.667 on 24 questions; bench/controller_eval.py
  on 96 held-out questions: 0.490 (rules answerer 0.667), on the demo's perception-built memory 8/24 (rules 7/24);
- 24 warm-start steps at lr 5e-4: 0.417 on the same 24 questions; 14 steps: 2/24 on the demo episode;
- DAPO from the shipped adapter (`--set steps=8 --set eval_every=2 --set learner.optim.lr=1e-4`): 2 steps of
  9.6 and 16 min at load 4-6, held-out accuracy 0.667 -> 0.667, then stopped;
- length_bucket=256 (2-row micro-batches of rows sorted by length, each cut to its own multiple of 256): on the
  first warm-start batch (16 rows, 11,381 real tokens, T=1152) 14,080 positions computed instead of 18,432; its
  first update, compiles included, took 516 s wall / 218 s CPU (3 widths) vs 771 s / 238 s unbucketed (1
  width), same loss, interleaved in one process at load 6.8-9.2;
- learner.compute_dtype="bfloat16" is not faster here: a 2x256-token LoRA update took 6.05-6.26 s CPU vs
  5.73-6.19 s in float32 (load 10-12), so it stays off;
- long CPU runs need `sysctl -w vm.max_map_count=1048576`: at the default 65530 a 24-step run died in an XLA
  compile (LLVM "Cannot allocate memory").
"""

from m3jax.rl.dynamic_sampling import DynamicSamplingConfig
from m3jax.rl.learner import LearnerConfig, OptimConfig
from m3jax.rl.losses import LossConfig
from m3jax.rl.program import RLConfig


def get_config() -> RLConfig:
  return RLConfig(
      model="smollm2-135m-instruct", embedder="minilm", train_seeds=(0, 128), eval_seeds=(1_000_000, 1_000_008),
      lora_rank=8, lora_alpha=16.0, seed=1,
      warm_start_steps=30, warm_start_questions=16, warm_start_lr=1e-3,
      steps=0, batch_questions=4, group_size=4, max_rounds=5, inter_turn_instruction=False, max_new_tokens=48,
      temperature=0.6, top_p=0.95, top_k=20, judge="contains", advantage="grpo", recompute_old_logp=False,
      seq_bucket=128, max_seq_len=2048,
      sampling=DynamicSamplingConfig(enabled=True, max_rounds=2, carry_over=False),
      learner=LearnerConfig(loss=LossConfig(clip_low=0.2, clip_high=0.28, agg_mode="token-mean", kl_coef=0.0),
                            optim=OptimConfig(lr=3e-5, schedule="constant", weight_decay=0.0, grad_clip=1.0),
                            temperature=0.6, epochs=1, mini_batches=1, micro_batch=2, length_bucket=256,
                            remat=False, layer_loop="scan"),
      eval_every=1, eval_questions=24, out_dir="runs/rl_controller_warm", save_every=1)
