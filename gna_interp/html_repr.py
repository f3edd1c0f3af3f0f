"""Small HTML pieces for the results' ``_repr_html_`` (Jupyter's rich display): a title line, key/value facts,
a table and a heatmap grid, all plain static HTML with inline styles (so nbconvert and notebook viewers show
them as they are) and every piece of text escaped (model, task and head names come from users and files).

Imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import html
import math
import numbers
from typing import Any, Iterable, Sequence

__all__ = ["Raw", "esc", "facts", "fmt", "grid", "shade", "table", "title"]

_TABLE = "border-collapse:collapse;font-size:12px;margin:4px 0"
_CELL = "padding:1px 6px;border-bottom:1px solid #ddd"


class Raw(str):
    """Markup built here (already escaped): :func:`table` and :func:`facts` put it in as it is."""


def esc(value: Any) -> str:
    """``value`` as text, escaped for HTML (quotes included: safe inside attributes too)."""
    return value if isinstance(value, Raw) else html.escape(str(value), quote=True)


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
    tail = f" <span style='color:#666'>{esc(note)}</span>" if note != "" else ""
    return Raw(f"<div style='margin:2px 0'><b>{esc(text)}</b>{tail}</div>")


def facts(items: Iterable[tuple[Any, Any]]) -> Raw:
    """``key: value`` lines (a two-column table without borders)."""
    rows = "".join(f"<tr><td style='padding:0 8px 0 0;color:#555'>{esc(k)}</td><td style='padding:0'>{esc(v)}</td></tr>"
                   for k, v in items)
    return Raw(f"<table style='{_TABLE}'>{rows}</table>")


def table(header: Sequence[Any], rows: Iterable[Sequence[Any]], styles: Iterable[str] | None = None) -> Raw:
    """A table: ``header`` cells, then ``rows`` (each cell escaped unless :class:`Raw`); ``styles``, one per row,
    is extra CSS for that row (e.g. the chosen row in bold)."""
    head = "".join(f"<th style='{_CELL};text-align:left'>{esc(h)}</th>" for h in header)
    row_styles = list(styles) if styles is not None else []
    body = []
    for i, row in enumerate(rows):
        extra = row_styles[i] if i < len(row_styles) else ""
        cells = "".join(f"<td style='{_CELL}'>{esc(c)}</td>" for c in row)
        body.append(f"<tr style='{esc(extra)}'>{cells}</tr>" if extra else f"<tr>{cells}</tr>")
    return Raw(f"<table style='{_TABLE}'><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


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
    out = []
    if columns is not None:  # every label when they fit over their cells, else every step-th (left-aligned)
        step = max(1, math.ceil(6 * max((len(str(c)) for c in columns), default=1) / (cell_px + 2)))
        out.append("<tr><td></td>" + "".join(f"<td style='padding:0;font-size:9px;color:#777;text-align:"
                                              f"{'center' if step == 1 else 'left'};white-space:nowrap;overflow:visible;"
                                              f"max-width:{cell_px}px'>{esc(c) if i % step == 0 else ''}</td>"
                                              for i, c in enumerate(columns)) + "</tr>")
    for label, cells in rows:
        tds = "".join(f"<td title='{esc(t)}' style='width:{cell_px}px;height:{cell_px}px;padding:0;"
                      f"border:1px solid #fff;background:{shade(v, scale)}'></td>" for t, v in cells)
        out.append(f"<tr><td style='padding:0 6px 0 0;font-size:11px;color:#555'>{esc(label)}</td>{tds}</tr>")
    return Raw(f"<table style='border-collapse:collapse;margin:4px 0'>{''.join(out)}</table>")
