"""`python -m m3jax.eval.ablate --config configs/ablate_tiny.py`: table, PNG and JSON in out_dir, and a rerun resumes."""

import dataclasses
import json
import pathlib

import pytest

from m3jax.eval.ablate import Ablation, EvalSpec, main
from m3jax.config import load_config
from m3jax.errors import UserError, run_cli

TINY = pathlib.Path(__file__).resolve().parents[1] / "configs" / "ablate_tiny.py"


def tiny(out_dir, *overrides):
  return load_config(TINY, [f"out_dir={out_dir}", *overrides])


@pytest.fixture(scope="module")
def first(tmp_path_factory):
  out = tmp_path_factory.mktemp("ablate")
  return out, Ablation(tiny(out), progress=False).run()


def test_writes_table_png_and_json(first):
  out, result = first
  table = (out / "ablate.md").read_text()
  for label in ("M3 graph (memory base)", "no semantic memory", "no equivalences / character merging",
                "reference graph mode", "memory design: flat_list", "memory design: clip_summary",
                "prompting (untrained base)", "prompting vs RL", "no inter-turn instruction", "no reasoning",
                "GRPO", "DAPO", "TAURA"):
    assert f"| {label} |" in table
  assert "−17.1 / −19.2 / −13.1" in table and "+10.0 / +8.0 / +9.3" in table  # the paper's deltas beside ours
  png = (out / "ablate.png").read_bytes()
  assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
  saved = json.loads((out / "ablate.json").read_text())
  assert saved["config"]["questions"] == 8 and saved["config"]["rl"]["model"] == "tiny"
  rows = {r["id"]: r for r in saved["rows"]}
  assert rows["rl"]["note"].startswith("no trained controller configured")
  assert rows["no_reasoning"]["note"] == "n/a: model has no thinking step (tiny)"
  assert "search_node" in rows["designs:flat_list"]["note"]
  for algorithm in ("grpo", "dapo", "taura"):   # three seeds each, mean ± std of their evaluations
    r = rows[algorithm]
    accs = [saved["evals"][k]["accuracy"] for k in r["evals"]]
    assert len(r["evals"]) == 3 and r["err_kind"] == "std over seeds" and r["value"] == pytest.approx(sum(accs) / 3)
    # paired over the same questions (correctness averaged over seeds) against the start and every earlier algorithm
    start = rows.get("warm_start", rows["prompting"])
    assert f"vs {start['id']} {100 * (r['value'] - start['value']):+.1f} [" in r["note"]
    earlier = ("grpo", "dapo")[:("grpo", "dapo", "taura").index(algorithm)]
    assert [a for a in ("grpo", "dapo", "taura") if f"vs {a} " in r["note"]] == list(earlier)
    for a in earlier:
      assert f"vs {a} {100 * (r['value'] - rows[a]['value']):+.1f} [" in r["note"]
  for rid in ("base", "no_semantic", "prompting", "no_instruction"):  # every number is its questions' verdicts
    correct = saved["evals"][rows[rid]["evals"][0]]["correct"]
    assert len(correct) == 8 and rows[rid]["value"] == sum(correct) / 8
  assert rows["no_semantic"]["delta"] == pytest.approx(100 * (rows["no_semantic"]["value"] - rows["base"]["value"]))
  assert rows["no_semantic"]["value"] < rows["base"]["value"]  # names and facts live in semantic memory
  assert result["table"] == table.rstrip("\n")


def test_rerun_skips_finished_evaluations_and_resumes_the_rest(first):
  out, result = first
  assert len(result["computed"]) == len(set(result["computed"])) > 10
  again = Ablation(tiny(out), progress=False).run()
  assert again["computed"] == [] and again["rows"] == result["rows"]
  dropped = [EvalSpec(options=(("ablation", "no_semantic"),), answerer="rules").key,
             EvalSpec(controller="rl-dapo-seed2").key]
  for key in dropped:   # as if the run had been killed before these finished
    (out / "evals" / f"{key}.json").unlink()
  resumed = Ablation(tiny(out), progress=False).run()
  assert sorted(resumed["computed"]) == sorted(dropped) and resumed["rows"] == result["rows"]


def test_another_config_in_the_same_out_dir_is_refused(first, capsys):
  out, _ = first
  with pytest.raises(UserError, match=r"different config \(questions differ\)"):
    Ablation(tiny(out, "questions=4"), progress=False)
  assert run_cli(main, ["--config", str(TINY), "--set", f"out_dir={out}", "--set", "rl_seeds=(1,2)"]) == 2
  assert "the RL rows need >= 3 distinct seeds" in capsys.readouterr().err


