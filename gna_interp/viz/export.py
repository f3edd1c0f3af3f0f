"""PNG export of plotly figures through kaleido (a headless Chromium; works offline once one is installed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

EXPORT_WIDTH = 1100


def png_export_problem() -> str | None:
    """Why PNG export cannot work here (``None`` when it can): kaleido missing or no Chromium to drive."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return "kaleido is not installed (pip install kaleido); it is optional and only needed for PNG files"
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 -- a choreographer version without this lookup: let the export try
        return None
    return None if found else "kaleido finds no Chromium/Chrome to drive; install one (e.g. apt-get install chromium)"


def write_pngs(figures: Mapping[str, Any], out_dir: str | Path) -> list[Path]:
    """Write each plotly figure as ``out_dir/NAME.png`` (``EXPORT_WIDTH`` wide, the figure's own height),
    with one browser session for all of them. Raises :class:`RuntimeError` with the reason when the
    export path is not available (see :func:`png_export_problem`)."""
    import plotly.io as pio

    problem = png_export_problem()
    if problem:
        raise RuntimeError(problem)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png" for name in figures]
    figs = list(figures.values())
    try:
        pio.write_images(figs, paths, width=EXPORT_WIDTH, height=[int(f.layout.height or 500) for f in figs])
    except Exception as e:  # noqa: BLE001 -- kaleido/choreographer raise many types; the caller wants the reason
        raise RuntimeError(f"PNG export failed: {type(e).__name__}: {e}") from e
    return paths
