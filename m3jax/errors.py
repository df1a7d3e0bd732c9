"""Bad input at the command line: one `error: ...` line on stderr and exit status 2, never a traceback.

WHY one exception type: entry points raise `UserError` for anything the user can fix (a bad setting, a busy
port, a malformed name); `run_cli` is the single place that turns it into the one-line message, so a genuine
bug still shows its traceback.
"""

from __future__ import annotations

import sys
from typing import Callable, Sequence


class UserError(Exception):
  """A problem with the user's input, reported as one line naming it."""


def run_cli(main: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
  """`main(argv)`; a `UserError` prints `error: MESSAGE` to stderr and returns 2."""
  try:
    return main(argv)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
