"""The command-line paths a new user meets first: bad input is ONE `error:` line on stderr (no traceback), the
`./m3` wrapper keeps the caller's directory, train.py without a config prints its usage, `python -m m3jax.eval`
fails before writing anything when a graph is missing, and the LLM policy refuses a question too long for the
model before allocating its cache.

Entry points that are scripts or `python -m` modules run as subprocesses; the `m3jax` subcommands run through
`m3jax.cli.main`, which is the installed console script itself, in-process (a subprocess costs seconds of imports).
"""

import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from m3jax import cli
from m3jax.errors import Interrupted, UserError, run_cli

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(args, cwd):
  env = {**os.environ, "PYTHONPATH": str(ROOT)}
  return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _one_error_line(err: str, *needles: str) -> str:
  lines = [line for line in err.splitlines() if line.strip()]
  assert "Traceback" not in err and len(lines) == 1, err
  for needle in needles:
    assert needle in lines[0], err
  return lines[0]


# ---------------------------------------------------------------------------------------------- run_cli
def test_run_cli_turns_user_errors_into_one_line(capsys, monkeypatch):
  def fails(exc):
    def main(argv):
      raise exc
    return main

  assert run_cli(fails(UserError("bad\nthing")), prog="x") == 2
  assert capsys.readouterr().err == "x: error: bad | thing\n"
  assert run_cli(fails(FileNotFoundError("config file not found: c.py"))) == 2
  assert capsys.readouterr().err == "error: config file not found: c.py\n"
  assert run_cli(fails(KeyboardInterrupt()), prog="x") == 130
  assert capsys.readouterr().err == "x: interrupted\n"
  assert run_cli(fails(Interrupted("re-run to resume")), prog="x") == 130
  assert capsys.readouterr().err == "x: interrupted: re-run to resume\n"
  assert run_cli(lambda argv: len(argv), ["a", "b"]) == 2
  with pytest.raises(RuntimeError):  # a bug is not a user error: its traceback stays
    run_cli(fails(RuntimeError("bug")))
  monkeypatch.setenv("M3JAX_TRACEBACK", "1")
  with pytest.raises(UserError):
    run_cli(fails(UserError("shown with its traceback")))


# ------------------------------------------------------------------------------------ m3jax subcommands
@pytest.mark.parametrize("argv, needle", [
  (["ask", "--memory", "{mem}", ""], "the question is empty"),
  (["ask", "--memory", "{mem}", "   "], "the question is empty"),
  (["ask", "--memory", "{mem}", "Who?", "--before-clip", "-5"], "--before-clip must be a clip number >= 0"),
  (["memorize", "v.mp4", "--memory", "{mem}", "--max-clips", "0"], "--max-clips must be >= 1"),
  (["memorize", "v.mp4", "--memory", "{file}"], "is a file, not a memory directory"),
  (["ask", "--memory", "{file}", "Who?"], "is a file, not a memory directory"),
  (["memorize", "v.mp4", "--memory", "{mem}", "--set", "clip_seconds=0"], "clip_seconds must be > 0"),
  (["eval", "{file}", "--limit", "0"], "--limit must be >= 1"),
  (["eval", "nope.json"], "annotation file not found: nope.json"),
  (["ask", "--memory", "{mem}", "Who?", "--answerer", "trained", "--adapter", "none.npz"],
   "adapter file not found: none.npz"),
])
def test_subcommands_refuse_bad_values_on_one_line(argv, needle, tmp_path, capsys):
  existing = tmp_path / "notes.txt"
  existing.write_text("keep me")
  argv = [a.format(mem=tmp_path / "mem", file=existing) for a in argv]
  assert cli.main(argv) == 2
  _one_error_line(capsys.readouterr().err, "m3jax: error: ", needle)
  assert existing.read_text() == "keep me" and not (tmp_path / "mem").exists()


