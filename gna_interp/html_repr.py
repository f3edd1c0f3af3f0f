"""Small HTML pieces for the results' ``_repr_html_`` (Jupyter's rich display): a title line, key/value facts,
a table and a heatmap grid, all plain static HTML with inline styles (so nbconvert and notebook viewers show
them as they are) and every piece of text escaped (model, task and head names come from users and files).

The markup comes from the macros of ``gna_interp/templates/repr.html`` (:mod:`gna_interp.templates`, whose one
escaping rule :func:`esc` is). Imports nothing from the package but :mod:`gna_interp.templates`: every layer may use
it.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Sequence

from gna_interp.templates import escape, part

__all__ = ["Raw", "block", "bullets", "esc", "facts", "fmt", "grid", "shade", "table", "title"]


class Raw(str):
    """Markup built here (already escaped): :func:`table` and :func:`facts` put it in as it is."""

    def __html__(self) -> str:
        return str(self)


def esc(value: Any) -> str:
    """``value`` as text, escaped for HTML (quotes included: safe inside attributes too); :class:`Raw` as it is."""
    return str(escape(value))


def _piece(macro: str, *args: Any) -> Raw:
    return Raw(part(macro, *args, library="repr.html"))


def fmt(value: Any, digits: int = 3) -> str:
    """A number with ``digits`` decimals (NaN and None as an en dash), an integer as is, anything else as text."""
    if value is None:
        return "–"
    if isinstance(value, (bool, numbers.Integral)):
        return str(value)
    if isinstance(value, numbers.Real):
        v = float(value)
        return "–" if math.isnan(v) else f"{v:.{digits}f}"
    return str(value)


def title(text: Any, note: Any = "") -> Raw:
    """A bold title line with an optional plain note after it."""
    return _piece("title", text, note)


def facts(items: Iterable[tuple[Any, Any]]) -> Raw:
    """``key: value`` lines (a two-column table without borders)."""
    return _piece("facts", list(items))


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], styles: Iterable[str] | None = None) -> Raw:
    """A table: ``header`` cells, then ``rows`` (each cell escaped unless :class:`Raw`); ``styles``, one per row,
    is extra CSS for that row (e.g. the chosen row in bold)."""
    row_styles = list(styles) if styles is not None else []
    return _piece("table", list(header), [(list(row), row_styles[i] if i < len(row_styles) else "")
                                          for i, row in enumerate(rows)])


def bullets(items: Iterable[Any]) -> Raw:
    """A small bulleted list of sentences (each escaped unless :class:`Raw`)."""
    return _piece("bullets", list(items))


def block(parts: Iterable[str]) -> str:
    """A whole display: ``parts``, markup built by the pieces here (or by a figure), in one ``<div>``."""
    return str(_piece("block", [Raw(p) for p in parts]))


def shade(value: float, scale: float) -> str:
    """A background colour for ``value`` on a diverging scale: red above 0, blue below, white at 0 and for NaN;
    full colour at ``|value| >= scale``."""
    if not scale or value is None or math.isnan(value):
        return "#ffffff"
    t = max(-1.0, min(1.0, value / scale))
    fade = round(255 * (1 - abs(t)))
    return f"rgb(255,{fade},{fade})" if t > 0 else f"rgb({fade},{fade},255)"


def grid(rows: Sequence[tuple[Any, Sequence[tuple[Any, float]]]], scale: float, cell_px: int = 12,
         columns: Sequence[Any] | None = None) -> Raw:
    """A heatmap as a table of coloured cells: one row per ``(label, [(cell title, value), ...])``; each cell's
    colour is :func:`shade` of its value, its title (the hover text) the cell title; ``columns`` labels the
    columns (a header row)."""
    header = None
    if columns is not None:  # every label when they fit over their cells, else every step-th (left-aligned)
        step = max(1, math.ceil(6 * max((len(str(c)) for c in columns), default=1) / (cell_px + 2)))
        header = [(c if i % step == 0 else "", step == 1) for i, c in enumerate(columns)]
    return _piece("grid", [(label, [(t, shade(v, scale)) for t, v in cells]) for label, cells in rows], cell_px, header)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun`` agreeing with it: ``1 MLP``, ``2 MLPs`` (``plural``: where it is not ``noun + "s"``)."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"
