"""Plotly figures that survive a notebook's export: call :func:`notebook_mode` once, in the notebook's first cell.

Plotly's default in a Jupyter kernel saves a figure only as ``application/vnd.plotly.v1+json``, which a live
JupyterLab draws and nothing else does: nbconvert's HTML, GitHub and most notebook viewers show an empty output.
After :func:`notebook_mode` every figure a cell shows (gna's and any plotly figure, ``px.box(...)`` included)
carries that JSON *and* a ``text/html`` form, a ``<div>`` plus a ``Plotly.newPlot`` call; the plotly.js bundle is
written once, inline, into the output of the cell that calls :func:`notebook_mode`. nbconvert's HTML exporter
prefers ``text/html`` to the plotly JSON, so the exported page draws every figure without network or kernel.
"""

from __future__ import annotations

from typing import Any

from gna_interp.templates import Markup
from gna_interp.viz.html import asset, render

RENDERER = "gna_offline"
_DEFAULT = f"plotly_mimetype+{RENDERER}"
_MISSING = ("plotly.js is not loaded on this page: run gna_interp.viz.notebook_mode() in an earlier cell "
            "(its output carries plotly.js)")


def _renderer_class() -> type:
    from plotly.io._base_renderers import MimetypeRenderer

    class OfflineHtmlRenderer(MimetypeRenderer):
        """``text/html``: the figure's ``<div>`` and its ``Plotly.newPlot`` call, using the page's plotly.js (no
        CDN, no MathJax script); where plotly.js is missing the output says so instead of staying blank."""

        def __init__(self, config: dict[str, Any] | None = None) -> None:
            self.config = dict(config or {"displaylogo": False, "responsive": True})

        def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, str]:
            import plotly.io as pio

            div = pio.to_html(fig_dict, config=self.config, include_plotlyjs=False, include_mathjax=False,
                              full_html=False, default_width="100%", default_height=525, validate=False)
            return {"text/html": render("notebook_figure.html", div=Markup(div), missing=_MISSING,
                                        script=asset("plotly_guard.js"))}

    return OfflineHtmlRenderer


def plotly_bundle_html() -> str:
    """plotly.js (the copy inside the installed ``plotly`` package) as one inline ``<script>``."""
    from plotly.offline import get_plotlyjs

    return render("plotly_bundle.html", config=asset("plotly_config.js"), plotly=Markup(get_plotlyjs()))


def notebook_mode(show: bool = True) -> None:
    """Make every plotly figure a notebook shows survive export (see the module doc).

    Registers the ``gna_offline`` renderer, sets ``plotly.io.renderers.default`` to
    ``"plotly_mimetype+gna_offline"`` (JupyterLab still draws the JSON; exports draw the HTML) and, when ``show``,
    displays plotly.js once in this cell's output, so call it in a cell that runs before the first figure
    (re-running that cell writes the bundle again, so a saved notebook always has it). About 4.5 MB of output.
    """
    import plotly.io as pio

    if RENDERER not in pio.renderers:
        pio.renderers[RENDERER] = _renderer_class()()
    pio.renderers.default = _DEFAULT
    if show:
        from IPython.display import display

        display({"text/html": plotly_bundle_html()}, raw=True)
