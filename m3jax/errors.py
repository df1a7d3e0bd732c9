"""User-facing errors: every entry point (the `m3jax` CLI, train.py, serve.py, `python -m m3jax.eval`) turns bad
input into ONE line on stderr and a non-zero exit, never a traceback.

Raise `UserError` for anything the user can fix (a missing file, a refused value, a mismatching resume). Config
validation across the package raises `ValueError`, and file access `OSError`; `run_cli` reports those the same
way, so a bad `--set` or a missing `--config` file needs no wrapping. Set `M3JAX_TRACEBACK=1` to see the
traceback instead (debugging m3jax itself). Ctrl-C exits 130 with one line; raise `Interrupted` from a
`KeyboardInterrupt` handler to say what a re-run does (e.g. "re-run the same command to resume").
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Sequence


class UserError(Exception):
  """A refused input or request; its message is the whole report (one line, no traceback), exit status 2."""
  exit_code = 2


class Interrupted(UserError):
  """Ctrl-C, with a message saying what state was left and how to continue; exit status 130 (128 + SIGINT)."""
  exit_code = 130


def one_line(message: object) -> str:
  """The message on one line (multi-line messages are joined with ' | ')."""
  return " | ".join(part.strip() for part in str(message).splitlines() if part.strip())


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None,
            prog: str | None = None) -> int:
  """Runs `main(argv)` and returns its exit status; user errors become `PROG: error: MESSAGE` on stderr (status 2),
  Ctrl-C becomes `PROG: interrupted` (status 130). Use as `sys.exit(run_cli(main, prog="serve.py"))`."""
  prefix = f"{prog}: " if prog else ""
  try:
    return main(argv)
  except Interrupted as e:
    print(f"{prefix}interrupted: {one_line(e)}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt:
    print(f"{prefix}interrupted", file=sys.stderr)
    return Interrupted.exit_code
  except (UserError, ValueError, OSError) as e:
    if os.environ.get("M3JAX_TRACEBACK"):
      raise
    print(f"{prefix}error: {one_line(e)}", file=sys.stderr)
    return getattr(e, "exit_code", UserError.exit_code)
