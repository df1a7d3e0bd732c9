"""`python -m m3jax.eval`: the M3-Bench evaluation (`m3jax.eval.evaluate`)."""

import sys

from m3jax.errors import run_cli
from m3jax.eval.evaluate import main

if __name__ == "__main__":
  sys.exit(run_cli(main, prog="m3jax.eval"))
