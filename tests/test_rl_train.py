"""`train.py rl` end to end on the tiny config: outputs, and a resumed step identical to the uninterrupted one."""

import json
import shutil

import pytest

import train

FAST = ["--set", "steps=2", "--set", "max_rounds=1", "--set", "max_new_tokens=8", "--set", "train_seeds=(0, 1)",
        "--set", "eval_seeds=(0, 0)", "--set", "seq_bucket=1024"]


def _lines(path):
  return [json.loads(l) for l in path.read_text().splitlines()]


@pytest.mark.parametrize("lora_rank", [0, 4])
def test_rl_train_writes_outputs_and_resumes_exactly(tmp_path, lora_rank):
  """With a one-step warm start (logged as step 0), which a resumed run does not repeat; with LoRA the
  checkpoint holds the adapters alone."""
  out = tmp_path / "run"
  args = ["rl", "--config", "configs/rl_tiny.py", "--set", f"out_dir={out}", *FAST, "--set", "warm_start_steps=1",
          "--set", "warm_start_questions=2", "--set", f"lora_rank={lora_rank}"]
  assert train.main(args) == 0
  full = _lines(out / "metrics.jsonl")
  assert [r["step"] for r in full] == [0, 1, 2] and full[0]["warm/tokens"] > 0
  full = full[1:]
  assert (out / "curves.png").stat().st_size > 0 and any((out / "tb").iterdir())
  assert all(r["train/skipped"] == 0 for r in full) and full[1]["rollout/generated_tokens"] > 0
  # group_size=2: each group's second row forks the first's prefilled prompt instead of prefilling it again
  assert all(0 < r["rollout/prefill_tokens_saved"] <= r["rollout/prefill_tokens"] for r in full)
  shutil.rmtree(out / "ckpt" / "2")  # "killed" after step 1's checkpoint
  assert train.main(args) == 0
  resumed = _lines(out / "metrics.jsonl")
  assert [r["step"] for r in resumed] == [0, 1, 2]
  resumed = resumed[1:]
  for key in ("train/loss", "train/grad_norm", "reward/total", "rollout/generated_tokens", "train/entropy"):
    assert resumed[1][key] == full[1][key], key
  if lora_rank:  # a run that starts from this run's adapter (init_adapter) holds its values before training
    import numpy as np
    from m3jax.config import load_config
    from m3jax.rl.program import load_model
    cfg = load_config("configs/rl_tiny.py", [f"lora_rank={lora_rank}", f"init_adapter={out / 'adapter.npz'}"])
    model = load_model(cfg)[0]
    with np.load(out / "adapter.npz") as z:
      stored = {k: z[k] for k in z.files if k != "__meta__"}
    loaded = {k: np.asarray(v[...]) for k, v in vars(model.lora).items() if k in stored}
    assert loaded.keys() == stored.keys() and all(np.array_equal(loaded[k], stored[k]) for k in stored)
    with pytest.raises(ValueError, match="rank/alpha/targets"):
      load_model(load_config("configs/rl_tiny.py", ["lora_rank=2", f"init_adapter={out / 'adapter.npz'}"]))


def test_rl_train_with_a_local_llm_judge(tmp_path):
  """judge=llm loads its own frozen model (here a tiny random Llama with the SmolLM2 tokenizer, saved as an HF
  directory), separate from the policy; its strict Yes/No verdicts score the answers and a step trains."""
  import dataclasses

  import torch
  import transformers

  from m3jax.eval.judges import JudgeItem, LocalLLMJudge
  from m3jax.config import apply_overrides, load_config
  from m3jax.models.tokenizer import load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path
  from m3jax.rl.program import RLProgram

  tok = load_tokenizer(smollm2_path())
  judge_dir = tmp_path / "judge"
  torch.manual_seed(0)
  transformers.LlamaForCausalLM(transformers.LlamaConfig(
      vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
      num_key_value_heads=1)).save_pretrained(judge_dir)
  tok.save_pretrained(judge_dir)
  cfg = apply_overrides(load_config("configs/rl_tiny.py"), [a for a in FAST if a != "--set"])
  cfg = dataclasses.replace(cfg, steps=1, judge="llm", judge_model=str(judge_dir), out_dir=str(tmp_path / "run"))
  program = RLProgram(cfg)
  assert isinstance(program.judge, LocalLLMJudge)
  assert program.judge.complete.sampler.model is not program.model      # frozen, never the trained policy
  verdicts = program.judge.judge([JudgeItem("Who cooks?", "Anna", "Anna cooks."), JudgeItem("Who?", "Ben", "")])
  assert not verdicts[0].valid and verdicts[0].raw and not verdicts[0].correct   # random model: neither Yes nor No
  assert verdicts[1].valid and not verdicts[1].correct and verdicts[1].raw == ""  # empty answer: no call
  history = program.run()
  assert len(history) == 1 and "reward/judge_invalid" in history[0]


