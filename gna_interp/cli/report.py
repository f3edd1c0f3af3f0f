"""``gna report``: rebuild a ``gna scan`` folder's ``report.html`` from its saved circuit."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.cli import command
from gna_interp.cli.args import say_figures
from gna_interp.errors import InputError

@command("report", "rebuild DIR/report.html (self-contained, offline) from the circuit saved in DIR; needs no model")
def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a `gna scan` output folder")
    p.add_argument("--no-png", action="store_true", help="do not export the figures as PNG files")
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from gna_interp.report import build_report
    from gna_interp.run_folder import Lock

    folder = Path(args.dir)
    if not folder.is_dir():
        raise InputError(f"{args.dir!r} is not a folder: pass the folder `gna scan --out DIR` wrote")
    with Lock(folder):  # refused while another gna process writes there
        out = build_report(folder, png=not args.no_png)
    print(f"wrote {out}")
    if not args.no_png:
        say_figures(folder)
    return 0
