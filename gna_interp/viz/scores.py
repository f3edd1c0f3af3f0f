"""`score_heatmap(scan)`: per-head ablation scores as a layer x head heatmap, one panel per head kind."""

from __future__ import annotations

import html
import math
from typing import Any

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.registry import adapter, kinds
from gna_interp.models.mixer import MixerAdapter
ROLE_MARKS = {"gather": "G", "aggregate": "A"}
_MARK_KEY = "cell labels: G gather head, A aggregate head (pattern roles); #n the head's rank (top {k} marked)"
_HIDDEN = {"layer", "head", "kind", "name", "width"}
_MAX_TICKS = 40


def as_frame(scan: Any) -> pd.DataFrame:
    """A scan result as a DataFrame: a DataFrame with at least ``layer, head, kind, name`` (or ``name``
    alone), a scan or a circuit (``.to_frame()``; a circuit's carries the role columns)."""
    if isinstance(scan, pd.DataFrame):
        df = scan
    elif callable(getattr(scan, "to_frame", None)):
        df = scan.to_frame()
    else:
        df = scan
    if not isinstance(df, pd.DataFrame):
        raise InputError(f"expected a scan or a circuit (.to_frame()) or a DataFrame, got {type(scan).__name__}")
    if "name" in df and not {"layer", "head", "kind"} <= set(df.columns):
        refs = [HeadRef.parse(n) for n in df["name"]]
        df = df.assign(layer=[h.layer for h in refs], head=[h.head for h in refs], kind=[h.kind for h in refs])
    missing = [c for c in ("layer", "head", "kind", "name") if c not in df]
    if missing:
        raise InputError(f"scan frame lacks columns {missing}; it has {list(df.columns)}")
    return df


# what the hover box shows (a few lines: it must not hide the heatmap); the report's click view shows the rest
HOVER = ("rank", "role", "causal_role", "drop", "drop_lo", "drop_hi", "control_drop", "gather", "aggregate",
         "selectivity")


def _hover(row: pd.Series, columns: list[str]) -> str:
    lines = [f"<b>{html.escape(str(row['name']), quote=False)}</b>"]
    for c in columns:
        v = row[c]
        if isinstance(v, float):
            if math.isnan(v):
                continue
            v = f"{v:.4g}"
        lines.append(f"{html.escape(c, quote=False)}: {html.escape(str(v), quote=False)}")
    return "<br>".join(lines)


def _kind_info(kind: str) -> tuple[str, str, str]:
    """``(panel title, x-axis label, display letter)`` of a head kind (a kind no longer registered, e.g. in
    an old scan.csv, is shown by its name)."""
    if kind in kinds():
        a: MixerAdapter = adapter(kind)
        return a.title, a.axis, a.letter
    return f"{kind} heads", "head", ""


def _height(n_layers: list[int]) -> int:
    return int(160 + 150 * len(n_layers) + 22 * sum(max(n, 2) for n in n_layers))