def test_warm_start_survives_crashes_in_itself_and_after_it(tmp_path, monkeypatch):
  """A crash in the second warm-start step resumes from the first; a crash in the first DAPO step leaves the
  step-0 checkpoint and adapter.npz of the cloned policy, and the restart does not clone again. The step-0 and
  step-1 records then equal an uninterrupted run's."""
  import dataclasses

  import numpy as np

  from m3jax.config import apply_overrides, load_config
  from m3jax.models.lora import read_adapter_meta
  from m3jax.rl import program as program_lib

  base = apply_overrides(load_config("configs/rl_tiny.py"), [a for a in FAST if a != "--set"])
  cfg = lambda name: dataclasses.replace(base, steps=1, warm_start_steps=2, warm_start_questions=2, lora_rank=4,
                                         out_dir=str(tmp_path / name))
  program_lib.RLProgram(cfg("full")).run()

  build, calls = program_lib.rollout.build_batch, []

  def crash_on_second(*a, **kw):
    calls.append(1)
    if len(calls) == 2:
      raise RuntimeError("killed in warm-start step 2")
    return build(*a, **kw)

  monkeypatch.setattr(program_lib.rollout, "build_batch", crash_on_second)
  with pytest.raises(RuntimeError, match="warm-start step 2"):
    program_lib.RLProgram(cfg("run")).run()
  monkeypatch.setattr(program_lib.rollout, "build_batch", build)

  def dies(*a, **kw):
    raise RuntimeError("killed in DAPO")

  program = program_lib.RLProgram(cfg("run"))
  monkeypatch.setattr(program, "train_step", dies)
  monkeypatch.setattr(program_lib.rollout, "build_batch", lambda *a, **kw: calls.append(1) or build(*a, **kw))
  with pytest.raises(RuntimeError, match="killed in DAPO"):
    program.run()
  assert len(calls) == 3  # only warm-start step 2 ran again
  out = tmp_path / "run"
  assert (out / "ckpt" / "0").is_dir() and not (out / "warm_ckpt").exists()
  with np.load(out / "adapter.npz") as z:  # the cloned adapters, exported before DAPO
    assert read_adapter_meta(out / "adapter.npz")["steps"] == 0 and len(z.files) > 1
    for key in set(z.files) - {"__meta__"}:
      np.testing.assert_array_equal(z[key], np.asarray(getattr(program.model.lora, key)[...]))

  def clones_again(*a, **kw):
    raise AssertionError("the warm start ran again")

  program = program_lib.RLProgram(cfg("run"))
  monkeypatch.setattr(program, "warm_start", clones_again)
  program.run()
  full, resumed = _lines(tmp_path / "full" / "metrics.jsonl"), _lines(out / "metrics.jsonl")
  assert [r["step"] for r in resumed] == [r["step"] for r in full] == [0, 1]
  for key in ("warm/loss", "warm/grad_norm", "warm/tokens"):
    assert resumed[0][key] == full[0][key], key
  for key in ("train/loss", "train/grad_norm", "reward/total", "rollout/generated_tokens"):
    assert resumed[1][key] == full[1][key], key


def test_the_controller_recipe_reproduces_from_the_repository():
  """The shipped controller's six stages chain through files in the repository: configs/rl_controller_warm.py makes
  stage1_hindsight.npz, configs/rl_controller_direct.py stage2_direct.npz from it, configs/rl_controller.py (DAPO)
  stage3_dapo.npz (shipped as controller.npz until 2026-12-08), configs/rl_controller_sized.py, _explore.py and
  _curriculum.py continue it (runs/rl_sized, runs/rl_explore), and the shipped file is the curriculum run at its
  step 74. Each config starts from the file the stage before made; each file's metadata names the settings of the
  config that made it."""
  import pathlib

  from m3jax.control import SHIPPED_CONTROLLER
  from m3jax.config import apply_overrides, load_config
  from m3jax.models.lora import read_adapter_meta

  here = pathlib.Path(SHIPPED_CONTROLLER).parent
  names = ("rl_controller_warm", "rl_controller_direct", "rl_controller", "rl_controller_sized",
           "rl_controller_explore", "rl_controller_curriculum")
  stages = [load_config(f"configs/{name}.py") for name in names]
  stages[-1] = apply_overrides(stages[-1], ["steps=74"])  # the shipped adapter is the curriculum run's step 74
  files = [here / "stage1_hindsight.npz", here / "stage2_direct.npz", here / "stage3_dapo.npz",
           pathlib.Path("runs/rl_sized/adapter.npz"), pathlib.Path("runs/rl_explore/adapter.npz"), SHIPPED_CONTROLLER]
  renamed = {"stage3_dapo.npz": "controller.npz"}  # the sized run started from it under its shipped name
  for k, (cfg, path) in enumerate(zip(stages, files)):  # file k was made by stage k
    info = read_adapter_meta(path, "controller")
    assert (int(info["rank"]), float(info["alpha"]), tuple(info["targets"])) == (
        cfg.lora_rank, cfg.lora_alpha, tuple(cfg.lora_targets)), path
    assert (info["seed"], info["warm_start_steps"], info["steps"]) == (cfg.seed, cfg.warm_start_steps, cfg.steps), path
    if k:
      start = pathlib.Path(cfg.init_adapter)
      assert start.resolve() == files[k - 1].resolve(), (names[k], start)
      assert info["init_adapter"] == renamed.get(start.name, start.name), path
    else:
      assert info.get("init_adapter", "") == "", path
  assert read_adapter_meta(files[1], "controller")["warm_start_expert"] == stages[1].warm_start_expert


