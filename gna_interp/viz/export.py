"""PNG export of plotly figures through kaleido (a headless Chromium; works offline once one is installed).

The export runs in a child process with a time limit: kaleido's Chromium can hang without a word (seen once
on this project's machine: a `gna compare` sat 15 minutes in `write_images`), and a hung export must not
hang the command that made the figures. On a timeout the child and its browser are killed and
:class:`RuntimeError` says so; the callers then note it in their HTML page, which has the same figures.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Mapping

from gna_interp.errors import install_hint
from gna_interp.store import atomic_write, make_folder

EXPORT_WIDTH = 1100
PNG_TIMEOUT_S = 120.0  # plus PNG_TIMEOUT_PER_FIGURE_S a figure; a browser start takes about 3 s here
PNG_TIMEOUT_PER_FIGURE_S = 10.0
_CHILD = ("import json, sys\n"
          "import plotly.io as pio\n"
          "job = json.load(open(sys.argv[1]))\n"
          "pio.write_images([pio.from_json(f) for f in job['figures']], job['paths'], width=job['width'],\n"
          "                 height=job['heights'])\n")


FIGURES_EXTRA = "figures"  # the extra of gna-interp that installs kaleido (pyproject.toml)


def png_export_problem() -> str | None:
    """Why PNG export cannot work here (``None`` when it can): kaleido missing or no Chromium to drive."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return (f"kaleido is not installed: {install_hint(FIGURES_EXTRA)} adds it (only the PNG files need it; "
                f"report.html draws every figure without it)")
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 -- a choreographer version without this lookup: let the export try
        return None
    return None if found else ("kaleido finds no Chromium/Chrome to drive; install one (apt-get install chromium, or "
                               "plotly_get_chrome, which downloads one for kaleido)")


def png_note(folder: str | Path) -> str | None:
    """The one line a command prints after writing ``folder/report.html``: None when ``folder/figures`` holds PNG
    files, else why it holds none (:func:`png_export_problem`: the extra to install, or the browser kaleido lacks)."""
    figures = Path(folder) / "figures"
    if figures.is_dir() and any(figures.glob("*.png")):
        return None
    problem = png_export_problem()
    return (f"no PNG figures written in {figures}: {problem}" if problem else
            f"no PNG figures written in {figures}: the export failed (report.html says why)")


def write_pngs(figures: Mapping[str, Any], out_dir: str | Path, timeout: float | None = None) -> list[Path]:
    """Write each plotly figure as ``out_dir/NAME.png`` (``EXPORT_WIDTH`` wide, the figure's own height),
    with one browser session for all of them, in a child process given ``timeout`` seconds (default
    ``PNG_TIMEOUT_S`` plus ``PNG_TIMEOUT_PER_FIGURE_S`` a figure). Raises :class:`RuntimeError` with the
    reason when the export path is not available (see :func:`png_export_problem`), fails or times out."""
    problem = png_export_problem()
    if problem:
        raise RuntimeError(problem)
    out = Path(out_dir)
    make_folder(out)
    paths = [out / f"{name}.png" for name in figures]
    figs = list(figures.values())
    limit = PNG_TIMEOUT_S + PNG_TIMEOUT_PER_FIGURE_S * len(figs) if timeout is None else timeout
    with tempfile.TemporaryDirectory(prefix="gna-png-") as tmp:
        job = Path(tmp) / "job.json"
        drafts = [Path(tmp) / f"{i}.png" for i in range(len(figs))]  # moved into place atomically: never through a link
        job.write_text(json.dumps({"figures": [f.to_json() for f in figs], "paths": [str(p) for p in drafts],
                                   "width": EXPORT_WIDTH, "heights": [int(f.layout.height or 500) for f in figs]}))
        with open(Path(tmp) / "stderr.txt", "w+") as err:
            proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(job)], stdout=subprocess.DEVNULL, stderr=err,
                                    start_new_session=True)  # its own process group: the browser dies with it
            try:
                rc = proc.wait(timeout=limit)
            except BaseException as e:  # a timeout, or Ctrl-C while waiting: take the child and its browser down
                _kill_group(proc)
                if isinstance(e, subprocess.TimeoutExpired):
                    raise RuntimeError(f"PNG export timed out after {limit:.0f} s (kaleido's headless Chromium did "
                                       f"not answer); the HTML page has the same figures") from None
                raise
            _kill_group(proc)  # a browser the child left behind
            err.seek(0)
            lines = [ln for ln in err.read().splitlines() if ln.strip()]
        written, missing = [], []
        if rc == 0:  # the child may exit 0 and still leave a figure unwritten: only the drafts that exist are moved
            for name, draft, path in zip(figures, drafts, paths):
                if draft.is_file() and draft.stat().st_size:
                    atomic_write(path, draft.read_bytes())
                    written.append(path)
                else:
                    missing.append(name)
    if rc != 0:
        raise RuntimeError(f"PNG export failed: {lines[-1] if lines else f'exit status {rc}'}")
    if missing:
        raise RuntimeError(f"PNG export wrote no file for {', '.join(missing)} (the exporter reported no error); "
                           f"{len(written)} of {len(paths)} written; the HTML page has every figure")
    return paths


def _kill_group(proc: subprocess.Popen) -> None:
    """Kill the child's process group (it and any browser it started); quiet when it is already gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):  # gone, or no process groups (Windows)
        if proc.poll() is None:
            proc.kill()
    proc.wait()
