"""Probe: RSS of an RL program across DAPO steps (the ablation's GRPO run was OOM-killed at 24 GB, step 9)."""
import dataclasses, gc, sys, time
from m3jax.config import load_config
from m3jax.eval.ablate import rl_config
from m3jax.rl.program import RLProgram
from m3jax.host_memory import retain_freed_memory

def rss():
  for l in open("/proc/self/status"):
    if l.startswith("VmRSS"): return int(l.split()[1]) / 1e6
if "--retain" in sys.argv: retain_freed_memory()
ab = load_config("configs/ablate.py")
program = RLProgram(rl_config(ab, "grpo", 1, "/tmp/program_rss"))
print("built rss", rss(), flush=True)
it = iter(program.dataset)
for step in range(1, 9):
  t0 = time.perf_counter()
  m = program.train_step(it, step)
  gc.collect()
  print(f"step {step}: {time.perf_counter() - t0:.1f} s rollout {m['time/rollout_s']:.1f} update {m['time/update_s']:.1f} "
        f"seq_len {m['rollout/seq_len']:.0f} rss {rss():.2f} GB", flush=True)
