"""Multi-process training on JAX's distributed runtime, tested with local processes on CPU.

Each run starts real processes (tests/multihost_worker.py) with their own fake CPU devices: 2 processes x 4
devices joined through `m3jax.distributed` (coordinator on a portpicker port, gloo collectives), or 1 process x 8
devices. Results are compared across process counts, never with themselves. Every child runs in its own
session and is killed (its whole process group) when the test ends, whatever happens.
"""

import contextlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import portpicker
import pytest
from conftest import FAST_COMPILE
from memory_dirs import assert_same_memory

from m3jax import distributed
from m3jax.config import apply_overrides
from m3jax.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "multihost_worker.py"
STEP_TIMEOUT = 900  # s per run; a loaded 2-core machine compiles the tiny SFT + RL steps in ~3 min
TRAINED = "steps,save,rl"  # what the shared 1- and 2-process runs do (`trained`): one start-up for several tests


class Run:
  """`nproc` processes running `tasks` in the worker, or (`cli`) the `m3jax` command with these arguments
  joined through the M3JAX_* environment; `wait()` returns their exit codes and exit times."""

  def __init__(self, tasks: str, out: pathlib.Path, nproc: int, cli: list[str] | None = None):
    out.mkdir(parents=True, exist_ok=True)
    self.out, self.procs, self.exited = out, [], {}
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={8 // nproc} {FAST_COMPILE}",
               PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
    port = portpicker.pick_unused_port() if nproc > 1 else 0
    for pid in range(nproc):
      log = open(out / f"worker{pid}.log", "w")
      if cli is None:
        argv = [str(WORKER), tasks, "--out", str(out), "--port", str(port), "--nproc", str(nproc), "--pid", str(pid)]
        penv = env
      else:
        argv = ["-m", "m3jax.cli", *cli]
        penv = dict(env, M3JAX_COORDINATOR=f"localhost:{port}", M3JAX_NUM_PROCESSES=str(nproc),
                    M3JAX_PROCESS_ID=str(pid)) if nproc > 1 else env
      self.procs.append(subprocess.Popen([sys.executable, *argv], env=penv, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, cwd=out))
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

  def start(tasks: str, out: pathlib.Path, nproc: int, cli: list[str] | None = None) -> Run:
    started.append(Run(tasks, out, nproc, cli))
    return started[-1]

  yield start
  for r in started:
    r.kill()


def _ok(run: Run, timeout: float = STEP_TIMEOUT) -> None:
  codes, _ = run.wait(timeout)
  for pid, code in enumerate(codes):
    assert code == 0, f"worker {pid} of {run.out.name}: exit {code}\n{run.log(pid)[-3000:]}"


def _close(a: np.lib.npyio.NpzFile, b: np.lib.npyio.NpzFile, prefix: str = "", at=slice(None)) -> None:
  """Every numeric array of `b` whose name starts with `prefix` equals `a`'s (<= 1e-5); `at` selects the steps
  of `a`'s per-step metrics that `b` holds (a resumed run has only the later ones)."""
  keys = [k for k in b.files if k.startswith(prefix) and k != "steps" and b[k].dtype.kind in "fiu"]
  assert keys and set(keys) <= set(a.files)
  for k in keys:
    np.testing.assert_allclose(a[k] if k.startswith("p") else a[k][at], b[k], atol=1e-5, rtol=0, err_msg=k)


@contextlib.contextmanager
def _finished(started: list[Run]):
  """Waits for runs started together (each must exit 0); kills whatever is left when the block ends."""
  try:
    for run in started:
      _ok(run, 2 * STEP_TIMEOUT)
    yield
  finally:
    for run in started:
      run.kill()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """`TRAINED` on 1 process x 8 devices (DIR/one) and on 2 x 4 (DIR/two), started together."""
  base = tmp_path_factory.mktemp("trained")
  with _finished([Run(TRAINED, base / "one", 1), Run(TRAINED, base / "two", 2)]):
    yield base


@pytest.fixture(scope="module")
def resumed(trained):
  """The 2-process RL run, its step-2 checkpoint removed (killed after step 1), resumed on 2 processes (DIR/same)
  and on 1 (DIR/fewer). Each first restores the learner checkpoint of the other process count into a fresh
  learner (DIR/two's on 1 process, DIR/one's on 2): one start-up serves both checks."""
  for name in ("same", "fewer"):
    shutil.copytree(trained / "two" / "rl" / "ckpt", trained / name / "rl" / "ckpt")
    shutil.rmtree(trained / name / "rl" / "ckpt" / "2")
  with _finished([Run(f"restore={trained / other},rl", trained / name, nproc)
                  for name, nproc, other in (("same", 2, "one"), ("fewer", 1, "two"))]):
    yield trained


def test_two_processes_train_and_checkpoint_like_one(trained, resumed):
  """An SFT step and an RL learner update on 2 processes x 4 devices equal 1 process x 8 (losses, old
  log-probs, every parameter, <= 1e-5); an SFT run resumed from its checkpoint continues as the uninterrupted
  one does; a learner checkpoint written by either process count restores in the other."""
  one, two = trained / "one", trained / "two"
  a, b = np.load(one / "steps.npz"), np.load(two / "steps.npz")
  assert a["sft_loss"].shape == (2,) and a["rl_loss"].shape == (2,)
  _close(a, b)
  for run in (a, b):  # the resumed Trainer (optimizer state restored onto the mesh) steps as the continuing one
    np.testing.assert_array_equal(run["sft_resumed_loss"], run["sft_loss"][1:])
    for k in (k for k in run.files if k.startswith("sft_q")):
      np.testing.assert_array_equal(run[k.replace("_q", "_r")], run[k], err_msg=k)
  # across process counts: a fresh (other seed) learner restores the other run's checkpoint exactly
  for restored, written in ((resumed / "same", a), (resumed / "fewer", b)):
    got = np.load(restored / "restored.npz")
    for k in got.files:
      np.testing.assert_array_equal(got[k], written[f"rl_{k}"], err_msg=k)


def test_sft_processes_read_disjoint_shares_of_each_batch(trained):
  """Each of 2 processes reads (encodes) only its interleaved rows of every SFT batch (rows 0, 2 and 1, 3 of
  batches [0, 1], [2, 3]; the continuing and the resumed step both read batch 1): disjoint, and together the rows
  one process reads."""
  one, two = np.load(trained / "one" / "sft_reads.npz"), np.load(trained / "two" / "sft_reads.npz")
  assert one.files == ["p0"] and sorted(two.files) == ["p0", "p1"]
  assert one["p0"].tolist() == [0, 1, 2, 3, 2, 3]
  assert two["p0"].tolist() == [0, 2, 2] and two["p1"].tolist() == [1, 3, 3]


def test_rl_training_on_two_processes_equals_one_and_resumes(trained, resumed):
  """`train.py rl`'s program (rollouts, dynamic sampling, update; 2 steps, mesh 2x2x2) on 2 processes x 4
  devices equals 1 x 8: the same groups kept at every step, the same rewards, token counts, losses and final
  parameters (<= 1e-5). Killed after step 1 (its step-2 checkpoint removed), the 2-process run resumes on 2
  processes and, restoring every process's iterator state onto one, on 1 process, and both continue to the
  same step 2 and parameters."""
  a, b = np.load(trained / "one" / "rl.npz"), np.load(trained / "two" / "rl.npz")
  assert a["steps"].tolist() == [2] and b["kept"].tolist() == a["kept"].tolist()
  kept, generated = a["ds/kept_groups"], a["ds/generated_groups"]
  assert (0 < kept).all() and (kept < generated).any(), (kept, generated)  # groups both kept and dropped
  _close(a, b)
  for name in ("same", "fewer"):
    c = np.load(resumed / name / "rl.npz")
    assert c["steps"].tolist() == [1] and c["kept"].tolist() == b["kept"].tolist()[1:], name
    _close(b, c, at=slice(1, None))


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


EVAL_ANNOTATIONS = {  # the official-format fixture graphs, answered by the rules answerer on the hashed embedder
  "small": {"mem_path": "small.pkl", "qa_list": [
    {"question_id": f"s_Q{i}", "question": q, "answer": a, "type": ["Person Understanding"], "before_clip": 7}
    for i, (q, a) in enumerate([("Who makes coffee with a French press?", "coffee"),
                                ("What color is the lunch box?", "grey"), ("Who is at the university?", "none")])]},
  "medium": {"mem_path": "medium.pkl", "qa_list": [
    {"question_id": f"m_Q{i}", "question": q, "answer": a, "type": ["Multi-Hop Reasoning"], "before_clip": 40}
    for i, (q, a) in enumerate([("Who broke the blue porcelain vase?", "football"),
                                ("Who flew a red dragon kite at the hill park?", "kite")])]},
}


def test_eval_sharded_over_two_processes_writes_the_one_process_file(tmp_path, runs):
  """`m3jax eval` on 2 processes (joined through M3JAX_*): each answers its share, process 0 gathers them into
  one results file equal to the 1-process file, line for line; the other process writes nothing."""
  ann = tmp_path / "ann.json"
  ann.write_text(json.dumps(EVAL_ANNOTATIONS))
  args = ["eval", str(ann), "--answerer", "rules", "--judge", "contains", "--no-progress", "--set",
          f"graphs_dir={ROOT / 'tests' / 'fixtures' / 'official_graphs'}", "--set", "embedder=hashed", "--set",
          "plot=false", "--set", "batch_size=2", "--output", "results.jsonl"]
  one, two = runs("", tmp_path / "one", 1, args), runs("", tmp_path / "two", 2, args)
  _ok(one, 300), _ok(two, 300)
  a, b = (tmp_path / "one" / "results.jsonl").read_text(), (tmp_path / "two" / "results.jsonl").read_text()
  assert len(a.splitlines()) == 5 and a == b
  assert "3 of them on process 0" in two.log(0) and "2 of them on process 1" in two.log(1)
  files = lambda d: sorted(p.name for p in d.iterdir() if not p.name.startswith("worker"))
  assert files(tmp_path / "two") == files(tmp_path / "one") == ["results.jsonl", "results.summary.json"]


def test_memorize_videos_sharded_over_two_processes_like_one(tmp_path, runs):
  """`m3jax memorize --videos GLOB` on 2 processes (2 + 1 videos) writes the same memory directories as 1
  process memorizing all 3 (one-clip generated episodes, template writer): the same content, embeddings to the
  rounding that the batch shapes of the videos in lock-step on each process decide (`memory_dirs`)."""
  from m3jax.data.episode_render import render_episode
  from m3jax.data.episodes import EpisodeConfig, make_episode
  videos = tmp_path / "videos"
  for seed in range(3):
    render_episode(make_episode(EpisodeConfig(seed=seed, num_clips=1, num_characters=1, clip_seconds=6.0,
                                              utterances_per_clip=(1, 1), fps=2, width=160, height=120)), videos)
  stems = sorted(p.stem for p in videos.glob("*.mp4"))
  assert len(stems) == 3
  args = ["memorize", "--videos", str(videos / "*.mp4"), "--memory", "mem", "--no-progress"]
  one, two = runs("", tmp_path / "one", 1, args), runs("", tmp_path / "two", 2, args)
  _ok(one), _ok(two)
  assert "2 of 3 videos" in two.log(0) and "1 of 3 videos" in two.log(1)
  assert "memorized 3 videos" in two.log(0)
  for run in ("one", "two"):
    assert sorted(p.name for p in (tmp_path / run / "mem").iterdir()) == stems
  for stem in stems:
    assert_same_memory(tmp_path / "one" / "mem" / stem, tmp_path / "two" / "mem" / stem)


def test_learner_checkpoint_restores_onto_other_mesh_shapes(tmp_path):
  """Resharding (one process, 8 devices): a learner checkpoint written on data2 x fsdp2 x tensor2 restores onto
  fsdp8 and onto data2 x tensor4 with every leaf equal and laid out as the new learner lays it out, and the next
  update there equals the next update on the original mesh (<= 1e-5)."""
  import jax
  from flax import nnx

  from m3jax import checkpoint, parallel
  from m3jax.models.decoder import Decoder, DecoderConfig
  from m3jax.rl import learner as learner_lib
  from multihost_worker import _rl_batch
  cfg = DecoderConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=4, head_dim=8, qk_norm=True, tie_embeddings=True)
  lcfg = learner_lib.LearnerConfig(optim=learner_lib.OptimConfig(lr=1e-2, weight_decay=0.0), micro_batch=8,
                                   seq_chunk=8, vocab_chunk=128)
  make = lambda seed, shape: learner_lib.Learner(Decoder(cfg, rngs=nnx.Rngs(seed)), lcfg,
                                                 mesh=parallel.make_mesh(*shape))
  batch = _rl_batch()
  batch["old_logp"] = np.full(batch["tokens"].shape, -5.7, np.float32)
  first = make(0, (2, 2, 2))
  first.update(batch, seed=1)
  ckpt = checkpoint.Checkpointer(tmp_path / "ckpt")
  ckpt.save(1, first.state(), {"step": 1})
  saved = jax.tree.map(np.asarray, first.state())
  want = first.update(batch, seed=2)
  want_params = jax.tree.map(np.asarray, first.state()["params"])
  for shape in ((1, 8, 1), (2, 1, 4)):
    fresh = make(7, shape)
    layout = lambda st: jax.tree.map(lambda x: x.sharding, (st["params"], st["opt_state"]))
    before = layout(fresh.state())
    state, meta = ckpt.restore(fresh.state())
    fresh.restore(state)
    assert meta == {"step": 1} and fresh.step == 1
    got_state = fresh.state()
    assert layout(got_state) == before
    assert any(len(x.sharding.device_set) == 8 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(got_state["params"]))
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, got_state), saved)
    got = fresh.update(batch, seed=2)
    np.testing.assert_allclose([h["loss"] for h in got], [h["loss"] for h in want], atol=1e-5, rtol=0)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), b, atol=1e-5, rtol=0),
                 fresh.state()["params"], want_params)


