"""A command's wall time with and without the persistent compile cache (`m3jax.compile_cache`).

  python -m bench.compile_cache --memory DIR [--reps 3] [--question "Who likes coffee?"]

Each run is a fresh process, `m3jax ask --memory DIR QUESTION` with the shipped controller, as a user runs it:
  * off: `M3JAX_COMPILE_CACHE=0`, every program compiled (what every process paid before the cache);
  * on: the cache of this CPU, warmed by one untimed run first, so its programs load from disk.
The two alternate for `--reps` rounds (the machine may be shared) and medians are reported; both must print the
same answer. `M3JAX_CACHE` points at a fresh directory, so nothing from earlier runs is used, and the tokenizer is
built once untimed. DIR: a memory directory, e.g. the one `m3jax demo` prints.
Final line: RESULT ask_s_off=... ask_s_on=... speedup=... same_answer=... cache_mb=... cpu=... load=...
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

from bench.harness import cpu_model, machine, result_line


def ask(memory: str, question: str, env: dict) -> tuple[float, str]:
  start = time.perf_counter()
  out = subprocess.run([sys.executable, "-m", "m3jax.cli", "ask", "--memory", memory, question], env=env,
                       capture_output=True, text=True)
  if out.returncode:
    sys.exit(f"bench.compile_cache: ask failed: {out.stderr.strip().splitlines()[-1:]}")
  return time.perf_counter() - start, out.stdout.strip()


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--memory", required=True)
  parser.add_argument("--question", default="What does the person like to drink?")
  parser.add_argument("--reps", type=int, default=3)
  args = parser.parse_args()
  print(machine(), flush=True)
  with tempfile.TemporaryDirectory() as cache:
    on = dict(os.environ, M3JAX_CACHE=cache, M3JAX_COMPILE_CACHE="1")
    off = dict(on, M3JAX_COMPILE_CACHE="0")
    ask(args.memory, args.question, on)  # builds the tokenizer, runs the load check and fills the cache
    times, answers = {"off": [], "on": []}, {"off": set(), "on": set()}
    for rep in range(args.reps):
      for mode, env in (("off", off), ("on", on)):
        seconds, answer = ask(args.memory, args.question, env)
        times[mode].append(seconds)
        answers[mode].add(answer)
        print(f"rep {rep} {mode}: {seconds:.1f} s", flush=True)
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(cache) for f in fs) / 2**20
  t_off, t_on = statistics.median(times["off"]), statistics.median(times["on"])
  print(result_line(ask_s_off=f"{t_off:.2f}", ask_s_on=f"{t_on:.2f}", speedup=f"{t_off / t_on:.2f}",
                    same_answer=answers["off"] == answers["on"] and len(answers["on"]) == 1,
                    cache_mb=f"{size:.0f}", cpu=cpu_model(), load=f"{os.getloadavg()[0]:.2f}"))


if __name__ == "__main__":
  main()
