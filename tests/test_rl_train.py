"""`train.py rl` end to end on the tiny config: outputs, and a resumed step identical to the uninterrupted one."""

import json
import shutil

import train

FAST = ["--set", "steps=2", "--set", "max_rounds=1", "--set", "max_new_tokens=8", "--set", "train_seeds=(0, 1)",
        "--set", "eval_seeds=(0, 0)", "--set", "seq_bucket=1024"]


def _lines(path):
  return [json.loads(l) for l in path.read_text().splitlines()]


def test_rl_train_writes_outputs_and_resumes_exactly(tmp_path):
  out = tmp_path / "run"
  assert train.main(["rl", "--config", "configs/rl_tiny.py", "--set", f"out_dir={out}", *FAST]) == 0
  full = _lines(out / "metrics.jsonl")
  assert [r["step"] for r in full] == [1, 2]
  assert (out / "curves.png").stat().st_size > 0 and any((out / "tb").iterdir())
  assert all(r["train/skipped"] == 0 for r in full) and full[1]["rollout/generated_tokens"] > 0
  shutil.rmtree(out / "ckpt" / "2")  # "killed" after step 1's checkpoint
  assert train.main(["rl", "--config", "configs/rl_tiny.py", "--set", f"out_dir={out}", *FAST]) == 0
  resumed = _lines(out / "metrics.jsonl")
  assert [r["step"] for r in resumed] == [1, 2]
  for key in ("train/loss", "train/grad_norm", "reward/total", "rollout/generated_tokens", "train/entropy"):
    assert resumed[1][key] == full[1][key], key