# ------------------------------------------------------------------------------------------ ./m3 script
def test_m3_script_resolves_paths_against_the_callers_directory(tmp_path):
  """A copy of ./m3 whose venv is this interpreter: `ask --memory mem` from another directory reads that
  directory's mem/ (here a damaged one, so the error names it); the old script cd'ed into the repository and
  reported that `mem holds no memory`."""
  repo, caller, tools = tmp_path / "repo", tmp_path / "caller", tmp_path / "bin"
  for d in (repo / ".venv" / "bin", caller / "mem", tools):
    d.mkdir(parents=True)
  shutil.copy(ROOT / "m3", repo / "m3")
  shutil.copy(ROOT / "pyproject.toml", repo / "pyproject.toml")
  shutil.copytree(ROOT / "requirements", repo / "requirements")
  python = repo / ".venv" / "bin" / "python"
  python.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} \"$@\"\n")
  python.chmod(0o755)
  # installed (the stamp ./m3 keys on the runtime locks and pyproject.toml): the script goes straight to the command
  keyed = b"".join((repo / p).read_bytes() for p in ("requirements/runtime.lock", "requirements/weights.lock",
                                                      "pyproject.toml"))
  (repo / ".venv" / f".m3jax-installed-runtime-{hashlib.sha1(keyed).hexdigest()[:12]}").touch()
  for tool in ("ffmpeg", "espeak-ng", "sox"):  # present, so the script never reaches for apt
    if shutil.which(tool) is None:
      (tools / tool).write_text("#!/bin/sh\n")
      (tools / tool).chmod(0o755)
  (caller / "mem" / "manifest.json").write_text("{")
  env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}
  r = subprocess.run([str(repo / "m3"), "ask", "--memory", "mem", "Who?"], cwd=caller, env=env,
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 2
  _one_error_line(r.stderr, "mem/manifest.json is damaged")


# ------------------------------------------------------------------------------------------------ train.py
def test_train_without_config_prints_usage_and_starts_nothing(tmp_path):
  r = _run([sys.executable, ROOT / "train.py", "rl"], tmp_path)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  assert r.stderr.startswith("usage: train.py rl")
  assert "--config is required, e.g. --config configs/rl_tiny.py" in r.stderr
  assert not (tmp_path / "runs").exists()
  r = _run([sys.executable, ROOT / "train.py", "rl", "--config", "nope.py"], tmp_path)
  assert r.returncode == 2
  _one_error_line(r.stderr, "train.py: error: config file not found: nope.py")
  assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------------------ m3jax.eval
def test_eval_module_errors_are_one_line_and_leave_no_results_file(tmp_path):
  r = _run([sys.executable, "-m", "m3jax.eval", "--set", "judgee=exact"], tmp_path)
  assert r.returncode == 2
  _one_error_line(r.stderr, "m3jax.eval: error: unknown config field 'judgee'")
  ann = tmp_path / "ann.json"
  ann.write_text(json.dumps({"v1": {"mem_path": "memories/v1_memory",
                                    "qa_list": [{"question": "Who?", "answer": "Anna"}]}}))
  out = tmp_path / "results" / "v1.jsonl"
  r = _run([sys.executable, "-m", "m3jax.eval", "--set", f"annotations={ann}", "--set", f"output={out}",
            "--set", "judge=exact"], tmp_path)
  assert r.returncode == 2
  _one_error_line(r.stderr, "m3jax.eval: error: memory graph of mem_path 'memories/v1_memory' not found")
  assert not out.parent.exists() or not any(out.parent.iterdir())


# ------------------------------------------------------------------------------------- prompt length cap
def test_llm_policy_refuses_a_question_longer_than_the_model_before_allocating():
  from flax import nnx

  from m3jax.control.controller import Controller, ControlConfig, Question
  from m3jax.control.policy import LLMPolicy, PromptTooLongError, prompt_token_limit
  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.engine.sampling import Sampler, SamplingConfig
  from m3jax.models.tokenizer import load_tokenizer
  from m3jax.models.weights.gguf import smollm2_path

  class NoSearch:
    def search(self, requests):
      raise AssertionError("a refused question must not reach the memory")

  tok = load_tokenizer(smollm2_path())
  cfg = DecoderConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, tie_embeddings=True, max_position_embeddings=2048)
  sampling = SamplingConfig(max_new_tokens=8, greedy=True, stop_token_ids=(2,))
  sampler = Sampler(Decoder(cfg, rngs=nnx.Rngs(0)), sampling, tok)
  assert prompt_token_limit(sampler, sampling) == 2048 - 8
  sampler._new_cache = lambda *a, **k: pytest.fail("a cache was allocated for a refused prompt")
  controller = Controller(LLMPolicy(sampler, tok, sampling), NoSearch(), ControlConfig(max_rounds=1))
  long_question = "Who said this? " + "word " * 5000  # ~5000 tokens: over the 2040 the model takes
  with pytest.raises(PromptTooLongError, match=r"the question is too long: its prompt is \d+ tokens and this "
                                               r"model takes at most 2040 \(leaving 8 for the reply\)"):
    controller.run([Question("q", long_question, "", 0)])


@pytest.mark.parametrize("path", sorted(p for p in (ROOT / "configs").glob("*.py") if p.name != "recipes.py"),
                         ids=lambda p: p.name)  # recipes.py: settings the configs share (tests/test_configs.py)
def test_every_shipped_config_builds(path):
  """Each config file's first line is a command users copy: its `get_config()` must build and validate
  (configs/demo.py once passed a field DemoConfig no longer has, and `m3jax demo --config` died on it)."""
  from m3jax.config import load_config

  assert dataclasses.is_dataclass(load_config(path))
