"""`HeadScan`: the result of a head scan -- every head's per-sample results, attribution estimates and the
numbers read from them (drops, bootstrap intervals, rank stability, the ranked table).

What one head's drop is: ``drop(head)`` = the scan's metric (:mod:`gna_interp.engine.metrics`) on the intact
model's per-sample results minus the same metric with the head ablated; exact for a head run exactly, the
attribution estimate otherwise. ``drops()`` gives every head's, and :meth:`HeadScan.to_frame` the ranked table
with 95 % bootstrap intervals. ``save`` / ``load`` write and read the ``scan`` document (every per-sample result).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from gna_interp.bootstrap import N_BOOTSTRAP, interval, paired_bootstrap
from gna_interp.constants import SCAN_JSON
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.options import check_level, check_n_boot
from gna_interp.results import Result
from gna_interp.store import file_in, read_json
from gna_interp.engine.metrics import RESULT_DTYPES, Results, get_metric

COLUMNS = ["layer", "head", "kind", "name", "baseline", "ablated", "drop", "rank", "source", "est_drop", "est_mass",
           "drop_lo", "drop_hi", "screen_drop"]
SCREEN_Z = 3.0  # a screened head's bound: mean + SCREEN_Z bootstrap standard deviations of its drop

__all__ = ["COLUMNS", "SCREEN_Z", "HeadScan"]


@dataclass
class HeadScan(Result):
    """Result of :func:`scan_heads`.

    ``baseline`` / ``exact[head]`` hold per-sample ``logit_diff`` and ``correct`` tensors (clean run /
    that head ablated); ``estimates[head]`` is the attribution estimate of the ablated mean logit
    difference, ``sizes[head]`` the relative size of its ablation and ``masses[head]`` the estimate's
    absolute mass, its per-token terms summed without cancellation (see
    :mod:`gna_interp.engine.attribution`).
    :meth:`to_frame` has one row per head with columns :data:`COLUMNS`. Saves to one ``scan`` JSON file
    (:meth:`save` / :meth:`load`, a folder's ``scan.json``); :meth:`plot` has no figure of its own
    (:func:`gna_interp.viz.score_heatmap` draws one).
    """

    FORMAT = "scan"
    FILE = SCAN_JSON
    INDENT = None  # every per-sample result: one line
    DRAWN_BY = "gna_interp.viz.score_heatmap(scan)"

    model: str
    task: str
    method: str
    metric: str
    strategy: str
    heads: list[HeadRef]
    baseline: Results
    exact: dict[HeadRef, Results] = field(default_factory=dict)
    estimates: dict[HeadRef, float] = field(default_factory=dict)
    sizes: dict[HeadRef, float] = field(default_factory=dict)
    masses: dict[HeadRef, float] = field(default_factory=dict)
    seconds: float = 0.0
    unsettled: int = 0
    screened: dict[HeadRef, Results] = field(default_factory=dict)
    screen_index: list[int] = field(default_factory=list)

    @property
    def estimand(self) -> str:
        """What attribution estimates for this scan (:attr:`Metric.estimand <gna_interp.engine.metrics.Metric>`):
        ``logprob`` for a ``logprob`` scan, else ``logit_diff``."""
        return get_metric(self.metric).estimand

    def _value(self, per_sample: Results, metric: str | None = None) -> float:
        return get_metric(metric or self.metric).value(per_sample)

    @property
    def baseline_value(self) -> float:
        return self._value(self.baseline)

    def ablated(self, head: HeadRef | str, metric: str | None = None) -> float:
        """Metric with ``head`` ablated: exact when it was run exactly, else the attribution estimate
        (logit difference only; NaN for accuracy)."""
        h = HeadRef.parse(head)
        if h in self.exact:
            return self._value(self.exact[h], metric)
        if h in self.estimates and (metric or self.metric) == self.estimand:
            return self.estimates[h]
        return math.nan

    def screen_bound(self, head: HeadRef, z: float | None = None, n_boot: int = N_BOOTSTRAP) -> tuple[float, float]:
        """A screened head's drop of :attr:`estimand` on the screening samples and its upper bound
        ``mean + z * sd`` (default ``z``: :data:`SCREEN_Z`) over bootstrap resamples of those samples
        (paired with the baseline)."""
        z = SCREEN_Z if z is None else z
        n_boot = check_n_boot(n_boot)
        idx = torch.tensor(self.screen_index)
        base = {k: v[idx] for k, v in self.baseline.items()}
        per = self.screened[head]
        m = len(idx)
        boot = paired_bootstrap(m, n_boot)
        est = get_metric(self.estimand)
        d = (est.resampled(base, boot) - est.resampled(per, boot)).double()
        mean = est.value(base) - est.value(per)
        return mean, mean + z * float(d.std())

    def error_scale(self, head: HeadRef) -> float:
        """How far ``auto`` lets ``head``'s estimate be off, in units of its calibration constant: the
        estimate's absolute mass when attribution measured it, else the ablation's relative size."""
        return self.masses[head] if self.masses else self.sizes[head]

    def drop(self, head: HeadRef | str, metric: str | None = None) -> float:
        """The drop of the metric (default: the scan's) when ``head`` alone is ablated: the intact model's value
        minus the ablated one. Exact for an exactly run head; for another head the attribution estimate of the
        scan's estimand (NaN when there is none)."""
        return self._value(self.baseline, metric) - self.ablated(head, metric) if self.baseline else math.nan

    def drops(self, metric: str | None = None) -> dict[HeadRef, float]:
        """:meth:`drop` of every scanned head, in scan order (``{HeadRef: drop}``)."""
        return {h: self.drop(h, metric) for h in self.heads}

    def est_drop(self, head: HeadRef) -> float:
        """Attribution estimate of the drop of :attr:`estimand` when ``head`` is ablated (NaN if none)."""
        return self._value(self.baseline, self.estimand) - self.estimates[head] if head in self.estimates else math.nan

    def intervals(self, level: float = 0.95, n_boot: int = N_BOOTSTRAP) -> dict[HeadRef, tuple[float, float]]:
        """Bootstrap interval (over samples, paired with the baseline; fixed seed) of each exactly run
        head's drop: ``{head: (low, high)}`` at ``level``."""
        n_boot, level = check_n_boot(n_boot), check_level(level)
        if not self.baseline or not self.exact:
            return {}
        key = (id(self.exact), len(self.exact), id(self.baseline), level, n_boot)
        cached = getattr(self, "_intervals", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        n = len(next(iter(self.baseline.values())))
        idx = paired_bootstrap(n, n_boot)
        metric = get_metric(self.metric)
        base = metric.resampled(self.baseline, idx)
        out = {h: interval(base - metric.resampled(per, idx), level) for h, per in self.exact.items()}
        self._intervals = (key, out)
        return out

    def stability(self, top: int = 10) -> dict[str, Any]:
        """How stable the ranking is: the exactly run heads ranked on two disjoint halves of the samples
        (even / odd), and the overlap of their top ``k = min(top, n_exact)`` (``top_k_overlap``) and top 5."""
        exact = [h for h in self.heads if h in self.exact]
        if not self.baseline or len(exact) < 2:
            return {}
        n = len(next(iter(self.baseline.values())))
        halves = [torch.arange(0, n, 2)[None], torch.arange(1, n, 2)[None]]
        if halves[1].numel() == 0:
            return {}
        metric = get_metric(self.metric)
        ranks, per_half = [], []
        for idx in halves:
            base = float(metric.resampled(self.baseline, idx)[0])
            drops = {h: base - float(metric.resampled(self.exact[h], idx)[0]) for h in exact}
            ranks.append(sorted(exact, key=lambda h: -drops[h]))
            per_half.append({h.name: d for h, d in drops.items()})
        k = min(top, len(exact))
        k5 = min(5, len(exact))
        return {"halves": "even/odd samples", "n_exact": len(exact), "k": k,
                "top_k_overlap": len(set(ranks[0][:k]) & set(ranks[1][:k])),
                "top5_overlap": len(set(ranks[0][:k5]) & set(ranks[1][:k5])),
                "top_half_a": [h.name for h in ranks[0][:k]], "top_half_b": [h.name for h in ranks[1][:k]],
                "drops_a": per_half[0], "drops_b": per_half[1]}

    def to_frame(self) -> pd.DataFrame:
        """One row per head, sorted by rank (1 = largest drop); ``drop_lo``/``drop_hi`` bound the drop of
        exactly run heads (95 % bootstrap interval over samples); ``screen_drop`` is a screened head's drop
        on the screening samples (``source`` ``screen``: its ``drop`` is still the attribution estimate)."""
        base = self.baseline_value
        ci = self.intervals()
        rows = []
        for h in self.heads:
            abl = self.ablated(h)
            est = self.est_drop(h)
            lo, hi = ci.get(h, (math.nan, math.nan))
            screen = self.screen_bound(h)[0] if h in self.screened else math.nan
            rows.append({"layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, "baseline": base,
                         "ablated": abl, "drop": base - abl, "source": "exact" if h in self.exact else "screen" if h in self.screened else
                         ("attribution" if h in self.estimates else "none"), "est_drop": est,
                         "est_mass": self.masses.get(h, math.nan),
                         "drop_lo": lo, "drop_hi": hi, "screen_drop": screen})
        df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "rank"])
        exact_first = (df["source"] != "exact").astype(int)
        key = df["drop"].where(df["source"] == "exact", df["est_drop"]).fillna(-math.inf)
        order = sorted(range(len(df)), key=lambda i: (exact_first.iloc[i], -key.iloc[i], i))
        df = df.iloc[order].reset_index(drop=True)
        df.insert(COLUMNS.index("rank"), "rank", range(1, len(df) + 1))
        return df

    def top(self, k: int) -> list[HeadRef]:
        """The ``k`` best-ranked heads."""
        return [HeadRef.parse(n) for n in self.to_frame()["name"].head(k)]

    @property
    def metrics(self) -> dict[str, Any]:
        """``baseline`` (the metric of the intact model), ``metric``, ``n_heads``, ``n_exact``, ``n_screened``,
        ``unsettled``, ``seconds``."""
        return {"baseline": self.baseline_value if self.baseline else math.nan, "metric": self.metric,
                "n_heads": len(self.heads), "n_exact": len(self.exact), "n_screened": len(self.screened),
                "unsettled": self.unsettled,
                "seconds": self.seconds}

    def to_state(self) -> dict[str, Any]:
        """Everything the scan measured, as JSON-able values (see :meth:`from_state`)."""
        return {"model": self.model, "task": self.task, "method": self.method, "metric": self.metric,
                "strategy": self.strategy, "heads": [h.name for h in self.heads],
                "baseline": results_to_json(self.baseline) if self.baseline else None,
                "exact": {h.name: results_to_json(v) for h, v in self.exact.items()},
                "estimates": {h.name: v for h, v in self.estimates.items()},
                "sizes": {h.name: v for h, v in self.sizes.items()},
                "masses": {h.name: v for h, v in self.masses.items()}, "seconds": self.seconds,
                "unsettled": self.unsettled, "screen_index": list(self.screen_index),
                "screened": {h.name: results_to_json(v) for h, v in self.screened.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], where: str = "the scan state") -> "HeadScan":
        """The scan :meth:`to_state` described (its per-sample lists must agree in length: ``where`` names the
        source in the error)."""
        _check_lengths(state, where)
        scan = cls(state["model"], state["task"], state["method"], state["metric"], state["strategy"],
                   [HeadRef.parse(n) for n in state["heads"]], {}, seconds=float(state.get("seconds") or 0.0),
                   unsettled=int(state.get("unsettled") or 0))
        scan.restore(state)
        return scan

    def restore(self, state: dict[str, Any]) -> None:
        """Take the per-sample results, estimates and sizes of a saved state (a checkpoint's)."""
        if state.get("baseline"):
            self.baseline = results_from_json(state["baseline"])
        self.exact = {HeadRef.parse(k): results_from_json(v) for k, v in state.get("exact", {}).items()}
        self.estimates = {HeadRef.parse(k): float(v) for k, v in state.get("estimates", {}).items()}
        self.sizes = {HeadRef.parse(k): float(v) for k, v in state.get("sizes", {}).items()}
        self.masses = {HeadRef.parse(k): float(v) for k, v in (state.get("masses") or {}).items()}
        self.screen_index = [int(i) for i in state.get("screen_index") or []]
        self.screened = {HeadRef.parse(k): results_from_json(v) for k, v in (state.get("screened") or {}).items()}

    def to_dict(self) -> dict[str, Any]:
        """The ``scan`` document's body: :meth:`to_state`."""
        return self.to_state()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HeadScan":
        """The scan :meth:`to_dict` described (:meth:`from_state`)."""
        return cls.from_state(d, where="the scan document")

    def save(self, path: str | os.PathLike, run_id: str | None = None) -> Path:
        """Write the scan (every per-sample result) to ``path`` (a file, or a folder: its ``scan.json``) as a
        ``scan`` JSON document (``run_id``: the id of the saved result it belongs to); return the file."""
        return self._write(path, **({"run_id": run_id} if run_id else {}))

    @classmethod
    def load(cls, path: str | os.PathLike, run_id: str | None = None) -> "HeadScan":
        """Read a scan written by :meth:`save` (the file, or the folder holding its ``scan.json``; given
        ``run_id``, it must carry that id)."""
        p = file_in(path, cls.FILE)
        return cls.from_state(read_json(p, cls.FORMAT, run_id), where=str(p))

    def __repr__(self) -> str:
        return (f"HeadScan({self.model!r}, {self.task!r}, {len(self.heads)} heads, {self.strategy}, "
                f"{self.method} ablation, baseline {self.metric}={self.baseline_value:.3f}, "
                f"{len(self.exact)} exact, {self.seconds:.1f}s)")

    def _repr_html_(self) -> str:
        """Jupyter's display: what was scanned, the top heads with their drops and 95 % intervals, and the drops
        as a layer x head heatmap (red: the metric falls when the head is removed; left out when a layer holds
        more heads than fit)."""
        from gna_interp import html_repr

        df = self.to_frame() if self.heads else pd.DataFrame(columns=COLUMNS)
        base = self.baseline_value if self.baseline else math.nan
        facts = [("model", self.model), ("task", self.task),
                 ("scan", f"{self.strategy}, {self.method} ablation, metric {self.metric}"),
                 ("baseline", f"{self.metric} = {html_repr.fmt(base)} (intact model)"),
                 ("heads", f"{len(self.heads)} scanned, {len(self.exact)} run exactly"
                           + (f", {len(self.screened)} screened" if self.screened else "")
                           + (f", {self.unsettled} unsettled" if self.unsettled else "")),
                 ("seconds", html_repr.fmt(self.seconds, 1))]
        parts = [html_repr.title(f"HeadScan of {self.model} on {self.task}", f"{len(self.heads)} heads"),
                 html_repr.facts(facts), html_repr.Raw(_top_table(df, TOP_HEADS, self.metric)), html_repr.Raw(drop_heatmap(df, self.metric))]
        return html_repr.block(parts)


TOP_HEADS = 10
"""Heads a scan or a circuit lists in Jupyter."""
_GRID_MAX = 64  # most heads in one heatmap row (a layer's heads of one kind) drawn as cells


def interval_text(lo: Any, hi: Any) -> str:
    """A 95 % interval as ``[lo, hi]`` for the HTML reprs (``–`` when either end is missing)."""
    from gna_interp import html_repr

    return "–" if lo is None or hi is None or pd.isna(lo) or pd.isna(hi) else f"[{html_repr.fmt(lo)}, {html_repr.fmt(hi)}]"


def _top_table(df: pd.DataFrame, top: int, metric: str) -> str:
    """The ``top`` best-ranked rows of a scan frame: rank, head, drop, its 95 % interval, ablated value, source."""
    from gna_interp import html_repr

    rows = [[int(r["rank"]), r["name"], html_repr.fmt(r["drop"]), interval_text(r["drop_lo"], r["drop_hi"]),
             html_repr.fmt(r["ablated"]), r["source"]] for _, r in df.head(top).iterrows()]
    return (html_repr.title(f"top {len(rows)} heads", f"drop = {metric} of the intact model minus with the head removed")
            + html_repr.table(["rank", "head", "drop", "95% interval", "ablated", "source"], rows))


def drop_heatmap(df: pd.DataFrame, metric: str) -> str:
    """The drops as coloured cells: a grid per head kind, one row per layer, one column per head index (a kind
    with more than :data:`_GRID_MAX` heads in a layer is named, not drawn); empty when there is nothing to draw."""
    from gna_interp import html_repr

    if df.empty:
        return ""
    rows: dict[tuple[int, str], dict[int, tuple[str, float]]] = {}
    for name, layer, head, kind, drop in zip(df["name"], df["layer"], df["head"], df["kind"], df["drop"]):
        rows.setdefault((int(layer), str(kind)), {})[int(head)] = (str(name), float(drop))
    columns: dict[str, list[int]] = {}  # the head indices of each kind, shared by its rows so that columns align
    for (_, kind), cells in rows.items():
        columns[kind] = sorted(set(columns.get(kind, [])) | set(cells))
    drops = [d for v in rows.values() for _, d in v.values() if not math.isnan(d)]
    scale = max((abs(d) for d in drops), default=0.0)
    grids = []
    for kind, heads in columns.items():  # one grid per head kind, its columns the head indices
        if len(heads) > _GRID_MAX:
            grids.append(html_repr.title(f"{HeadRef(0, 0, kind).adapter.title}: not drawn",
                                     f"{len(heads)} per layer, more than the {_GRID_MAX} drawn here "
                                     f"(gna_interp.viz draws every head)"))
            continue
        lines = []
        for (layer, k), cells in sorted(rows.items()):
            if k != kind:
                continue
            letter = HeadRef(0, 0, kind).adapter.letter
            lines.append((f"L{layer}{letter}", [(f"{cells[i][0]}: drop {html_repr.fmt(cells[i][1])}", cells[i][1])
                                                if i in cells else (f"L{layer}{letter}{i}: not scanned", math.nan)
                                                for i in heads]))
        grids.append(html_repr.grid(lines, scale, columns=heads))
    return (html_repr.title("drop by head", f"red: {metric} falls when the head is removed, blue: it rises; "
                                        f"full colour at |drop| = {html_repr.fmt(scale)}; hover a cell for its head")
            + "".join(grids))


# ---- per-sample results as JSON -----------------------------------------------------------------


def results_to_json(per: Results) -> dict[str, list]:
    """Per-sample results as JSON lists (read back by :func:`results_from_json`)."""
    return {k: per[k].tolist() for k in RESULT_DTYPES if k in per}


def _check_lengths(state: dict[str, Any], where: str) -> None:
    """Refuse a state whose per-sample lists disagree in length (every head's results cover the baseline's samples;
    a screened head's the screening samples) or that names results for heads it does not scan."""
    heads = set(state.get("heads") or [])
    n = None
    if state.get("baseline"):
        lengths = {len(v) for v in state["baseline"].values()}
        if len(lengths) > 1:
            raise InputError(f"{where}: the baseline's per-sample lists have different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else None
    m = len(state.get("screen_index") or [])
    for key, want in (("exact", n), ("screened", m)):
        for name, per in (state.get(key) or {}).items():
            if name not in heads:
                raise InputError(f"{where}: {key} holds results for {name}, which is not among the scanned heads")
            bad = {k: len(v) for k, v in per.items() if want is not None and len(v) != want}
            if bad:
                raise InputError(f"{where}: {key} {name} has {bad} per-sample values where the "
                                 f"{'baseline' if key == 'exact' else 'screening set'} has {want}")
    if n is not None and any(i >= n for i in state.get("screen_index") or []):
        raise InputError(f"{where}: screen_index names a sample beyond the {n} of the baseline")


def results_from_json(d: dict[str, list]) -> Results:
    """Per-sample tensors from JSON (strict JSON stores a non-finite value, e.g. the infinite logit
    difference of a single-candidate sample, as null: it comes back as NaN)."""
    return {k: torch.tensor([math.nan if v is None else v for v in d[k]], dtype=dtype)
            for k, dtype in RESULT_DTYPES.items() if k in d}
