"""`ablation_curve(circuit)`: task score as the top-k heads are removed, beside k random heads."""

from __future__ import annotations

import html
from typing import Any

import pandas as pd

from gna_interp.errors import InputError


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
    """Plotly line chart: ``metric`` after removing the top-k heads (k = 0..K) and after removing k
    random heads, the random curve as its mean over seeds with a min-max band and each seed faint.

    Hover on the top-k curve names the heads removed so far (from a ``heads`` or ``head`` column when
    the curve has one). ``chance`` (default: the circuit's ``chance`` when it has one) is drawn dashed.
    """
    import plotly.graph_objects as go

    df = curve_frame(circuit)
    if metric not in df:
        raise InputError(f"the ablation curve has no {metric!r} column; it has {list(df.columns)}")
    if chance is None:
        chance = _chance(circuit)
    label = metric.replace("_", " ")
    fig = go.Figure()
    rnd = df[df["series"] == "random"]
    if not rnd.empty:
        stats = rnd.groupby("k")[metric].agg(["mean", "min", "max", "count"]).reset_index()
        for seed, one in rnd.groupby("seed"):
            fig.add_trace(go.Scatter(x=one["k"], y=one[metric], mode="lines", line=dict(color="rgba(120,120,120,0.35)", width=1),
                                     name=f"random seed {seed}", legendgroup="random", showlegend=False,
                                     hovertemplate=f"random seed {seed}<br>k=%{{x}}<br>{label}=%{{y:.3f}}<extra></extra>"))
        fig.add_trace(go.Scatter(x=list(stats["k"]) + list(stats["k"])[::-1], y=list(stats["max"]) + list(stats["min"])[::-1],
                                 fill="toself", mode="lines", fillcolor="rgba(120,120,120,0.18)", line=dict(width=0), hoverinfo="skip",
                                 name="random: min-max over seeds", legendgroup="random"))
        n_seeds = int(stats["count"].max())
        fig.add_trace(go.Scatter(x=stats["k"], y=stats["mean"], mode="lines+markers", line=dict(color="#555", dash="dot"),
                                 name=f"k random heads (mean of {n_seeds} seeds)", legendgroup="random",
                                 hovertemplate=f"random, mean<br>k=%{{x}}<br>{label}=%{{y:.3f}}<extra></extra>"))
    top = df[df["series"] == "top"].sort_values("k")
    if not top.empty:
        col = "heads" if "heads" in top else "head" if "head" in top else None
        names = [_names(v) for v in top[col]] if col else [""] * len(top)
        fig.add_trace(go.Scatter(x=top["k"], y=top[metric], mode="lines+markers", line=dict(color="#c0392b", width=3),
                                 name="top-k discovered heads", customdata=names,
                                 hovertemplate=f"top-k<br>k=%{{x}}<br>{label}=%{{y:.3f}}<br>%{{customdata}}<extra></extra>"))
    if chance is not None:
        fig.add_hline(y=float(chance), line=dict(color="#888", dash="dash"), annotation_text=f"chance {chance:.2f}",
                      annotation_position="bottom right")
    fig.update_layout(title=dict(text=title or f"Ablation curve: {label} after removing k heads"),
                      xaxis=dict(title=dict(text="k (heads removed)"), dtick=1 if df["k"].max() <= 20 else None),
                      yaxis=dict(title=dict(text=label)), height=440, template="plotly_white",
                      legend=dict(orientation="h", yanchor="bottom", y=-0.35, x=0))
    return fig


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