def score_heatmap(scan: Any, roles: pd.DataFrame | None = None, value: str = "drop",
                  title: str | None = None, mark_top: int = 5) -> Any:
    """Plotly heatmap of ``value`` (default the ablation ``drop``) for every scanned head.

    One panel per head kind present (attention heads, Mamba-2 heads, Mamba-1 channels or channel
    groups), each with the layers that have that kind on the y axis and the head / SSM head /
    channel-group start on the x axis, so hybrids show their attention and SSM layers apart.
    Colour is centred at 0 (red = ablating hurts). Cells are marked ``G`` / ``A`` for heads whose
    ``role`` is gather / aggregate, and the ``mark_top`` best-ranked heads carry their rank; the default title says so
    in a second line.
    Hover shows a few lines (:data:`HOVER`: rank, roles, drop with its interval, control effect, role scores; the
    report's click view shows every column); each trace's ``meta.names[y][x]`` is
    the head name of cell ``(x, y)`` (``""`` where no head was scanned), for scripts that react to a click.
    ``roles`` (a frame with ``name`` and e.g. ``role``, gather/aggregate scores) is merged in on ``name``.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = as_frame(scan).copy()
    if roles is not None:
        extra = [c for c in roles.columns if c not in df.columns or c == "name"]
        df = df.merge(roles[extra], on="name", how="left")
    if value not in df:
        raise InputError(f"scan frame has no column {value!r}; it has {list(df.columns)}")
    if df.empty:
        raise InputError("the scan frame is empty: nothing to draw")
    if "rank" not in df:
        df["rank"] = df[value].rank(ascending=False, method="first").astype(int)
    hover_cols = [c for c in HOVER if c in df.columns and c not in _HIDDEN] + \
        ([value] if value not in HOVER and value not in _HIDDEN else [])
    present = list(dict.fromkeys(df["kind"]))
    order = [k for k in kinds() if k in present] + [k for k in present if k not in kinds()]
    info = {k: _kind_info(k) for k in order}
    n_layers = [df.loc[df["kind"] == k, "layer"].nunique() for k in order]
    fig = make_subplots(rows=len(order), cols=1, row_heights=[max(n, 2) for n in n_layers],
                        subplot_titles=[info[k][0] for k in order], vertical_spacing=min(0.3, 140 / _height(n_layers)))
    for r, kind in enumerate(order, start=1):
        sub = df[df["kind"] == kind]
        layers = sorted(sub["layer"].unique())
        cols = sorted(sub["head"].unique())
        li, ci = {v: i for i, v in enumerate(layers)}, {v: i for i, v in enumerate(cols)}
        z = [[math.nan] * len(cols) for _ in layers]
        text = [[""] * len(cols) for _ in layers]
        hover = [["not scanned"] * len(cols) for _ in layers]
        names = [[""] * len(cols) for _ in layers]
        for _, row in sub.iterrows():
            i, j = li[row["layer"]], ci[row["head"]]
            z[i][j] = float(row[value])
            names[i][j] = str(row["name"])
            mark = ROLE_MARKS.get(str(row.get("role", "")), "")
            if int(row["rank"]) <= mark_top:
                mark = f"{mark}#{int(row['rank'])}"
            text[i][j] = mark
            hover[i][j] = _hover(row, hover_cols)
        panel, axis, letter = info[kind]
        fig.add_trace(go.Heatmap(z=z, x=list(range(len(cols))), y=list(range(len(layers))), text=text,
                                 texttemplate="%{text}", customdata=hover, hovertemplate="%{customdata}<extra></extra>",
                                 coloraxis="coloraxis", xgap=1, ygap=1, name=panel, meta={"names": names}),
                      row=r, col=1)
        step = max(1, math.ceil(len(cols) / _MAX_TICKS))
        fig.update_xaxes(title_text=axis, tickvals=list(range(0, len(cols), step)),
                         ticktext=[f"{letter}{cols[j]}" for j in range(0, len(cols), step)], row=r, col=1)
        lstep = max(1, math.ceil(len(layers) / _MAX_TICKS))
        fig.update_yaxes(title_text="layer", tickvals=list(range(0, len(layers), lstep)),
                         ticktext=[f"L{layers[i]}" for i in range(0, len(layers), lstep)], row=r, col=1)
    label = value.replace("_", " ")
    heading = title or f"Ablation {label} per head (higher = the head matters more)"
    if title is None and ((df["rank"] <= mark_top).any() or df.get("role", pd.Series(dtype=str)).isin(list(ROLE_MARKS)).any()):
        heading += f"<br><sup>{_MARK_KEY.format(k=mark_top)}</sup>"
    fig.update_layout(
        title=dict(text=heading),
        coloraxis=dict(colorscale="RdBu_r", cmid=0, colorbar=dict(title=dict(text=label))),
        height=_height(n_layers), margin=dict(l=70, r=40, t=80, b=60),
        template="plotly_white")
    return fig
