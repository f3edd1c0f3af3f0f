"""The ``gna`` console script and ``python -m gna_interp``: :func:`gna_interp.cli.main` with Ctrl-C handled at any
moment, while the command modules import (torch and all) as much as during the work: exit code 130, one line
``gna: interrupted`` on stderr (unless the command already said what it saved), never a traceback."""

from __future__ import annotations

import signal
import sys
from typing import Any, Sequence

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


class _Stderr:
    """``sys.stderr`` that notes whether the command already reported the interruption
    (a scan's ``gna: interrupted; the finished heads are saved in ...``)."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.said = False

    def write(self, text: str) -> int:
        self.said = self.said or "gna: interrupted" in text
        return self.stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gna`` (exit codes as :func:`gna_interp.cli.main`); Ctrl-C anywhere gives 130 and one line.

    Meant for the console script: once the command has ended, Ctrl-C gets its default action back (the process
    ends at once, with the shell's 130 and no traceback), so nothing after can print a half-finished trace.
    """
    err = _Stderr(sys.stderr)
    sys.stderr = err
    try:
        from gna_interp.cli import main as cli_main

        code = cli_main(argv)
    except KeyboardInterrupt:
        code = INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        sys.stderr = err.stream
    if code == INTERRUPTED and not err.said:
        print("gna: interrupted", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