def test_video_lists_for_memorize(tmp_path, capsys):
  from m3jax import cli
  for name in ("b.mp4", "a.mp4", "sub/c.mp4"):
    (tmp_path / name).parent.mkdir(exist_ok=True)
    (tmp_path / name).write_bytes(b"")
  assert cli.list_videos(str(tmp_path / "*.mp4")) == [tmp_path / "a.mp4", tmp_path / "b.mp4"]
  (tmp_path / "list.txt").write_text("# videos\nsub/c.mp4\n\nb.mp4\n")
  assert cli.list_videos(str(tmp_path / "list.txt")) == [tmp_path / "sub/c.mp4", tmp_path / "b.mp4"]
  (tmp_path / "dup.txt").write_text("b.mp4\nsub/b.mp4\n")
  with pytest.raises(UserError, match="would share the memory directory b"):
    cli.list_videos(str(tmp_path / "dup.txt"))
  with pytest.raises(UserError, match="no videos"):
    cli.list_videos(str(tmp_path / "*.mkv"))
  with pytest.raises(UserError, match="neither a glob pattern nor a file"):
    cli.list_videos(str(tmp_path / "missing.txt"))
  assert cli.main(["memorize", "--memory", str(tmp_path / "m")]) == 2
  assert cli.main(["memorize", "x.mp4", "--videos", "*.mp4", "--memory", str(tmp_path / "m")]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == ["m3jax: error: give one video, or --videos LIST|GLOB"] * 2


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
  from m3jax.memorize.pipeline import MemorizeConfig
  from m3jax.eval.evaluate import EvalConfig
  from m3jax.rl.program import RLConfig
  from m3jax.sft.run import SFTConfig
  for config in (SFTConfig(), RLConfig(), EvalConfig(), MemorizeConfig()):
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