def test_unanswerable_and_family_repeats_draw_their_questions_that_often_per_pass(tmp_path):
  import collections
  import dataclasses

  from m3jax.config import apply_overrides, load_config
  from m3jax.rl.program import RLProgram

  base = apply_overrides(load_config("configs/rl_tiny.py"), [a for a in FAST if a != "--set"])
  program = RLProgram(dataclasses.replace(base, unanswerable_repeat=3, out_dir=str(tmp_path)))
  records = program.train_records
  unanswerable = {r.question_id for r in records if r.unanswerable}
  assert unanswerable and len(unanswerable) < len(records)
  n = len(records) + 2 * len(unanswerable)
  drawn = collections.Counter(program.dataset[i].question_id for i in range(n))  # one pass
  assert drawn == {r.question_id: 3 if r.question_id in unanswerable else 1 for r in records}
  with pytest.raises(ValueError, match="unanswerable_repeat"):
    dataclasses.replace(base, unanswerable_repeat=0)
  # family_repeat multiplies: an unanswerable question of a repeated family is drawn 3 x 2 times a pass
  family = sorted({r.family for r in records if r.question_id in unanswerable})[0]
  program = RLProgram(dataclasses.replace(base, unanswerable_repeat=3, family_repeat=((family, 2),),
                                          out_dir=str(tmp_path)))
  want = {r.question_id: (3 if r.question_id in unanswerable else 1) * (2 if r.family == family else 1)
          for r in program.train_records}
  drawn = collections.Counter(program.dataset[i].question_id for i in range(sum(want.values())))
  assert drawn == want and max(want.values()) == 6
  with pytest.raises(ValueError, match="no training question has"):
    RLProgram(dataclasses.replace(base, family_repeat=(("no_such_family", 2),), out_dir=str(tmp_path)))
  with pytest.raises(ValueError, match="family_repeat"):
    dataclasses.replace(base, family_repeat=((family, 0),))


def test_sized_episodes_reach_training_and_a_curve_spread_over_episodes(tmp_path):
  """RLConfig.episode_sizes draws each training and curve episode's size; the curve's questions come from every
  held-out episode in turn (a large first episode would fill it alone)."""
  import dataclasses

  from m3jax.config import apply_overrides, load_config
  from m3jax.data.memory_qa import EpisodeSizes
  from m3jax.rl.program import RLProgram

  cfg = apply_overrides(load_config("configs/rl_tiny.py"), [a for a in FAST if a != "--set"])
  sizes = EpisodeSizes(clips=(3, 10), people=(2, 3))
  cfg = dataclasses.replace(cfg, train_seeds=(0, 3), eval_seeds=(1_000_000, 1_000_003), eval_questions=6,
                            episode_sizes=sizes, out_dir=str(tmp_path / "run"))
  program = RLProgram(cfg)
  shapes = [sizes.episode(cfg.episode, s) for s in (*range(0, 3), *range(1_000_000, 1_000_003))]
  assert len({(e.num_clips, e.num_characters) for e in shapes}) > 1
  assert [r.memory_id for r in program.eval_records] == [3, 4, 5, 3, 4, 5]


