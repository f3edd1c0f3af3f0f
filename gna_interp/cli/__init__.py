"""The ``gna`` command line: the command registry and :func:`main`.

Every command lives in its own module of this package (``gna scan`` in ``scan.py``, ``gna compare-circuits`` in
``compare_circuits.py``, the paper's experiments in ``mask.py``, ``prune.py``, ...) and registers itself with
:func:`command`; the modules are imported when the parser is built (:mod:`gna_interp.cli.parser`). The argument
types and shared options are public in :mod:`gna_interp.cli.args`, interrupt handling in :mod:`gna_interp.cli.signals`,
what reaches the terminal in :mod:`gna_interp.cli.terminal`.
"""

from __future__ import annotations

import signal
import sys
import threading
import traceback
import warnings
from typing import Sequence

from gna_interp.cli.parser import Command, build_parser, command
from gna_interp.cli.terminal import Escaping, one_line_warning
from gna_interp.errors import GnaError

__all__ = ["Command", "build_parser", "command", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gna``: exit 0 on success, 2 for bad input (one line ``gna: error: ...``, no traceback unless
    ``--debug``), 1 for a failure during the work, 130 when interrupted (SIGINT or SIGTERM; a scan says
    how to resume)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2, already printed)
        return e.code if isinstance(e.code, int) else 2
    args.argv = argv
    from gna_interp.cli.args import check_device
    from gna_interp.cli.signals import on_sigterm
    from gna_interp.progress import set_quiet

    was_quiet = set_quiet(True) if args.quiet else None
    previous = signal.signal(signal.SIGTERM, on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = Escaping(sys.stdout), Escaping(sys.stderr)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = one_line_warning(warnings.showwarning)
            check_device(args.device, runs_model=getattr(args, "runs_model", False))
            return int(args.run(args) or 0)
    except GnaError as e:
        if args.debug:
            traceback.print_exc()
        print(f"gna: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        return 130
    except Exception as e:  # a failure during the work, not the user's input: say what, keep the trace for --debug
        if args.debug:
            traceback.print_exc()
        print(f"gna: error: {args.command} failed: {type(e).__name__}: {' '.join(str(e).split())} (rerun with --debug "
              f"for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        from gna_interp.run_folder import release_held

        release_held()  # the --out lock a command claimed, however it ended
        sys.stdout, sys.stderr = streams
        if was_quiet is not None:
            set_quiet(was_quiet)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
