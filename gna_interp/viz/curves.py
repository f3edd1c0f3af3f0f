"""`ablation_curve(circuit)`: task score as the top-k heads are removed, beside k random heads."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.viz.text import counted


def curve_frame(circuit: Any) -> pd.DataFrame:
    """The ablation curve of a circuit as a DataFrame with columns ``k, series, seed`` and the metrics.

    ``circuit`` is a circuit result with a ``curve`` attribute, a dict (as read from ``circuit.json``)
    with a ``"curve"`` entry, or the curve itself (a DataFrame or a list of records). ``series`` is
    ``"top"`` for the cumulative removal of the top-ranked heads and ``"random"`` for random heads
    (one curve per ``seed``).
    """
    curve = circuit.get("curve") if isinstance(circuit, dict) else getattr(circuit, "curve", circuit)
    if callable(getattr(curve, "to_frame", None)) and not isinstance(curve, pd.DataFrame):
        curve = curve.to_frame()
    df = curve if isinstance(curve, pd.DataFrame) else pd.DataFrame(curve)
    missing = [c for c in ("k", "series") if c not in df]
    if missing or df.empty:
        raise InputError(f"an ablation curve needs rows with columns k, series (top/random), seed and a metric; "
                         f"got columns {list(df.columns)} ({len(df)} rows)")
    if "seed" not in df:
        df = df.assign(seed=0)
    return df


def ablation_curve(circuit: Any, metric: str = "accuracy", chance: float | None = None,
                   title: str | None = None) -> Any:
    """Plotly line chart: ``metric`` after removing the top-k heads (k = 0..K), after removing k random
    heads (their median over seeds with a min-max band, each seed faint) and, when the curve has them,
    after removing the k first generic heads. When the curve carries the LM loss on neutral text
    (``lm_loss``), a second panel shows it for the same removals: retrieval and control side by side.

    Hover on the top-k curve names the heads removed so far (from a ``heads`` or ``head`` column when
    the curve has one). ``chance`` (default: the circuit's ``chance`` when it has one) is drawn dashed.
    """
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    df = curve_frame(circuit)
    if metric not in df:
        raise InputError(f"the ablation curve has no {metric!r} column; it has {list(df.columns)}")
    if chance is None:
        chance = _chance(circuit)
    panels = [metric] + (["lm_loss"] if "lm_loss" in df and df["lm_loss"].notna().any() else [])
    titles = [f"task {metric.replace('_', ' ')} (retrieval)", "LM loss on neutral text (control, nats/token)"]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=titles[:len(panels)], horizontal_spacing=0.1)
    for col, m in enumerate(panels, start=1):
        _add_series(fig, go, df, m, col, show_legend=col == 1)
        fig.update_xaxes(title_text="k (heads removed)", dtick=1 if df["k"].max() <= 20 else None, row=1, col=col)
        fig.update_yaxes(title_text=m.replace("_", " "), row=1, col=col)
    if chance is not None:
        fig.add_hline(y=float(chance), line=dict(color="#888", dash="dash"), annotation_text=f"chance {chance:.2f}",
                      annotation_position="bottom right", row=1, col=1)
    what = "retrieval and control" if len(panels) == 2 else metric.replace("_", " ")
    fig.update_layout(title=dict(text=title or f"Ablation curve: {what} after removing k heads"),
                      height=460, template="plotly_white", legend=dict(orientation="h", yanchor="bottom", y=-0.4, x=0))
    return fig


_SERIES = {"top": ("#c0392b", "top-k discovered heads"), "generic": ("#e67e22", "top-k generic heads")}


def _add_series(fig: Any, go: Any, df: pd.DataFrame, metric: str, col: int, show_legend: bool) -> None:
    """The random band and median, then the top-k and generic lines, of ``metric`` into panel ``col``."""
    label = metric.replace("_", " ")
    rnd = df[(df["series"] == "random") & df[metric].notna()]
    if not rnd.empty:
        stats = rnd.groupby("k")[metric].agg(["median", "min", "max", "count"]).reset_index()
        for seed, one in rnd.groupby("seed"):
            full = len(one) == rnd["k"].nunique()  # draws measured only at the largest k are markers, not lines
            one = one if full else one[one["k"] == rnd["k"].max()]
            fig.add_trace(go.Scatter(x=one["k"], y=one[metric], mode="lines" if full else "markers",
                                     line=dict(color="rgba(120,120,120,0.35)", width=1),
                                     marker=dict(color="rgba(120,120,120,0.5)", size=5),
                                     name=f"random seed {seed}", legendgroup="random", showlegend=False,
                                     hovertemplate=f"random seed {seed}<br>k=%{{x}}<br>{label}=%{{y:.3f}}<extra></extra>"),
                          row=1, col=col)
        fig.add_trace(go.Scatter(x=list(stats["k"]) + list(stats["k"])[::-1], y=list(stats["max"]) + list(stats["min"])[::-1],
                                 fill="toself", mode="lines", fillcolor="rgba(120,120,120,0.18)", line=dict(width=0), hoverinfo="skip",
                                 name="random: min-max over seeds", legendgroup="random", showlegend=show_legend),
                      row=1, col=col)
        n_seeds, fewest = int(stats["count"].max()), int(stats[stats["k"] > 0]["count"].min())
        fewer = "" if fewest == n_seeds else f"; {fewest} at smaller k" if fewest > 1 else "; one order at smaller k"
        fig.add_trace(go.Scatter(x=stats["k"], y=stats["median"], mode="lines+markers", line=dict(color="#555", dash="dot"),
                                 name=f"k random heads (median of {counted(n_seeds, 'seed')}{fewer})",
                                 legendgroup="random", showlegend=show_legend,
                                 hovertemplate=f"random, median<br>k=%{{x}}<br>{label}=%{{y:.3f}}<extra></extra>"),
                      row=1, col=col)
    for series, (colour, name) in _SERIES.items():
        part = df[(df["series"] == series) & df[metric].notna()].sort_values("k")  # unmeasured points skipped
        if part.empty:
            continue
        hc = "heads" if "heads" in part else "head" if "head" in part else None
        names = [_names(v) for v in part[hc]] if hc else [""] * len(part)
        fig.add_trace(go.Scatter(x=part["k"], y=part[metric], mode="lines+markers",
                                 line=dict(color=colour, width=3 if series == "top" else 2), name=name, legendgroup=series,
                                 showlegend=show_legend, customdata=names,
                                 hovertemplate=f"{series}<br>k=%{{x}}<br>{label}=%{{y:.3f}}<br>%{{customdata}}<extra></extra>"),
                      row=1, col=col)


def _chance(circuit: Any) -> float | None:
    """``chance`` of a circuit dict or object, at top level or inside its ``baseline`` metrics."""
    get = circuit.get if isinstance(circuit, dict) else lambda key: getattr(circuit, key, None)
    chance, baseline = get("chance"), get("baseline")
    if chance is None and isinstance(baseline, dict):
        chance = baseline.get("chance")
    return float(chance) if isinstance(chance, (int, float)) else None


def _names(value: Any) -> str:
    """Hover text for the heads removed at one point (a list, or a comma-separated string)."""
    if isinstance(value, str):
        value = [v for v in value.split(",") if v]
    if not isinstance(value, (list, tuple)) or not value:
        return ""
    return "removed: " + html.escape(", ".join(map(str, value)), quote=False)
