"""Multi-process training on JAX's distributed runtime, tested with local processes on CPU.

Each run starts real processes (tests/multihost_worker.py) with their own fake CPU devices: 2 processes x 4
devices joined through `m3jax.distributed` (coordinator on a portpicker port, gloo collectives), or 1 process x 8
devices. Results are compared across process counts, never with themselves. Every child runs in its own
session and is killed (its whole process group) when the test ends, whatever happens.
"""

import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest

from m3jax import distributed
from m3jax.config import apply_overrides
from m3jax.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "multihost_worker.py"
STEP_TIMEOUT = 900  # s per run; a loaded 2-core machine compiles the tiny SFT + RL steps in ~3 min


class Run:
  """`nproc` worker processes running `tasks`; `wait()` returns their exit codes and exit times."""

  def __init__(self, tasks: str, out: pathlib.Path, nproc: int):
    out.mkdir(parents=True, exist_ok=True)
    self.out, self.procs, self.exited = out, [], {}
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // nproc}",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    port = portpicker.pick_unused_port() if nproc > 1 else 0
    for pid in range(nproc):
      log = open(out / f"worker{pid}.log", "w")
      self.procs.append(subprocess.Popen(
          [sys.executable, str(WORKER), tasks, "--out", str(out), "--port", str(port), "--nproc", str(nproc),
           "--pid", str(pid)], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
      log.close()

  def wait(self, timeout: float) -> tuple[list[int | None], dict[int, float]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and len(self.exited) < len(self.procs):
      for i, p in enumerate(self.procs):
        if i not in self.exited and p.poll() is not None:
          self.exited[i] = time.monotonic()
      time.sleep(0.2)
    return [p.poll() for p in self.procs], self.exited

  def log(self, pid: int) -> str:
    return (self.out / f"worker{pid}.log").read_text(errors="replace")

  def kill(self) -> None:
    for p in self.procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)  # the child's own session: it and anything it started
        p.wait()


@pytest.fixture
def runs():
  started: list[Run] = []

  def start(tasks: str, out: pathlib.Path, nproc: int) -> Run:
    started.append(Run(tasks, out, nproc))
    return started[-1]

  yield start
  for r in started:
    r.kill()


def _ok(run: Run, timeout: float = STEP_TIMEOUT) -> None:
  codes, _ = run.wait(timeout)
  for pid, code in enumerate(codes):
    assert code == 0, f"worker {pid} of {run.out.name}: exit {code}\n{run.log(pid)[-3000:]}"


def _close(a: np.lib.npyio.NpzFile, b: np.lib.npyio.NpzFile, prefix: str = "") -> None:
  keys = [k for k in b.files if k.startswith(prefix)]
  assert keys and set(keys) <= set(a.files)
  for k in keys:
    np.testing.assert_allclose(a[k], b[k], atol=1e-5, rtol=0, err_msg=k)


def test_two_processes_train_and_checkpoint_like_one(tmp_path, runs):
  """An SFT step and an RL learner update on 2 processes x 4 devices equal 1 process x 8 (losses, old
  log-probs, every parameter, <= 1e-5); a learner checkpoint written by either restores in the other."""
  one, two = tmp_path / "one", tmp_path / "two"
  r1, r2 = runs("steps,save", one, 1), runs("steps,save", two, 2)
  _ok(r1), _ok(r2)
  a, b = np.load(one / "steps.npz"), np.load(two / "steps.npz")
  assert a["sft_loss"].shape == (1,) and a["rl_loss"].shape == (2,)
  _close(a, b)
  # across process counts: a fresh (other seed) learner restores the other run's checkpoint exactly
  r12, r21 = runs(f"restore={one}", tmp_path / "r12", 2), runs(f"restore={two}", tmp_path / "r21", 1)
  _ok(r12), _ok(r21)
  for restored, written in ((tmp_path / "r12", a), (tmp_path / "r21", b)):
    got = np.load(restored / "restored.npz")
    for k in got.files:
      np.testing.assert_array_equal(got[k], written[f"rl_{k}"], err_msg=k)


def test_a_dead_process_fails_its_peer_promptly(tmp_path, runs):
  """Process 1 exits abruptly after joining; process 0, blocked at a barrier, must exit non-zero with the
  runtime's error within a bounded time (heartbeat timeout 5 s), not hang."""
  run = runs("die", tmp_path / "die", 2)
  codes, exited = run.wait(240)
  assert codes[1] == 3, run.log(1)[-2000:]
  assert codes[0] is not None, "process 0 still hangs 240 s after start with a dead peer"
  assert codes[0] != 0, run.log(0)[-2000:]
  assert exited[0] - exited[1] < 60, f"process 0 took {exited[0] - exited[1]:.0f} s to notice"
  log = run.log(0)
  assert "heartbeat timeout" in log or "another task died" in log, log[-2000:]
  assert "barrier passed with a dead peer" not in log


def test_settings_from_overrides_environment_and_validation():
  cfg = distributed.DistributedConfig()
  env = {"M3JAX_COORDINATOR": "10.0.0.1:1234", "M3JAX_NUM_PROCESSES": "4", "M3JAX_PROCESS_ID": "2",
         "M3JAX_LOCAL_DEVICE_IDS": "0,1"}
  got = cfg.from_env(env)
  assert (got.enabled, got.coordinator_address, got.num_processes, got.process_id, got.local_device_ids) == (
      True, "10.0.0.1:1234", 4, 2, (0, 1))
  explicit = distributed.DistributedConfig(process_id=1).from_env(env)
  assert explicit.process_id == 1 and explicit.num_processes == 4  # explicit settings win over the environment
  assert cfg.from_env({}) == cfg and not cfg.enabled
  with pytest.raises(ValueError, match="M3JAX_NUM_PROCESSES"):
    cfg.from_env({"M3JAX_NUM_PROCESSES": "two"})
  with pytest.raises(ValueError, match="host:port"):
    distributed.DistributedConfig(coordinator_address="localhost")
  with pytest.raises(ValueError, match="process_id=2 is not in 0..1"):
    distributed.DistributedConfig(num_processes=2, process_id=2)
  from m3jax.rl.program import RLConfig
  from m3jax.sft.run import SFTConfig
  for config in (SFTConfig(), RLConfig()):
    over = apply_overrides(config, ["distributed.enabled=true", "distributed.coordinator_address=h:99",
                                    "distributed.num_processes=2", "distributed.process_id=1"])
    assert over.distributed == distributed.DistributedConfig(True, False, "h:99", 2, 1)
    with pytest.raises(ValueError, match="process_id=5"):
      apply_overrides(over, ["distributed.process_id=5"])


def test_busy_coordinator_port_is_one_line_error_and_disabled_is_a_no_op():
  distributed.initialize(distributed.DistributedConfig())  # enabled=False, no M3JAX_* set: nothing happens
  with socket.socket() as s:
    s.bind(("", 0))
    s.listen()
    port = s.getsockname()[1]
    cfg = distributed.DistributedConfig(enabled=True, coordinator_address=f"localhost:{port}", num_processes=2,
                                        process_id=0)
    with pytest.raises(UserError, match=f"cannot bind port {port}") as e:
      distributed.initialize(cfg)
    assert "\n" not in str(e.value)
  with pytest.raises(UserError, match="needs coordinator_address"):
    distributed.initialize(distributed.DistributedConfig(enabled=True))
