"""The ``gna`` console script and ``python -m gna_interp``: :func:`gna_interp.cli.main` with Ctrl-C handled at any
moment, while the command modules import (torch and all) as much as during the work: exit code 130, one line
``gna: interrupted`` on stderr (unless the command already said what it saved), never a traceback.

A reader that goes away (``gna scan | head -1``) does not stop the work either: once a write to stdout or stderr
finds its pipe closed, that stream is pointed at the null device, the command finishes (a scan writes its whole
run folder) and exits with its own code, without a ``BrokenPipeError`` traceback.

The process keeps glibc's mmap threshold fixed (:func:`gna_interp.allocator.pin_mmap_threshold`), so the large
temporaries of the blockwise head go back to the system when freed instead of growing the heap."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any, Sequence

INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


class _Stream:
    """A standard stream whose reader may go away: the first ``BrokenPipeError`` sends the stream's file descriptor
    to the null device (so the interpreter's own flush at exit finds nowhere to fail) and later writes vanish."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.gone = False

    def _closed(self) -> None:
        self.gone = True
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.stream.fileno())
            finally:
                os.close(null)
        except (OSError, ValueError, AttributeError):  # no file descriptor behind it (a test's StringIO)
            pass

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._closed()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._closed()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


class _Stderr(_Stream):
    """``sys.stderr`` that notes whether the command already reported the interruption
    (a scan's ``gna: interrupted; the finished heads are saved in ...``)."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.said = False

    def write(self, text: str) -> int:
        self.said = self.said or "gna: interrupted" in text
        return super().write(text)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gna`` (exit codes as :func:`gna_interp.cli.main`); Ctrl-C anywhere gives 130 and one line.

    Meant for the console script: once the command has ended, Ctrl-C gets its default action back (the process
    ends at once, with the shell's 130 and no traceback), so nothing after can print a half-finished trace.
    """
    from gna_interp.allocator import pin_mmap_threshold

    pin_mmap_threshold()  # large temporaries back to the system when freed (gna_interp.allocator)
    err = _Stderr(sys.stderr)
    out = _Stream(sys.stdout)
    sys.stderr, sys.stdout = err, out
    try:
        from gna_interp.cli import main as cli_main

        code = cli_main(argv)
    except KeyboardInterrupt:
        code = INTERRUPTED
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        out.flush()
        sys.stderr, sys.stdout = err.stream, out.stream
    if code == INTERRUPTED and not err.said and not err.gone:
        print("gna: interrupted", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
