"""The ``gna`` command line: the command registry and :func:`main`.

Every command lives in its own module of this package (``gna scan`` in ``scan.py``, ``gna compare-circuits`` in
``compare_circuits.py``, the paper's experiments in ``mask.py``, ``prune.py``, ...) and registers itself with
:func:`command`; the modules are imported when the parser is built. The argument types and shared options are
public in :mod:`gna_interp.cli.args`, interrupt handling in :mod:`gna_interp.cli.signals`.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import traceback
import warnings
from typing import Any, Callable, NoReturn, Sequence

from gna_interp import __version__
from gna_interp.errors import GnaError, GnaWarning, terminal_text

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable]:
    """Register a subcommand: decorate a function that adds arguments; it sets ``run`` via ``set_defaults``."""
    def deco(add_args: Callable[[argparse.ArgumentParser], None]) -> Callable:
        _COMMANDS[name] = (add_args, help)  # type: ignore[assignment]
        return add_args
    return deco


# the commands listed first by `gna --help`, in this order; the other modules follow by name
_FIRST = ("models", "patterns", "zoo", "report", "scan", "compare_circuits")


class _Parser(argparse.ArgumentParser):
    """argparse with gna's error style: one line ``gna: error: ...`` naming where to look, exit code 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        print(f"gna: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _load_command_modules() -> None:
    """Import every module of this package (``gna_interp/cli/NAME.py``): each registers its subcommands
    with :func:`command` (the experiments of the paper live there, one module each)."""
    import importlib
    import pkgutil

    names = [i.name for i in pkgutil.iter_modules(__path__)]
    for name in sorted(names, key=lambda n: (_FIRST.index(n) if n in _FIRST else len(_FIRST), n)):
        importlib.import_module(f"{__name__}.{name}")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``gna`` parser. Given the command line ``argv``, only the subcommand it names gets its arguments (their
    defaults import what they describe, torch among them), so ``gna --help`` lists the commands without loading
    torch; without ``argv`` every subcommand is complete."""
    parser = _Parser(prog="gna", description="Find and inspect Gather-and-Aggregate heads.", allow_abbrev=False)
    _global_options(parser)
    parser.add_argument("--version", action="version", version=f"gna {__version__}", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _load_command_modules()
    chosen = next((a for a in argv if a in _COMMANDS), None) if argv is not None else None
    for name, (add_args, help) in _COMMANDS.items():
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        if argv is None or name == chosen:
            add_args(p)  # type: ignore[arg-type]
            _subcommand_globals(p)
    return parser


def _global_options(p: argparse.ArgumentParser, default: object = None) -> None:
    """``--device``, ``--debug`` and ``--quiet``: on the ``gna`` parser with their defaults, and (``default=
    argparse.SUPPRESS``) on every subcommand, so they may come before or after it (``gna --quiet scan`` and
    ``gna scan --quiet`` are the same; given after, they win)."""
    keep: dict = {} if default is None else {"default": default}
    p.add_argument("--device", **(keep or {"default": None}), help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--debug", action="store_true", **keep, help="print the traceback of an error")
    p.add_argument("--quiet", action="store_true", **keep,
                   help="no progress bars or progress lines, ours nor transformers' and huggingface_hub's (as the "
                        "environment variable TQDM_DISABLE=1)")


def _subcommand_globals(p: argparse.ArgumentParser) -> None:
    """:func:`_global_options` on a subcommand's parser and on its own subcommands (``gna zoo train``); a command
    that hands the rest of its line to another program (``gna lm-eval``) keeps it whole."""
    actions = p._actions  # argparse keeps no public list of a parser's arguments
    if any(a.nargs == argparse.REMAINDER for a in actions):
        return
    taken = {o for a in actions for o in a.option_strings}
    if not taken & {"--device", "--debug", "--quiet"}:
        _global_options(p, argparse.SUPPRESS)
    for a in actions:
        if isinstance(a, argparse._SubParsersAction):
            for child in a.choices.values():
                _subcommand_globals(child)


def _one_line_warning(show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` that prints gna's own warnings (a report part not drawn, ...) as one line
    ``gna: warning: ...`` on stderr, with control characters escaped, and leaves the others to ``show``."""
    def one_line(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        if issubclass(category, GnaWarning):
            print(f"gna: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)
    return one_line


class _Escaping:
    """A text stream that writes through :func:`~gna_interp.errors.terminal_text`: a name read from a command line
    or a results file (a folder called ``\x1b[2J``, a stored label) cannot drive the terminal."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


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
    sys.stdout, sys.stderr = _Escaping(sys.stdout), _Escaping(sys.stderr)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _one_line_warning(warnings.showwarning)
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
