"""bench/harness.py: the RESULT line the README and tests split on, the competitor check, and that benchmarks reach
m3jax and each other as the package `bench` (run with `python -m bench.NAME`), never by editing sys.path."""

import pathlib
import sys

import pytest

from bench import harness

BENCH = pathlib.Path(__file__).resolve().parents[1] / "bench"


def test_result_line_keeps_order_and_quotes_values_with_spaces():
  line = harness.result_line(ratio="1.25", n=3, cpu="Intel Xeon Processor", device="cpu")
  assert line == 'RESULT ratio=1.25 n=3 cpu="Intel Xeon Processor" device=cpu'
  assert harness.result_line(**{"decode_06b_b8_tok_s": "12.5"}) == "RESULT decode_06b_b8_tok_s=12.5"


def test_require_names_the_missing_package_and_the_module_command(monkeypatch, capsys):
  monkeypatch.setattr(sys, "argv", [str(BENCH / "decode.py")])
  harness.require({"json": "json"})  # present: returns
  with pytest.raises(SystemExit) as exc:
    harness.require({"json": "json", "no_such_module_m3jax": "no-such-package"})
  assert exc.value.code == 2
  err = capsys.readouterr().err
  assert "no-such-package" in err and "json," not in err and "python -m bench.decode" in err


def test_best_time_returns_the_fastest_run_and_the_last_output():
  calls = []
  seconds, out = harness.best_time(lambda: calls.append(1) or len(calls), 3)
  assert out == 3 and 0 <= seconds < 1


def test_machine_line_names_cpu_cores_and_load():
  line = harness.machine()
  assert line.startswith("cpu: ") and " cores; load average " in line


def test_no_benchmark_edits_sys_path():
  offenders = [f"{f.name}:{i}" for f in sorted(BENCH.glob("*.py"))
               for i, line in enumerate(f.read_text().splitlines(), 1) if "sys.path" in line]
  assert not offenders, offenders
