"""One process of tests/test_multihost.py (run as a script; not collected by pytest).

  python tests/multihost_worker.py TASKS --out DIR [--port P --nproc N --pid I]

TASKS is a comma-separated list, run in order in this one process (start-up and compilation are paid once):
  steps        an SFT step (tiny thinker, rows sharded over data, each process reading its share of the batch's
               examples), then the same run resumed from its checkpoint in a new Trainer next to the original one
               continuing, and an RL learner update (tiny Decoder, mesh 2x2x2) on the global mesh; process 0
               writes DIR/steps.npz (losses, parameters) and DIR/sft_reads.npz (the example rows each process read)
  save         saves the RL learner's state after `steps` to DIR/ckpt (orbax, every process writes its shards)
  restore=SRC  restores SRC/ckpt into a freshly initialised (different seed) learner; writes DIR/restored.npz
  die          joins, then process 1 exits abruptly while process 0 waits at a barrier (the runtime must fail it)
  rl           `train.py rl`'s program (RLProgram.run) on a tiny config with dynamic sampling, mesh 2x2x2, in DIR/rl
               (resuming from DIR/rl/ckpt when there is one); process 0 writes DIR/rl.npz (per-step metrics, the
               kept groups' question ids, the final parameters)
With --nproc > 1 the process joins the pod through m3jax.distributed before any JAX computation.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from m3jax import distributed  # noqa: E402


def _sft_rows():
  from m3jax.models.omni.processor import ProcessorConfig
  from m3jax.models.omni.chat import ByteTokenizer, MemoryExample, collate, encode_example
  from m3jax.sft.run import TinyThinker
  tiny = TinyThinker(hidden=32, layers=1, heads=2, kv_heads=1, vision_hidden=16, vision_depth=1, audio_hidden=16,
                     audio_layers=1)
  proc = ProcessorConfig(video_min_pixels=28 * 28, video_max_pixels=56 * 56, image_min_pixels=28 * 28,
                         image_max_pixels=28 * 28 * 4)
  rows = []
  for i in range(4):
    rng = np.random.default_rng(i)
    frames = np.repeat(rng.integers(0, 256, (1, 56, 56, 3), dtype=np.uint8), 4, axis=0)
    audio = (0.1 * np.sin(np.arange(16000 * 2) * (0.01 + 0.001 * i))).astype(np.float32)
    crop = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    voices = {"<voice_1>": [{"start_time": "00:00", "end_time": "00:02", "asr": f"Hello, I am number {i}."}]}
    ex = MemoryExample(frames, audio, ((0, crop),), voices, json.dumps({"video_descriptions": [f"clip {i}"]}))
    rows.append(encode_example(ex, "Write the memories as JSON.", ByteTokenizer(), tiny.chat_tokens(), proc))
  return tiny.thinker_config(), rows


class _Recorded(list):
  """Example rows that remember which ones were read."""

  def __init__(self, rows):
    super().__init__(rows)
    self.read: list[int] = []

  def __getitem__(self, j):
    self.read.append(j)
    return super().__getitem__(j)


def sft_step(out: pathlib.Path) -> dict:
  import jax
  from flax import nnx

  from m3jax.models.omni.chat import collate
  from m3jax.models.omni.thinker import Thinker
  from m3jax.sft.data import ShardedBatches
  from m3jax.sft.trainer import TrainConfig, Trainer
  cfg, rows = _sft_rows()
  rows = _Recorded(rows)
  length = -(-max(len(r.ids) for r in rows) // 128) * 128
  batches = ShardedBatches(rows, 2, lambda b: collate(cfg, b, length), drop_remainder=True)  # 2 steps of 2 rows
  tcfg = TrainConfig(steps=2, learning_rate=3e-2, warmup_steps=1, loss_chunk=128)
  make = lambda: Trainer(Thinker(cfg, rngs=nnx.Rngs(0)), tcfg, out / "sft", lambda k: batches[k], lambda: [],
                         progress=False, mesh=distributed.global_mesh(2, 1, 4))
  trainer = make()
  record = trainer._train_step()  # one step, without the eval / plotting of run() (start-up time)
  trainer._save()  # every process writes its part of the orbax checkpoint
  params = lambda t: [distributed.to_host(x) for x in jax.tree.leaves(t.params)]
  first = params(trainer)
  resumed = make()  # restores step 1 (the optimizer state placed on the mesh, as a fresh one is)
  assert resumed.step == 1
  again = resumed._train_step()
  cont = trainer._train_step()
  reads = distributed.gather_objects(rows.read)
  if jax.process_index() == 0:
    np.savez(out / "sft_reads.npz", **{f"p{q}": np.array(r) for q, r in enumerate(reads)})
  return {"sft_loss": np.array([record["loss"], cont["loss"]]), "sft_resumed_loss": np.array([again["loss"]]),
          **{f"sft_p{i}": p for i, p in enumerate(first)}, **{f"sft_q{i}": p for i, p in enumerate(params(trainer))},
          **{f"sft_r{i}": p for i, p in enumerate(params(resumed))}}


def _learner(seed: int):
  from flax import nnx

  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.rl import learner as learner_lib
  cfg = DecoderConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, qk_norm=True, tie_embeddings=True)
  lcfg = learner_lib.LearnerConfig(optim=learner_lib.OptimConfig(lr=1e-2, weight_decay=0.0), mini_batches=2,
                                   micro_batch=4, seq_chunk=8, vocab_chunk=128)
  return learner_lib.Learner(Decoder(cfg, rngs=nnx.Rngs(seed)), lcfg, mesh=distributed.global_mesh(2, 2, 2))


def _rl_batch():
  n, t = 8, 16
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, 300, (n, t)).astype(np.int32)
  lengths = rng.integers(10, t + 1, n).astype(np.int32)
  pos = np.arange(t)[None, :]
  mask = ((pos >= 6) & (pos < lengths[:, None])).astype(np.float32)
  adv = rng.normal(size=(n, 1)).astype(np.float32) * mask
  return {"tokens": tokens, "lengths": lengths, "mask": mask, "advantages": adv}


def _params(learner) -> dict:
  import jax
  return {f"p{i}": distributed.to_host(x) for i, x in enumerate(jax.tree.leaves(learner.state()["params"]))}


def rl_step():
  learner = _learner(0)
  batch = _rl_batch()
  batch["old_logp"], _ = learner.logprobs(batch)
  hist = learner.update(batch, seed=1)
  return learner, {"rl_loss": np.array([h["loss"] for h in hist]), "rl_old_logp": batch["old_logp"],
                   **{f"rl_{k}": v for k, v in _params(learner).items()}}


RL_OVERRIDES = ["steps=2", "max_rounds=1", "max_new_tokens=8", "train_seeds=(0, 1)", "eval_seeds=(0, 0)",
                "seq_bucket=1024", "batch_questions=4", "group_size=2", "mesh=(2, 2, 2)", "sampling.enabled=true",
                "sampling.max_rounds=2", "learner.mini_batches=2", "learner.micro_batch=4", "learner.optim.lr=1e-3"]
RL_METRICS = ("train/loss", "train/grad_norm", "reward/total", "reward/outcome", "ds/rounds", "ds/generated_groups",
              "ds/kept_groups", "rollout/generated_tokens", "rollout/prefill_tokens", "rollout/prefill_tokens_saved")


def rl_run(out: pathlib.Path) -> dict:
  """RLProgram.run as `train.py rl` runs it, with one test double: a random tiny policy never answers, so every
  group would have the same outcome and dynamic sampling would keep none; the outcome is instead the parity of
  the sum of each trajectory's sampled tokens (a deterministic function of the rollout, judged on the process
  that sampled it), so some groups are kept and some dropped."""
  import jax

  from m3jax.config import apply_overrides, load_config
  from m3jax.rl import rollout as rollout_lib
  from m3jax.rl.program import RLProgram
  from m3jax.rl.rewards import reward_components
  cfg = apply_overrides(load_config(str(ROOT / "configs" / "rl_tiny.py")), [*RL_OVERRIDES, f"out_dir={out / 'rl'}"])
  program = RLProgram(cfg)
  sampled = program.rollout

  def rollout(records, seed, greedy=False, group=None, row_ids=None, model=None):
    trajs, parts = sampled(records, seed, greedy, group, row_ids, model)
    outcome = [float(int(np.sum(np.asarray(t.token_ids)[np.asarray(t.generated, bool)])) % 2) for t in trajs]
    parts.update(reward_components(outcome, [rollout_lib.episode_stats(t) for t in trajs], cfg.reward))
    return trajs, parts

  kept = []
  fill = program.batcher.fill

  def recorded_fill(generate, step=0):
    groups, stats = fill(generate, step)
    kept.append(",".join(g.payload[0][0].question_id for g in groups))
    return groups, stats

  program.rollout, program.batcher.fill = rollout, recorded_fill
  history = program.run()
  params = [distributed.to_host(x) for x in jax.tree.leaves(program.learner.state()["params"])]
  return {**{k: np.array([h[k] for h in history]) for k in RL_METRICS}, "kept": np.array(kept),
          "steps": np.array([len(history)]), **{f"p{i}": p for i, p in enumerate(params)}}


def main() -> None:
  ap = argparse.ArgumentParser()
  ap.add_argument("tasks")
  ap.add_argument("--out", required=True)
  ap.add_argument("--port", type=int, default=0)
  ap.add_argument("--nproc", type=int, default=1)
  ap.add_argument("--pid", type=int, default=0)
  args = ap.parse_args()
  out = pathlib.Path(args.out)
  if args.nproc > 1:
    distributed.initialize(distributed.DistributedConfig(
        enabled=True, coordinator_address=f"localhost:{args.port}", num_processes=args.nproc, process_id=args.pid,
        # a short heartbeat timeout only where a peer's death must be noticed quickly (`die`): elsewhere a process
        # starved of CPU for a few seconds on a loaded 2-core machine was declared dead mid-run (seen in CI)
        initialization_timeout=60, heartbeat_timeout=5 if "die" in args.tasks.split(",") else 120,
        shutdown_timeout=30))
  import jax
  jax.config.update("jax_default_matmul_precision", "highest")
  from m3jax import checkpoint
  lead = jax.process_index() == 0
  learner = None
  for task in args.tasks.split(","):
    if task == "steps":
      results = sft_step(out)
      learner, rl = rl_step()
      if lead:
        np.savez(out / "steps.npz", **results, **rl)
    elif task == "save":
      ckpt = checkpoint.Checkpointer(out / "ckpt")
      ckpt.save(1, learner.state(), {"step": 1})
      ckpt.close()
    elif task.startswith("restore="):
      fresh = _learner(seed=7)
      ckpt = checkpoint.Checkpointer(pathlib.Path(task.split("=", 1)[1]) / "ckpt")
      state, meta = ckpt.restore(fresh.state())
      ckpt.close()
      fresh.restore(state)
      if lead:
        np.savez(out / "restored.npz", **_params(fresh))
    elif task == "rl":
      results = rl_run(out)
      if lead:
        np.savez(out / "rl.npz", **results)
    elif task == "die":
      from jax.experimental import multihost_utils
      multihost_utils.sync_global_devices("joined")
      if jax.process_index() == 1:
        os._exit(3)  # no clean shutdown: the peer must notice through missed heartbeats
      time.sleep(1)
      multihost_utils.sync_global_devices("never")  # blocks until the runtime declares process 1 dead
      print("worker: barrier passed with a dead peer", file=sys.stderr)
      sys.exit(0)
    else:
      raise SystemExit(f"unknown task {task!r}")
  print(f"worker {jax.process_index()}: done", file=sys.stderr)


if __name__ == "__main__":
  main()
