"""Every runtime command, run where `import torch` fails.

  python -S tests/no_torch_paths.py WORK SITE_PACKAGES OMNI_DIR

torch is a test-only dependency: the runtime install has none. This script hides it before anything else is
imported, points the m3jax cache at an empty directory (so nothing converted earlier with torch is reused), and
runs each runtime path on a tiny input: demo, memorize (template, llm and omni writers; OMNI_DIR is a tiny random
Qwen2.5-Omni thinker), ask, eval, chat, serve's import and /ask, and `train.py` rl and sft for one step.
tests/test_no_torch.py runs it in a subprocess; CI's runtime smoke (.ci/smoke-runtime) also runs `./m3 demo` in an
environment where torch is not installed at all.
"""

import contextlib
import importlib.util
import io
import os
import pathlib
import sys
import time

HIDDEN = ("torch", "torchvision", "torchaudio", "functorch", "torchgen")


def _site_without_torch(work: pathlib.Path, real: pathlib.Path) -> None:
  """`real` (the environment's site-packages) as it would be without torch: a directory of links to everything else in it,
  added as the only site directory (the script runs under `python -S`). Imports then fail the way they do where
  torch was never installed, and `importlib.util.find_spec("torch")` is None for libraries that probe for it."""
  site_dir = work / "site-packages"
  site_dir.mkdir()
  for entry in real.iterdir():
    if entry.name.split("-")[0].split(".")[0] not in HIDDEN:
      (site_dir / entry.name).symlink_to(entry)
  import site
  site.addsitedir(str(site_dir))


def _memory() -> str:
  status = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmRSS", "VmHWM")))
  return ", ".join(f"{k} {int(v.split()[0]) / 2**20:.1f} GB" for k, v in status.items())


def run(name: str, main, argv: list[str]) -> str:
  """Runs one command in this process, then drops jax's executables and the command's garbage: the commands
  share nothing, and holding every one's executables raised this process to ~6 GB beside the test workers."""
  import gc

  import jax
  start = time.perf_counter()
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    code = main(argv)
  assert code == 0, f"{name} exited {code}: {out.getvalue()[-2000:]}"
  jax.clear_caches()
  gc.collect()
  print(f"ok {name} ({time.perf_counter() - start:.0f} s; {_memory()})", flush=True)
  return out.getvalue()


def main(work: pathlib.Path, site_packages: pathlib.Path, omni: pathlib.Path) -> None:
  _site_without_torch(work, site_packages)
  assert importlib.util.find_spec("torch") is None
  root = pathlib.Path(__file__).resolve().parent.parent
  sys.path.insert(0, str(root))  # train.py and serve.py
  cache = work / "cache"
  cache.mkdir()
  os.environ["M3JAX_CACHE"] = str(cache)

  import serve
  import train
  from m3jax import cli

  demo = work / "demo"
  # a small test-split episode (seed >= 2,000,000), as the demo's default is one
  run("demo", cli.main, ["demo", "--set", f"out_dir={demo}", "--set", "progress=False",
                         "--set", "episode.seed=2000003", "--set", "episode.num_clips=1",
                         "--set", "episode.num_characters=1",
                         "--set", "episode.utterances_per_clip=(1,2)", "--set", "episode.clip_seconds=12.0"])
  video, = demo.glob("*.mp4")
  memory, = demo.glob("*_memory")
  run("memorize --writer llm", cli.main, ["memorize", str(video), "--memory", str(work / "mem_llm"), "--writer",
                                          "llm", "--max-clips", "1", "--no-progress"])
  run("memorize --writer omni", cli.main, ["memorize", str(video), "--memory", str(work / "mem_omni"), "--writer",
                                           "omni", "--omni-model", str(omni), "--max-clips", "1", "--no-progress",
                                           "--set", "omni_max_new_tokens=8"])
  run("memorize --writer template", cli.main, ["memorize", str(video), "--memory", str(work / "mem_template"),
                                               "--max-clips", "1", "--no-progress"])
  run("ask", cli.main, ["ask", "--memory", str(memory), "What does the person like to drink?"])
  annotations, = demo.glob("*.json")
  run("eval", cli.main, ["eval", str(annotations), "--answerer", "trained", "--limit", "2", "--no-progress"])
  run("chat", cli.main, ["chat", "Say hi.", "--max-new-tokens", "4"])

  data = ["--set", f"data_dir={work / 'serve'}", "--set", "keys_file="]
  run("serve import-memory", serve.main, data + ["import-memory", "--tenant", "alice", "--name", "ep", str(memory)])
  from fastapi.testclient import TestClient

  from m3jax.config import apply_overrides
  from m3jax.serve.app import create_app
  from m3jax.serve.auth import hash_key
  from m3jax.serve.config import ServeConfig
  os.environ["M3JAX_SERVE_KEYS"] = f"alice:{hash_key('k')}"
  with TestClient(create_app(apply_overrides(ServeConfig(), data[1::2]))) as client:
    key = {"Authorization": "Bearer k"}
    space, = client.get("/v1/spaces", headers=key).json()["spaces"]
    r = client.post(f"/v1/spaces/{space['id']}/ask", headers=key, json={"question": "Who is in the video?"})
    assert r.status_code == 200 and r.json()["answer"], r.text
  print("ok serve /ask", flush=True)

  run("train.py rl", train.main, ["rl", "--config", str(root / "configs/rl_tiny.py"), "--set", "steps=1",
                                  "--set", f"out_dir={work / 'rl'}"])
  run("train.py sft", train.main, ["sft", "--config", str(root / "configs/sft_tiny.py"), "--set", "train.steps=1",
                                   "--set", "train.warmup_steps=0",
                                   "--set", f"out_dir={work / 'sft'}", "--set", f"data_dir={work / 'sft_data'}",
                                   "--set", "train_seeds=(1,)", "--set", "eval_seeds=(100,)"])
  assert not [m for m in sys.modules if m.split(".")[0] in HIDDEN]
  print("all runtime paths ran without torch", flush=True)


if __name__ == "__main__":
  main(*map(pathlib.Path, sys.argv[1:4]))
