"""Runs in chunks (m3jax.chunks): `train.py rl` over 3 chunks equals the uninterrupted run bit for bit (adapter,
optimizer state, curve), and so does an SFT run; a chunk killed mid-way resumes from its last checkpoint and loses
only the steps after it. Chunk boundaries here are step counts (`chunk.max_steps`), never the clock; the clock's
rule is tested alone with a fake clock."""

import json
import pathlib
import shlex

import jax
import numpy as np
import pytest

import train
from m3jax import chunks
from m3jax.chunks import ChunkBudget, ChunkConfig

# the tiny policy, one training graph, one-round trajectories: a step costs seconds
FAST = ["--set", "max_rounds=1", "--set", "max_new_tokens=8", "--set", "train_seeds=(0, 1)",
        "--set", "eval_seeds=(0, 0)", "--set", "seq_bucket=1024", "--set", "lora_rank=4",
        "--set", "warm_start_steps=1", "--set", "warm_start_questions=2", "--set", "steps=2", "--set", "save_every=2"]
UNTIMED = ["--set", "chunk.max_minutes=0"]  # a loaded machine must not move a boundary


def _args(out, *extra):
  return ["rl", "--config", "configs/rl_tiny.py", "--set", f"out_dir={out}", *FAST, *UNTIMED, *extra]


def _continue(out, capsys) -> str:
  """Runs the command `continue.cmd` names, as a shell would (from the repository root); returns its last line."""
  line = (out / "continue.cmd").read_text().splitlines()[-1]
  words = shlex.split(line)
  assert words[:2] == ["python", "train.py"], line
  assert train.main(words[2:]) == 0
  return capsys.readouterr().out.strip().splitlines()[-1]


def _curve(path):
  """metrics.jsonl without the wall-clock fields (which no two runs share)."""
  rows = [json.loads(l) for l in path.read_text().splitlines()]
  return [{k: v for k, v in r.items() if not (k.startswith(("time/", "perf/")) or k.endswith("time_s"))}
          for r in rows]


def _state(out):
  """The newest checkpoint's arrays (adapters, optimizer state, step) and metadata (data position, sampler)."""
  import orbax.checkpoint as ocp
  manager = ocp.CheckpointManager(pathlib.Path(out / "ckpt").absolute(), item_names=("arrays", "meta"))
  step = manager.latest_step()
  got = manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(),
                                                      meta=ocp.args.JsonRestore()))
  manager.close()
  return step, jax.tree.map(np.asarray, got["arrays"]), got["meta"]


def _same_run(a, b):
  step_a, arrays_a, meta_a = _state(a)
  step_b, arrays_b, meta_b = _state(b)
  assert step_a == step_b and meta_a == meta_b
  flat_a, flat_b = jax.tree.leaves_with_path(arrays_a), jax.tree.leaves_with_path(arrays_b)
  assert [p for p, _ in flat_a] == [p for p, _ in flat_b] and len(flat_a) > 10
  for (path, x), (_, y) in zip(flat_a, flat_b):
    assert x.dtype == y.dtype and np.array_equal(x, y), jax.tree_util.keystr(path)
  with np.load(a / "adapter.npz") as za, np.load(b / "adapter.npz") as zb:
    assert za.files == zb.files and all(np.array_equal(za[k], zb[k]) for k in za.files)
  assert _curve(a / "metrics.jsonl") == _curve(b / "metrics.jsonl")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  out = tmp_path_factory.mktemp("rl") / "full"
  assert train.main(_args(out)) == 0
  return out


def test_each_step_records_its_compiling_within_its_wall_time(uninterrupted):
  """`time/compile_s` covers the whole step, the learner's programs included (`m3jax.rl.step_work`)."""
  rows = map(json.loads, (uninterrupted / "metrics.jsonl").read_text().splitlines())
  steps = [r for r in rows if "time/learn_s" in r]
  assert steps
  for r in steps:
    wall = r["time/rollout_s"] + r["time/learn_s"]
    assert 0 <= r["time/learner_compile_s"] <= r["time/compile_s"] <= wall + 1.0, r


def test_rl_run_in_three_chunks_equals_the_uninterrupted_run(uninterrupted, tmp_path, capsys):
  """Chunk 1: the warm start; chunk 2: DAPO step 1 (saved at the chunk's end, off the save_every=2 schedule);
  chunk 3: step 2. Each chunk is started by the command the previous one wrote."""
  out = tmp_path / "run"
  assert train.main(_args(out, "--set", "chunk.max_steps=1")) == 0
  last = capsys.readouterr().out.strip().splitlines()[-1]
  assert last.startswith("chunk ended at step 0/2; continue with: python train.py rl ") and "max_steps=1" in last
  assert sorted(p.name for p in (out / "ckpt").iterdir() if p.name.isdigit()) == ["0"]
  assert _continue(out, capsys).startswith("chunk ended at step 1/2; continue with:")
  assert sorted(p.name for p in (out / "ckpt").iterdir() if p.name.isdigit()) == ["1"]  # pruned: one to commit
  assert _continue(out, capsys) == f"run finished at step 2/2 ({out})"
  log = json.loads((out / "chunks.json").read_text())
  assert log["finished"] and [(c["from_step"], c["to_step"]) for c in log["chunks"]] == [(0, 0), (0, 1), (1, 2)]
  _same_run(uninterrupted, out)


