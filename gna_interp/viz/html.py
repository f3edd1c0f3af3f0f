"""Self-contained HTML pages: the circuitsvis and plotly JavaScript embedded once per page, no network."""

from __future__ import annotations

import html
import json
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence


@lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """The circuitsvis browser bundle shipped inside the installed ``circuitsvis`` package."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    return path.read_text(encoding="utf-8").replace("</script>", "<\\/script>")


def circuitsvis_widget(element: str, **props: Any) -> str:
    """One circuitsvis React element (e.g. ``AttentionHeads``) as a ``<div>`` plus its render call.

    The page must include :func:`circuitsvis_bundle` once, before the widgets (see :func:`page`).
    """
    from circuitsvis.utils.convert_props import convert_props

    div_id = f"cv-{uuid.uuid4().hex[:12]}"
    return (f'<div id="{div_id}" class="cv-widget" style="margin: 15px 0;"></div>\n'
            f'<script>CircuitsVis.render("{div_id}", CircuitsVis.{element}, {convert_props(props)});</script>')


def figure_div(fig: Any) -> str:
    """A plotly figure as an HTML fragment (``<div>`` + render call) that uses the page's plotly JS
    (:func:`page` with ``plotly=True``); the figure's own ``layout.height`` sets its height."""
    return fig.to_html(full_html=False, include_plotlyjs=False,
                       config={"displaylogo": False, "responsive": True})


def page(title: str, sections: Sequence[str], *, circuitsvis: bool = False, plotly: bool = False) -> str:
    """A complete HTML document with ``sections`` as its body and the needed JS bundles inlined once."""
    head = [f"<title>{html.escape(title)}</title>", '<meta charset="utf-8">',
            "<style>body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px}"
            "h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}.note{color:#555}</style>"]
    if circuitsvis:
        head.append(f"<script>{circuitsvis_bundle()}</script>")
    if plotly:
        from plotly.offline import get_plotlyjs

        head.append(f"<script>{get_plotlyjs()}</script>")
    body = [f"<h1>{html.escape(title)}</h1>", *sections]
    return "<!DOCTYPE html>\n<html><head>" + "\n".join(head) + "</head>\n<body>\n" + "\n".join(body) + "\n</body></html>\n"


def json_script(data: Any, element_id: str) -> str:
    """Embed JSON data for scripts on the page (escaped for inline use)."""
    payload = json.dumps(data).replace("</", "<\\/")
    return f'<script type="application/json" id="{element_id}">{payload}</script>'