def test_taura_takes_its_entropies_from_the_rollout(tmp_path, monkeypatch):
  """With the sampler's log-probs as the old policy (recompute_old_logp=False), a TAURA step runs no learner
  pass for entropies: the rollout recorded them, and they equal the learner's entropies of the same tokens under
  the same (not yet updated) policy, up to float rounding (the rollout decodes with the adapters merged)."""
  import dataclasses

  import numpy as np

  from m3jax.config import apply_overrides, load_config
  from m3jax.rl import program as program_lib

  cfg = apply_overrides(load_config("configs/rl_tiny.py"), [a for a in FAST if a != "--set"])
  with pytest.raises(ValueError, match="learner.temperature"):
    dataclasses.replace(cfg, recompute_old_logp=False)
  cfg = dataclasses.replace(cfg, steps=1, advantage="taura", recompute_old_logp=False, lora_rank=4,
                            learner=dataclasses.replace(cfg.learner, temperature=cfg.temperature),
                            out_dir=str(tmp_path / "run"))
  program = program_lib.RLProgram(cfg)
  seen, update = [], program.learner.update

  def learner_pass(*a, **kw):
    raise AssertionError("TAURA ran a learner pass for its entropies")

  def check_then_update(batch, seed):
    seen.append(batch)
    monkeypatch.undo()
    want = np.asarray(program.learner.logprobs(batch)[1])
    mask = batch["mask"] > 0
    got = seen_entropy[-1]
    assert mask.any() and got[mask].min() > 0
    np.testing.assert_allclose(got[mask], want[mask], rtol=1e-3, atol=1e-4)
    return update(batch, seed)

  seen_entropy = []
  token_advantages = program_lib.adv_lib.token_advantages
  monkeypatch.setattr(program_lib.adv_lib, "token_advantages",
                      lambda seq, mask, **kw: seen_entropy.append(np.asarray(kw.get("entropy"))) or
                      token_advantages(seq, mask, **kw))
  monkeypatch.setattr(program.learner, "logprobs", learner_pass)
  monkeypatch.setattr(program.learner, "update", check_then_update)
  program.run()
  assert len(seen) == 1


def test_rollout_ahead_draws_what_a_serial_run_draws_and_resumes_exactly_between_chunks(tmp_path, monkeypatch):
  """rollout_ahead: step s + 1's groups are rolled out beside step s's update, with the parameters that update
  starts from. With lr=1e-30 (the policy does not move in float32) every step therefore sees exactly the serial
  run's groups; with training, a run stopped after step 1 (a chunk's end, step 2's groups already rolled out and
  kept beside the checkpoint) resumes into the uninterrupted run's steps 2 and 3. A random tiny policy never
  answers, so a reward that depends on its sampled tokens (a stand-in search bonus) gives the groups advantages."""
  import dataclasses

  import numpy as np

  from m3jax.config import apply_overrides, load_config
  from m3jax.rl import program as program_lib

  stats = program_lib.rollout.episode_stats

  def token_bonus(t):  # 0 or 1 "searches", from the sampled tokens
    return dataclasses.replace(stats(t), searches=int(np.asarray(t.token_ids)[np.asarray(t.generated, bool)].sum()) // 7 % 2)

  monkeypatch.setattr(program_lib.rollout, "episode_stats", token_bonus)

  def run(name, *sets):
    base = [a for a in FAST if a != "--set"] + ["steps=3", "lora_rank=4", "learner.temperature=0.6",
                                                "recompute_old_logp=false", f"out_dir={tmp_path / name}"]
    program_lib.RLProgram(apply_overrides(load_config("configs/rl_tiny.py"), base + list(sets))).run()
    return _lines(tmp_path / name / "metrics.jsonl")

  same = ("reward/total", "rollout/generated_tokens", "rollout/prefill_tokens", "rollout/tokens", "train/loss")
  serial, ahead = (run(name, "learner.optim.lr=1e-30", f"rollout_ahead={flag}")
                   for name, flag in (("serial", "false"), ("ahead", "true")))
  assert [r["rollout/ahead"] for r in ahead] == [0.0, 1.0, 1.0]
  assert all(r["train/grad_norm"] > 0 for r in ahead)
  for key in same:
    assert [r[key] for r in ahead] == [r[key] for r in serial], key

  full = run("full", "rollout_ahead=true")
  run("chunked", "rollout_ahead=true", "chunk.max_steps=1")
  assert [p.name for p in (tmp_path / "chunked" / "ahead").iterdir()] == ["1.pkl"]  # step 2's, beside checkpoint 1
  chunked = run("chunked", "rollout_ahead=true")
  assert [r["step"] for r in chunked] == [1, 2, 3] and chunked[1]["rollout/ahead"] == 1.0
  for key in ("train/grad_norm", *same):
    assert [r[key] for r in chunked] == [r[key] for r in full], key
  assert full[2]["train/loss"] != ahead[2]["train/loss"]  # this run's policy did move