def test_a_trained_adapter_fills_the_prompting_vs_rl_row(tmp_path):
  from m3jax.models.lora import export_adapter_file
  from m3jax.rl.program import load_model
  cfg = tiny(tmp_path / "out", "rows=('rl',)", f"trained_adapter={tmp_path / 'adapter.npz'}")
  model, _ = load_model(dataclasses.replace(cfg.rl, lora_rank=2))
  export_adapter_file(tmp_path / "adapter.npz", model, "controller")
  result = Ablation(cfg, progress=False).run()
  row, = [r for r in result["rows"] if r["id"] == "rl"]
  assert row["value"] is not None and row["vs"] == "prompting" and row["evals"] == ["m3_graph-llm-trained"]
  assert sorted(result["computed"]) == ["m3_graph-llm-base", "m3_graph-llm-trained"]


def test_a_trained_controller_runs_in_the_protocol_its_adapter_records(tmp_path):
  """Trained without the inter-turn instruction (as the shipped controller): the RL row and the LLM-answered memory
  rows run it that way, and the no-instruction row is measured against adding the instruction."""
  from m3jax.models.lora import export_adapter_file
  from m3jax.rl.program import load_model
  cfg = tiny(tmp_path / "out", "rows=('base','rl','no_instruction')", "memory_answerer=llm",
             f"trained_adapter={tmp_path / 'adapter.npz'}")
  model, _ = load_model(dataclasses.replace(cfg.rl, lora_rank=2))
  export_adapter_file(tmp_path / "adapter.npz", model, "controller",
                      {"inter_turn_instruction": False, "max_new_tokens": 4})
  ab = Ablation(cfg, progress=False)
  assert ab.protocol("trained") == (False, 4) and ab.protocol("base") == (True, cfg.max_new_tokens)
  rows = {r["id"]: r for r in ab.run()["rows"]}
  assert rows["base"]["evals"] == rows["rl"]["evals"] == ["m3_graph-llm-trained-no_instruction"]
  assert rows["no_instruction:with"]["evals"] == ["m3_graph-llm-trained"]
  assert rows["no_instruction"]["vs"] == "no_instruction:with" and "trained without" in rows["no_instruction"]["note"]


def test_an_adapter_warm_start_is_the_rl_rows_start_and_skips_the_untrained_base(tmp_path):
  """With `rl.init_adapter` as the warm start (the shipped recipe's), the RL rows are measured against it, so the
  untrained base is not evaluated for them; the warm start answers in the RL runs' protocol (here, as the shipped
  recipe, without the inter-turn instruction)."""
  from m3jax.models.lora import export_adapter_file
  from m3jax.rl.program import load_model
  model, _ = load_model(tiny(tmp_path / "out", "rl.lora_rank=2").rl)
  export_adapter_file(tmp_path / "stage2.npz", model, "controller")
  cfg = tiny(tmp_path / "out", "rows=('warm_start',)", "rl.lora_rank=2", "rl.warm_start_steps=0",
             f"rl.init_adapter={tmp_path / 'stage2.npz'}", "rl.inter_turn_instruction=False")
  result = Ablation(cfg, progress=False).run()
  row, = [r for r in result["rows"] if r["id"] == "warm_start"]
  assert row["change"] == "the adapter stage2.npz on the base" and row["value"] is not None and row["vs"] == ""
  assert result["computed"] == ["m3_graph-llm-warm-no_instruction"]


def test_every_rl_run_starts_from_the_shared_warm_start(tmp_path):
  """A fresh run starts exactly at the warm start, whatever its seed (the tiny model's own init depends on it)."""
  import jax
  import numpy as np
  from flax import nnx

  from m3jax.rl.program import load_model
  ab = Ablation(tiny(tmp_path), progress=False)
  warm = jax.tree.leaves(nnx.state(ab.warm_program().model, nnx.Param))
  own = jax.tree.leaves(nnx.state(load_model(dataclasses.replace(ab.cfg.rl, seed=2))[0], nnx.Param))
  run = jax.tree.leaves(nnx.state(ab.rl_program("rl-grpo-seed2").model, nnx.Param))
  assert len(run) == len(warm) and all(np.array_equal(a, b) for a, b in zip(warm, run))
  assert not all(np.array_equal(a, b) for a, b in zip(warm, own))


def test_a_memorization_time_option_is_refused_on_perception_built_memories(tmp_path):
  """The graph mode also weights edges while memorizing: applied to a graph memorized without it, it would be
  silently ignored."""
  ab = Ablation(tiny(tmp_path), progress=False)
  with pytest.raises(ValueError, match=r"\['mode'\] would need them memorized again"):
    ab.memory(EvalSpec(options=(("mode", "reference"),), source="perception"))

