"""Interrupts of a ``gna`` command: SIGTERM turned into Ctrl-C (:func:`on_sigterm`), and the line that says where
the finished work is saved and how to continue it (:func:`say_interrupted`, :func:`run_held`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from gna_interp.run_folder import RunFolder


def on_sigterm(signum: int, frame: Any) -> None:
    """A SIGTERM handler: stop the command as Ctrl-C does (exit 130, the interrupted work saved)."""
    raise KeyboardInterrupt(f"signal {signum}")


def say_interrupted(args: argparse.Namespace, *saved: Path, what: str = "work", ranks: Sequence[Path] = (),
                    world: int | None = None) -> None:
    """Tell how to continue after an interrupt: where the finished ``what`` (``work``, ``heads``) is saved
    (the files of ``saved`` that exist) and the command line with ``--resume``; ``ranks`` and ``world``: the
    rank files and ranks of a torchrun job, continued with the same launch."""
    again = " ".join(shlex.quote(a) for a in (args.argv or []) if a not in ("--resume", "--fresh"))
    there = [str(f) for f in (*saved, *ranks) if f.exists()]
    verb = "are" if what.endswith("s") else "is"
    if ranks and world is not None:
        print(f"\ngna: interrupted; the finished {what} {verb} saved in {ranks[0].parent}: "
              f"{', '.join(f.name for f in ranks)}. Continue with the same launch plus --resume (any number of "
              f"ranks, or one process), e.g.:\n  torchrun --nproc-per-node {world} -m gna_interp {again} --resume",
              file=sys.stderr, flush=True)
    elif there:
        print(f"\ngna: interrupted; the finished {what} {verb} saved in {', '.join(there)}. Continue with:\n"
              f"  gna {again} --resume", file=sys.stderr, flush=True)
    else:
        unit = "head" if what == "heads" else "point"
        print(f"\ngna: interrupted before any {unit} finished; nothing was saved", file=sys.stderr, flush=True)


def run_held(args: argparse.Namespace, folder: RunFolder, work: Callable[[], Any], *saved: Path,
             what: str = "work") -> Any:
    """``work()`` while holding ``folder`` (``--fresh`` first clears another command's results); on Ctrl-C, say
    where the finished ``what`` is saved (:func:`say_interrupted`, the files of ``saved``) and stop."""
    with folder.hold(args.fresh):
        try:
            return work()
        except KeyboardInterrupt:
            say_interrupted(args, *saved, what=what)
            raise