def test_rl_chunk_killed_mid_way_resumes_from_its_last_checkpoint(uninterrupted, tmp_path, capsys, monkeypatch):
  """Killed in DAPO step 2 (save_every=2: step 1 was logged, never saved): the restart continues from the step-0
  checkpoint, does step 1 again, drops the killed chunk's record of it, and ends as the uninterrupted run."""
  from m3jax.rl import program as program_lib

  out = tmp_path / "run"
  step_fn = program_lib.RLProgram.train_step

  def killed_at_step_2(self, it, step):
    if step == 2:
      raise KeyboardInterrupt("killed")
    return step_fn(self, it, step)

  monkeypatch.setattr(program_lib.RLProgram, "train_step", killed_at_step_2)
  with pytest.raises(KeyboardInterrupt):
    train.main(_args(out))
  monkeypatch.setattr(program_lib.RLProgram, "train_step", step_fn)
  assert [r["step"] for r in _curve(out / "metrics.jsonl")] == [0, 1]
  assert _state(out)[0] == 0
  assert _continue(out, capsys) == f"run finished at step 2/2 ({out})"
  _same_run(uninterrupted, out)


def test_the_clock_ends_a_chunk_before_a_step_that_would_pass_the_budget():
  now = [100.0]
  budget = ChunkBudget(ChunkConfig(max_minutes=10.0), started=0.0, clock=lambda: now[0])
  assert not budget.exhausted()  # never before the first step, however late
  now[0] = 300.0
  budget.step_done()  # a step of 200 s, ending at 300 s
  assert not budget.exhausted()  # 300 + 200 <= 600
  now[0] = 450.0
  budget.step_done()  # 150 s; the longest stays 200
  assert budget.longest == 200.0 and budget.exhausted()  # 450 + 200 > 600
  assert not ChunkBudget(ChunkConfig(max_minutes=0.0), started=0.0, clock=lambda: 1e9).exhausted()
  steps = ChunkBudget(ChunkConfig(max_minutes=0.0, max_steps=2))
  steps.step_done()
  assert not steps.exhausted()
  steps.step_done()
  assert steps.exhausted()
  with pytest.raises(ValueError, match="max_minutes"):
    ChunkConfig(max_minutes=-1.0)


def test_train_py_max_minutes_sets_the_chunk_budget():
  import argparse
  args = argparse.Namespace(config="configs/rl_tiny.py", overrides=["steps=1"], max_minutes=45.0)
  assert train._load(args).chunk == ChunkConfig(max_minutes=45.0)
  assert chunks.command("train.py", ["rl", "--set", "out_dir=runs/a b"]) == "python train.py rl --set 'out_dir=runs/a b'"


# --------------------------------------------------------------------------------------------------------- SFT
def _sft_trainer(out, chunk=ChunkConfig(max_minutes=0.0)):
  """A tiny text decoder with LoRA adapters on fixed random token batches (batch k is a function of k)."""
  from flax import nnx

  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.models.lora import LoRAConfig, attach
  from m3jax.sft.loss import TextBatch
  from m3jax.sft.trainer import TrainConfig, Trainer

  model = Decoder(DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                                num_kv_heads=1, head_dim=16), rngs=nnx.Rngs(0))
  attach(model, LoRAConfig(2, 4.0), seed=0)

  def batch(k):
    ids = np.random.default_rng(k).integers(0, 64, (2, 16)).astype(np.int32)
    return TextBatch(ids, np.array([16, 12], np.int32), np.roll(ids, -1, axis=1), np.ones((2, 16), np.float32))

  cfg = TrainConfig(steps=6, learning_rate=1e-2, warmup_steps=2, loss_chunk=16, eval_every=3, checkpoint_every=4)
  return Trainer(model, cfg, out, batch, lambda: [batch(1000)], progress=False, chunk=chunk)


def _sft_same(a, b):
  assert a.step == b.step == 6
  for x, y in zip(jax.tree.leaves((a.params, a.opt_state)), jax.tree.leaves((b.params, b.opt_state))):
    assert np.array_equal(np.asarray(x), np.asarray(y))
  rows = lambda t: [{k: v for k, v in json.loads(l).items() if k not in ("tokens_per_s", "seconds")}
                    for l in (t.out / "metrics.jsonl").read_text().splitlines()]
  assert rows(a) == rows(b)


def test_sft_run_in_three_chunks_equals_the_uninterrupted_run_and_a_killed_one_resumes(tmp_path):
  full = _sft_trainer(tmp_path / "full")
  full.run()
  for _ in range(3):  # steps 1-2 (saved at the chunk's end), 3-4 (checkpoint_every), 5-6
    chunked = _sft_trainer(tmp_path / "chunked", ChunkConfig(max_minutes=0.0, max_steps=2))
    chunked.run()
    assert sorted(chunked.ckpt.all_steps()) == [chunked.step] or chunked.finished
  assert chunked.summary() == {"start_step": 4, "step": 6, "steps": 6, "finished": True}
  _sft_same(full, chunked)
  _sft_trainer(tmp_path / "killed").run(kill_after=5)  # checkpoint at 4; step 5 logged, then killed
  resumed = _sft_trainer(tmp_path / "killed")
  assert resumed.step == 4
  resumed.run()
  _sft_same(full, resumed)
