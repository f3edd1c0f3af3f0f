"""The ``gna`` parser: the command registry (:func:`command`), gna's one-line argparse errors, and the options
every subcommand takes (``--device``, ``--debug``, ``--quiet``)."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, NoReturn, Sequence

from gna_interp import __version__

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

    import gna_interp.cli as cli

    names = [i.name for i in pkgutil.iter_modules(cli.__path__)]
    for name in sorted(names, key=lambda n: (_FIRST.index(n) if n in _FIRST else len(_FIRST), n)):
        importlib.import_module(f"{cli.__name__}.{name}")


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
