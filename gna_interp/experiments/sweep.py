"""`sweep`: KV-retrieval accuracy against dictionary size, intact and with G&A heads removed.

The paper (Bick, Xing & Gu 2025) evaluates KV retrieval at dictionary sizes 10, 15, ..., 50 with the
G&A heads removed and finds a roughly *constant drop*: removing the heads costs about the same accuracy
at every size, on top of the intact model's own decline. :func:`sweep` measures it on any model.

At every dictionary size ``n`` of ``pairs`` one KV task (``samples`` prompts, official template, values
``0..max_value``, seeded by ``seed``; keys from ``model.kv_words`` when the model has them) is scored
under each **condition** (zero ablation, the paper's; the same prompts for every condition):

=============  ======================================================================================
``intact``     nothing removed
``top1``       the circuit's best-ranked head removed
``topk``       its ``k`` best-ranked heads removed together
``random``     ``k`` heads drawn at random from the other scanned heads; one draw per seed
               (``seeds`` of them), the *same* draw at every size, so each seed is one line
=============  ======================================================================================

``k`` follows the ablation curve's rule (:func:`~gna_interp.circuits.search.curve.curve_k`): at most a
quarter of the scanned heads, so that ``k`` random heads are a small draw that cannot hold the circuit.

**Single heads** (``heads=``, ``gna sweep --heads``): one more condition per entry, that head removed
alone: a head name (``L16H0``; the condition is named after the head) or a role word, ``gather`` /
``aggregate`` (the circuit's :meth:`~gna_interp.circuits.search.circuit.Circuit.pair`: the strongest measured
gather -> aggregate path, else the pattern roles). These are the paper's per-head signatures: removing the
gather head costs about the same at every size, removing the aggregate head costs more as the dictionary
grows. Named heads alone need no circuit: with ``heads`` of head names only and no ``circuit``, nothing is
discovered and the conditions are ``intact`` and the named heads.

**Drop slopes** (:meth:`Sweep.slopes`): for every condition, the least-squares slope of its drop from
intact (of accuracy, and of the mean logit difference) against the dictionary size, per 10 pairs, with a
bootstrap interval over the prompts (each size's prompts resampled with replacement, the same prompts for the
intact model and the condition; ``bootstrap`` resamples, default :data:`~gna_interp.constants.N_BOOTSTRAP`).

**Heads** come from a saved circuit (``circuit=DIR``, a ``gna scan`` folder) or are discovered first as
``gna scan`` discovers them (the task form the model solves, chosen by
:func:`~gna_interp.tasks.choice.choose_task`; 24 prompts; the auto scan), on prompts built with ``seed + 1`` so
the heads are never scored on the prompts they were found on. With
``out=DIR`` the discovered circuit is saved in ``DIR/circuit`` (a ``gna scan`` folder: ``gna report
DIR/circuit`` draws it).

**Output** (``out=DIR``, :class:`~gna_interp.experiments.output.ResultFolder` ``sweep``): ``sweep.csv``
(one row per point, columns :data:`COLUMNS`), ``sweep.json`` (settings, heads, random draws, the
per-size summary, the drop slopes, each point's per-prompt results), ``report.html`` with the figures
(accuracy vs dictionary size, one line per condition, random as the median of the draws with their min-max
band; each condition's drop vs dictionary size with its least-squares line) and ``figures/sweep.png``,
``figures/drops.png``. Every point is
appended to ``DIR/sweep.ckpt.json`` as it finishes; ``resume=True`` continues from it (``fresh=True``
deletes it and the discovered circuit); a checkpoint is never overwritten silently.
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np
import pandas as pd
import torch

from gna_interp.bootstrap import interval, paired_bootstrap
from gna_interp.constants import CIRCUIT_JSON, N_BOOTSTRAP, SCAN_CKPT
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.engine.replay import SetAblation
from gna_interp.errors import HeadError, InputError
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.experiments.run import (Discovery, Point, model_of, open_folder, random_draws, removed_k, resolve_circuit,
                                        run_points)
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import check_counts, check_int, check_n_boot, check_pairs_fit, options
from gna_interp.store import records
from gna_interp.tasks import KVRetrieval
from gna_interp.tasks.choice import check_knobs
from gna_interp.tasks.kv import PAPER_SIZES, TEMPLATES
from gna_interp.tasks.options import TaskOptions
from gna_interp.viz.html import part

__all__ = ["COLUMNS", "CONDITIONS", "ROLES", "SLOPE_COLUMNS", "Sweep", "SweepConfig", "parse_pairs", "parse_single",
           "sweep"]

COLUMNS = ["pairs", "condition", "seed", "k", "accuracy", "logit_diff", "gold_prob", "chance", "n_samples", "heads"]
CONDITIONS: tuple[str, ...] = ("intact", "top1", "topk", "random")
NAME = "sweep"
CKPT = "sweep.ckpt.json"
CIRCUIT_DIR = "circuit"
_COLOURS = {"intact": "#222222", "top1": "#e67e22", "topk": "#c0392b", "random": "#7f8c8d", "gather": "#2980b9",
            "aggregate": "#8e44ad"}
_PALETTE = ["#16a085", "#d35400", "#2c3e50", "#27ae60", "#c71585", "#b7950b", "#5d6d7e", "#a93226"]
ROLES: tuple[str, ...] = ("gather", "aggregate")
SLOPE_COLUMNS = ["condition", "heads", "sizes", "drop_mean", "drop_slope_per_10", "drop_slope_lo", "drop_slope_hi",
                 "ld_drop_mean", "ld_drop_slope_per_10", "ld_drop_slope_lo", "ld_drop_slope_hi", "trend", "ld_trend"]
LEVEL = 0.95
_METRICS = ("accuracy", "logit_diff", "gold_prob", "chance", "n_samples")


# ---- parsing ------------------------------------------------------------------------------------------
def parse_pairs(pairs: int | str | Iterable[int]) -> list[int]:
    """Dictionary sizes from ``10,15,20`` or a list: integers >= 2, no repeats, returned ascending."""
    if isinstance(pairs, str):
        parts = [p.strip() for p in pairs.split(",") if p.strip()]
        try:
            vals = [int(p) for p in parts]
        except ValueError:
            raise InputError(f"pairs {pairs!r}: give comma-separated integers, e.g. 10,15,20") from None
    elif isinstance(pairs, int):
        vals = [pairs]
    else:
        vals = list(pairs)
    bad = [v for v in vals if isinstance(v, bool) or not isinstance(v, int) or v < 2]
    if not vals or bad:
        raise InputError(f"pairs must be integers >= 2 (a dictionary needs two lines to choose between), got "
                         f"{bad or 'none'}")
    dup = sorted({v for v in vals if vals.count(v) > 1})
    if dup:
        raise InputError(f"pairs {dup} given more than once; list each dictionary size once")
    return sorted(vals)


def parse_single(heads: Any) -> list[str | HeadRef]:
    """The single-head conditions of ``heads`` (``"gather,aggregate,L16H0"`` or a list of role words, names and
    :class:`HeadRef`), in the order given: the role words ``gather`` / ``aggregate`` as strings, heads parsed (a
    malformed name, a repeat or an empty list raise :class:`~gna_interp.errors.HeadError`); ``None`` gives ``[]``.
    Whether a head exists in the model is checked when the model is loaded. An empty list is no single heads;
    an empty string is an error (``--heads ""`` is a slip, not a choice)."""
    if heads is None or isinstance(heads, (list, tuple)) and not heads:
        return []
    if isinstance(heads, (str, HeadRef)):
        items: list[Any] = [heads] if isinstance(heads, HeadRef) else heads.split(",")
    elif isinstance(heads, (list, tuple)):
        items = list(heads)
    else:
        raise HeadError(f"heads must be a comma-separated string or a list of head names and role words "
                        f"({', '.join(ROLES)}), got {type(heads).__name__}")
    items = [h.strip() if isinstance(h, str) else h for h in items]
    if not items or any(h == "" for h in items):
        raise HeadError(f"heads {heads!r}: {'no head' if not items or items == [''] else 'an empty name between commas'}"
                        f"; pass head names and role words like 'gather,aggregate,L16H0'")
    try:
        out: list[str | HeadRef] = [h.lower() if isinstance(h, str) and h.lower() in ROLES else HeadRef.parse(h)
                                    for h in items]
    except HeadError as e:
        raise HeadError(f"heads {heads!r}: {e}; or a role word of the circuit's pair: {', '.join(ROLES)}") from None
    seen: set[Any] = set()
    for h in out:
        if h in seen:
            raise HeadError(f"{h if isinstance(h, str) else h.name} is named twice in the heads {heads!r}; name each "
                            f"condition once")
        seen.add(h)
    return out


def _slope(x: np.ndarray, y: np.ndarray) -> float:
    """Least-squares slope of ``y`` on ``x`` (``numpy.polyfit`` degree 1), NaN with fewer than two points or any NaN."""
    if len(x) < 2 or np.isnan(y).any():
        return math.nan
    return round(float(np.polyfit(x, y, 1)[0]), 12)  # rounded: a constant drop prints 0, not -1e-17


def _trend(lo: float, hi: float) -> str:
    """``grows`` / ``shrinks`` when the interval lies above / below 0, ``flat`` when it holds 0, ``""`` unknown."""
    if math.isnan(lo) or math.isnan(hi):
        return ""
    return "grows" if lo > 0 else "shrinks" if hi < 0 else "flat"


def _per_sample(scores: Any) -> dict[str, list[float]]:
    """What the bootstrap needs of one point: each prompt's correctness (0/1) and logit difference."""
    return {"correct": [int(c) for c in scores.correct.tolist()],
            "logit_diff": [round(float(v), 6) if math.isfinite(v) else None for v in scores.logit_diff.tolist()]}


# ---- the result ----------------------------------------------------------------------------------------
@dataclass
class Sweep(ExperimentResult, format=NAME):
    """Result of :func:`sweep`: a folder result (:meth:`save` / :meth:`load`) with a figure (:meth:`figure`,
    :meth:`plot`; :meth:`drop_figure` the drops).

    Attributes:
        model: the model's name (its spec when loaded by spec).
        pairs: the dictionary sizes, ascending.
        heads: the circuit's ``k`` best-ranked heads (``heads[:1]`` is the ``top1`` condition); empty when only
            named heads were measured (no circuit).
        random: the random draws, one list of ``k`` heads per seed.
        table: one row per point, columns :data:`COLUMNS`.
        settings: samples, seed, max_value, template, k, seeds, batch_size (and ``heads``, ``bootstrap``).
        source: where the heads came from (a sentence).
        notes: sentences about the run.
        seconds: wall time of the measured points (this run's, not a resumed run's earlier part).
        single: the single-head conditions, condition -> head removed alone (``gather``, ``aggregate``, or a
            head's own name), in the order given.
        per_sample: each point's per-prompt results (``correct``, ``logit_diff``), keyed ``"pairs/condition/seed"``;
            what the bootstrap intervals of :meth:`slopes` resample (points of an older run may lack them).
    """

    model: str
    pairs: list[int]
    heads: list[HeadRef]
    random: list[list[HeadRef]]
    table: pd.DataFrame
    source: str = ""
    seconds: float = 0.0
    single: dict[str, HeadRef] = field(default_factory=dict)
    per_sample: dict[str, dict[str, list[Any]]] = field(default_factory=dict)

    @property
    def k(self) -> int:
        """Heads removed together in the ``topk`` and ``random`` conditions."""
        return len(self.heads)

    def to_frame(self) -> pd.DataFrame:
        """The points (columns :data:`COLUMNS`)."""
        return self.table.copy()

    def label(self, cond: str) -> str:
        """How a condition is named in the summary, the figures and the slope table."""
        if cond in self.single:
            h = self.single[cond].name
            return h if cond == h else f"{cond} {h}"
        return {"top1": f"top-1 ({self.heads[0].name})" if self.heads else "top-1", "topk": f"top-{self.k}",
                "random": f"{self.k} random (mean of {len(self.random)} draws)"}.get(cond, cond)

    def conditions(self) -> list[str]:
        """The conditions measured besides ``intact``, in the order of the table: ``top1``, ``topk`` (when
        ``k > 1``), ``random`` (with a circuit), then the single heads."""
        out = []
        if self.heads:
            out += ["top1"] + (["topk"] if self.k > 1 else []) + (["random"] if self.random else [])
        return out + list(self.single)

    def by_pairs(self) -> pd.DataFrame:
        """One row per dictionary size: ``pairs, chance, intact, top1, topk, random_median, random_min,
        random_max`` (accuracies) and the drops from intact ``drop_top1, drop_topk, drop_random`` (the last
        from the random median); then, per single-head condition ``c``, its accuracy ``c`` and ``drop_c``."""
        t = self.table
        rows = []
        for n in self.pairs:
            at = t[t["pairs"] == n]

            def acc(cond: str) -> float:
                v = at.loc[at["condition"] == cond, "accuracy"]
                return float(v.iloc[0]) if len(v) else math.nan

            rnd = at.loc[at["condition"] == "random", "accuracy"]
            med = float(rnd.median()) if len(rnd) else math.nan
            intact = acc("intact")
            row = {"pairs": n, "chance": float(at["chance"].iloc[0]) if len(at) else 1 / n, "intact": intact,
                   "top1": acc("top1"), "topk": acc("topk"), "random_median": med,
                   "random_min": float(rnd.min()) if len(rnd) else math.nan,
                   "random_max": float(rnd.max()) if len(rnd) else math.nan,
                   "drop_top1": intact - acc("top1"), "drop_topk": intact - acc("topk"),
                   "drop_random": intact - med}
            for cond in self.single:
                row[cond] = acc(cond)
            for cond in self.single:
                row[f"drop_{cond}"] = intact - acc(cond)
            rows.append(row)
        return pd.DataFrame(rows)

    def drops(self) -> pd.DataFrame:
        """One row per condition (:meth:`conditions`) and size: ``condition, label, heads, pairs, accuracy,
        drop, logit_diff, ld_drop`` (drops from intact; ``random`` is the mean over its draws)."""
        t = self.table
        rows = []
        for cond in self.conditions():
            for n in self.pairs:
                at = t[t["pairs"] == n]
                intact, one = at[at["condition"] == "intact"], at[at["condition"] == cond]
                if intact.empty or one.empty:
                    continue
                acc, ld = float(one["accuracy"].mean()), float(one["logit_diff"].mean())
                heads = one["heads"].iloc[0] if cond != "random" else f"{len(one)} draws of {self.k}"
                rows.append({"condition": cond, "label": self.label(cond), "heads": heads, "pairs": n,
                             "accuracy": acc, "drop": float(intact["accuracy"].iloc[0]) - acc, "logit_diff": ld,
                             "ld_drop": float(intact["logit_diff"].iloc[0]) - ld})
        return pd.DataFrame(rows, columns=["condition", "label", "heads", "pairs", "accuracy", "drop", "logit_diff",
                                           "ld_drop"])

    def _differences(self, cond: str, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Per prompt at size ``n``: intact minus ``cond`` (random: minus the mean over its draws) of correctness
        and of the logit difference; None when a point lacks its per-prompt results."""
        base = self.per_sample.get(f"{n}/intact/0")
        keys = ([f"{n}/random/{s}" for s in range(len(self.random))] if cond == "random" else [f"{n}/{cond}/0"])
        got = [self.per_sample.get(k) for k in keys]
        if base is None or not got or any(g is None for g in got):
            return None

        def arr(d: dict[str, list[Any]], key: str) -> np.ndarray:
            return np.array([math.nan if v is None else v for v in d[key]], dtype=float)

        acc = arr(base, "correct") - np.mean([arr(g, "correct") for g in got], axis=0)
        ld = arr(base, "logit_diff") - np.mean([arr(g, "logit_diff") for g in got], axis=0)
        return acc, ld

    def slopes(self, resamples: int | None = None, seed: int | None = None, level: float = LEVEL) -> pd.DataFrame:
        """Each condition's drop from intact against the dictionary size: columns :data:`SLOPE_COLUMNS`.

        ``drop_mean`` is the mean accuracy drop over the sizes and ``drop_slope_per_10`` its least-squares slope
        (``10 * numpy.polyfit(pairs, drop, 1)[0]``: the drop gained per 10 more pairs; the ``ld_`` columns the
        same for the mean logit difference). ``*_lo`` / ``*_hi``: the ``level`` interval
        (:func:`~gna_interp.bootstrap.interval`) of the slope over ``resamples`` bootstrap draws of the prompts
        (default the run's ``bootstrap`` setting, :data:`~gna_interp.constants.N_BOOTSTRAP`; 0 none): the prompts
        of the ``j``-th size are drawn by :func:`~gna_interp.bootstrap.paired_bootstrap` seeded ``seed + j``
        (``seed``: default the run's), the same ones for the intact model and the condition (the sizes' prompts
        are independent). ``trend`` / ``ld_trend``: ``grows`` (interval above 0), ``shrinks`` (below) or ``flat``
        (holds 0). The interval counts the prompts' sampling noise only.
        """
        d = self.drops()
        b = int(self.settings.get("bootstrap", N_BOOTSTRAP) if resamples is None else resamples)
        check_int("resamples", b, 0)
        x = np.array(self.pairs, dtype=float)
        w = torch.from_numpy((x - x.mean()) / ((x - x.mean()) ** 2).sum() * 10) if len(x) >= 2 else None
        seed = int(self.settings.get("seed", 0) or 0) if seed is None else seed
        draws = self._draws(b, seed) if b and w is not None else {}
        rows = []
        for cond in self.conditions():
            one = d[d["condition"] == cond].set_index("pairs").reindex(self.pairs)
            row: dict[str, Any] = {"condition": cond, "heads": "" if one.empty else str(one["heads"].iloc[0]),
                                   "sizes": int(one["drop"].notna().sum())}
            diffs = [self._differences(cond, n) for n in self.pairs] if draws else [None]
            for pre, col, key in (("", "drop", 0), ("ld_", "ld_drop", 1)):
                y = one[col].to_numpy(dtype=float)
                row[f"{pre}drop_mean"] = float(np.nanmean(y)) if np.isfinite(y).any() else math.nan
                row[f"{pre}drop_slope_per_10"] = _slope(x, y) * 10
                lo = hi = math.nan
                if all(v is not None for v in diffs) and all(len(v[key]) == draws[n].shape[1]  # type: ignore[index]
                                                            for v, n in zip(diffs, self.pairs)):
                    # drops of each resample of the prompts, one column a size; the slope is linear in them
                    boot = torch.stack([torch.from_numpy(v[key])[draws[n]].mean(-1)  # type: ignore[index]
                                        for v, n in zip(diffs, self.pairs)], dim=1)
                    if boot.isfinite().all():
                        lo, hi = interval(boot @ w, level)
                row[f"{pre}drop_slope_lo"], row[f"{pre}drop_slope_hi"] = lo, hi
            row["trend"] = _trend(row["drop_slope_lo"], row["drop_slope_hi"])
            row["ld_trend"] = _trend(row["ld_drop_slope_lo"], row["ld_drop_slope_hi"])
            rows.append(row)
        return pd.DataFrame(rows, columns=SLOPE_COLUMNS)

    def _draws(self, resamples: int, seed: int) -> dict[int, torch.Tensor]:
        """Per size, ``resamples`` draws of its prompts' indices (:func:`paired_bootstrap`, seeded ``seed + j`` for
        the ``j``-th size)."""
        out = {}
        for j, n in enumerate(self.pairs):
            m = len(self.per_sample.get(f"{n}/intact/0", {}).get("correct", []))
            out[n] = (paired_bootstrap(m, resamples, seed + j) if m
                      else torch.zeros((check_n_boot(resamples), 0), dtype=torch.long))
        return out

    @property
    def metrics(self) -> dict[str, Any]:
        """Mean drops over the sizes (``drop_top1``, ``drop_topk``, ``drop_random``), the top-k drop's range
        (``drop_topk_min``, ``drop_topk_max``) and its least-squares slope per 10 pairs
        (``drop_topk_slope_per_10``: near 0 for the paper's constant drop), ``k``, ``sizes``; per single-head
        condition ``c``, ``drop_c`` (mean) and ``drop_c_slope_per_10`` (see :meth:`slopes` for intervals)."""
        b = self.by_pairs()
        x = b["pairs"].to_numpy(dtype=float)
        slope = _slope(x, b["drop_topk"].to_numpy(dtype=float)) * 10
        out = {"k": self.k, "sizes": len(self.pairs), "drop_top1": float(b["drop_top1"].mean()),
               "drop_topk": float(b["drop_topk"].mean()), "drop_random": float(b["drop_random"].mean()),
               "drop_topk_min": float(b["drop_topk"].min()), "drop_topk_max": float(b["drop_topk"].max()),
               "drop_topk_slope_per_10": slope}
        for cond in self.single:
            y = b[f"drop_{cond}"].to_numpy(dtype=float)
            out[f"drop_{cond}"] = float(np.mean(y))
            out[f"drop_{cond}_slope_per_10"] = _slope(x, y) * 10
        return out

    def summary(self) -> str:
        """A few lines: the heads, one line per size and the drop statistics (with single heads, their accuracy
        per size and every condition's drop slope with its interval)."""
        st = self.settings
        lines = []
        if self.heads:
            names = ", ".join(h.name for h in self.heads)
            lines += [f"dictionary sweep of {self.model}: {st.get('samples')} prompts per size, values "
                      f"0-{st.get('max_value')}; top {self.k} heads {names} ({self.source})",
                      "pairs  intact   top1  top-k  random (median, min-max)"]
            for _, r in self.by_pairs().iterrows():
                lines.append(f"{int(r['pairs']):5d}  {r['intact']:.3f}  {r['top1']:.3f}  {r['topk']:.3f}  "
                             f"{r['random_median']:.3f} ({r['random_min']:.3f}-{r['random_max']:.3f})")
            lines.append(self._drop_line())
        else:
            lines.append(f"dictionary sweep of {self.model}: {st.get('samples')} prompts per size, values "
                         f"0-{st.get('max_value')}; {self.source}")
        if self.single:
            labels = [self.label(c) for c in self.single]
            width = max(14, *(len(lb) for lb in labels))
            lines.append("single heads removed: accuracy (drop from intact)")
            lines.append("pairs  intact  " + "  ".join(f"{lb:>{width}}" for lb in labels))
            for _, r in self.by_pairs().iterrows():
                cells = [f"{r[c]:.3f} ({r['drop_' + c]:+.3f})" for c in self.single]
                lines.append(f"{int(r['pairs']):5d}  {r['intact']:6.3f}  " + "  ".join(f"{c:>{width}}" for c in cells))
        lines += self._slope_lines()
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def _slope_lines(self) -> list[str]:
        sl = self.slopes()
        if sl.empty or len(self.pairs) < 2:
            return []
        b = int(self.settings.get("bootstrap", N_BOOTSTRAP))
        ci = (f"{LEVEL:.0%} bootstrap interval over the prompts, {b} resamples" if b else "no bootstrap interval")
        labels = {c: self.label(c) for c in sl["condition"]}
        width = max(9, *(len(v) for v in labels.values()))
        lines = [f"drop slope per 10 pairs (least squares; {ci}):",
                 f"{'condition':<{width}}  mean drop  accuracy slope [interval]      logit-diff drop  slope [interval]"]

        def cell(r: Any, pre: str) -> str:
            lo, hi = r[f"{pre}drop_slope_lo"], r[f"{pre}drop_slope_hi"]
            iv = f"[{lo:+.3f}, {hi:+.3f}]" if not (math.isnan(lo) or math.isnan(hi)) else "[n/a]"
            trend = r[f"{pre}trend"]
            return f"{r[pre + 'drop_slope_per_10']:+.3f} {iv}{' ' + trend if trend else ''}"

        for _, r in sl.iterrows():
            lines.append(f"{labels[r['condition']]:<{width}}  {r['drop_mean']:9.3f}  {cell(r, ''):<29}  "
                         f"{r['ld_drop_mean']:15.3f}  {cell(r, 'ld_')}")
        return lines

    def _drop_line(self) -> str:
        m = self.metrics
        return (f"drop from intact, mean over sizes: top-1 {m['drop_top1']:.3f}, top-{self.k} {m['drop_topk']:.3f} "
                f"(range {m['drop_topk_min']:.3f}-{m['drop_topk_max']:.3f}, slope {m['drop_topk_slope_per_10']:+.3f} "
                f"per 10 pairs), {self.k} random {m['drop_random']:.3f} (median of the draws)")

    def _single_colour(self, cond: str) -> str:
        if cond in _COLOURS:
            return _COLOURS[cond]
        named = [c for c in self.single if c not in _COLOURS]
        return _PALETTE[named.index(cond) % len(_PALETTE)]

    def figure(self, title: str | None = None) -> Any:
        """Accuracy vs dictionary size: intact, top-1 removed, top-k removed, and the random draws' median
        with their min-max band (each seed faint), each single head removed; chance ``1/n`` dotted."""
        import plotly.graph_objects as go

        b = self.by_pairs()
        t = self.table
        fig = go.Figure()
        rnd = t[t["condition"] == "random"]
        if not rnd.empty:
            for s, one in rnd.groupby("seed"):
                one = one.sort_values("pairs")
                fig.add_trace(go.Scatter(x=one["pairs"], y=one["accuracy"], mode="lines",
                                         line=dict(color="rgba(127,140,141,0.35)", width=1), showlegend=False,
                                         name=f"random seed {s}", customdata=one["heads"],
                                         hovertemplate=f"random seed {s}<br>%{{x}} pairs: %{{y:.3f}}<br>"
                                                       f"removed %{{customdata}}<extra></extra>"))
            fig.add_trace(go.Scatter(x=list(b["pairs"]) + list(b["pairs"])[::-1],
                                     y=list(b["random_max"]) + list(b["random_min"])[::-1], fill="toself", mode="lines",
                                     fillcolor="rgba(127,140,141,0.2)", line=dict(width=0), hoverinfo="skip",
                                     name=f"{self.k} random heads: min-max of {len(self.random)} draws"))
            fig.add_trace(go.Scatter(x=b["pairs"], y=b["random_median"], mode="lines+markers",
                                     line=dict(color=_COLOURS["random"], dash="dash"),
                                     name=f"{self.k} random heads removed (median)"))
        top = ", ".join(h.name for h in self.heads)
        for cond, label in (("intact", "intact"), ("top1", f"top-1 removed ({self.heads[0].name})" if self.heads else ""),
                            ("topk", f"top-{self.k} removed ({top})")):
            if cond != "intact" and (self.k == 0 or cond == "topk" and self.k == 1):
                continue
            fig.add_trace(go.Scatter(x=b["pairs"], y=b[cond], mode="lines+markers", name=label,
                                     line=dict(color=_COLOURS[cond], width=3 if cond != "top1" else 2)))
        for cond in self.single:
            fig.add_trace(go.Scatter(x=b["pairs"], y=b[cond], mode="lines+markers", name=f"{self.label(cond)} removed",
                                     line=dict(color=self._single_colour(cond), width=2, dash="dot")))
        fig.add_trace(go.Scatter(x=b["pairs"], y=b["chance"], mode="lines", name="chance (1/n)",
                                 line=dict(color="#aaaaaa", dash="dot", width=1)))
        fig.update_layout(title=title or f"KV retrieval vs dictionary size: {self.model}", template="plotly_white",
                          height=480, xaxis_title="dictionary size (key:value lines)", yaxis_title="accuracy",
                          yaxis_range=[-0.02, 1.02], legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
        fig.update_xaxes(tickvals=self.pairs)
        return fig

    def drop_figure(self, title: str | None = None) -> Any:
        """Each condition's drop from intact against the dictionary size -- accuracy (left) and mean logit
        difference (right) -- with its least-squares line; the legend gives the slope per 10 pairs and its
        bootstrap interval (:meth:`slopes`)."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        d, sl = self.drops(), self.slopes().set_index("condition")
        fig = make_subplots(rows=1, cols=2, subplot_titles=("accuracy drop from intact",
                                                            "logit-difference drop from intact"))
        x = np.array(self.pairs, dtype=float)
        for cond in self.conditions():
            one = d[d["condition"] == cond].sort_values("pairs")
            if one.empty:
                continue
            colour = self._single_colour(cond) if cond in self.single else _COLOURS[cond]
            r = sl.loc[cond]

            def slope(pre: str) -> str:
                lo, hi = r[f"{pre}drop_slope_lo"], r[f"{pre}drop_slope_hi"]
                iv = f" [{lo:+.3f}, {hi:+.3f}]" if not (math.isnan(lo) or math.isnan(hi)) else ""
                return f"{r[pre + 'drop_slope_per_10']:+.3f}{iv}"

            name = f"{self.label(cond)}: accuracy {slope('')}, logit diff {slope('ld_')} per 10 pairs"
            for col, ycol in enumerate(("drop", "ld_drop"), start=1):
                fig.add_trace(go.Scatter(x=one["pairs"], y=one[ycol], mode="markers", marker=dict(color=colour, size=8),
                                         name=name, legendgroup=cond, showlegend=col == 1), row=1, col=col)
                y = one[ycol].to_numpy(dtype=float)
                if len(one) >= 2 and np.isfinite(y).all():
                    a, c0 = np.polyfit(one["pairs"].to_numpy(dtype=float), y, 1)
                    fig.add_trace(go.Scatter(x=x, y=a * x + c0, mode="lines", line=dict(color=colour, dash="dash"),
                                             legendgroup=cond, showlegend=False, hoverinfo="skip"), row=1, col=col)
        fig.update_layout(title=title or f"Drop from intact vs dictionary size: {self.model}", template="plotly_white",
                          height=520, legend=dict(orientation="h", yanchor="top", y=-0.2, x=0))
        fig.update_xaxes(title_text="dictionary size (key:value lines)", tickvals=self.pairs)
        fig.update_yaxes(title_text="accuracy drop", row=1, col=1)
        fig.update_yaxes(title_text="logit-difference drop", row=1, col=2)
        return fig

    def to_dict(self) -> dict[str, Any]:
        """The ``sweep`` document's body: heads, draws, settings, metrics, the per-size summary, the slopes, each
        point's per-prompt results and the points (``table``, last)."""
        return {"model": self.model, "pairs": self.pairs, "heads": [h.name for h in self.heads],
                "random": [[h.name for h in d] for d in self.random], "settings": self.settings,
                "source": self.source, "notes": self.notes, "seconds": round(self.seconds, 2),
                "metrics": self.metrics, "by_pairs": self.by_pairs().to_dict(orient="records"),
                "single": {c: h.name for c, h in self.single.items()},
                "slopes": self.slopes().to_dict(orient="records"), "per_sample": self.per_sample,
                "table": records(self.table)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Sweep":
        """The sweep :meth:`to_dict` described."""
        table = doc_table(d, COLUMNS)
        if len(table):
            table["heads"] = table["heads"].fillna("")
        return cls(d["model"], [int(n) for n in d["pairs"]], [HeadRef.parse(h) for h in d["heads"]],
                   [[HeadRef.parse(h) for h in r] for r in d["random"]], table,
                   d.get("source", ""), float(d.get("seconds") or 0.0),
                   {c: HeadRef.parse(h) for c, h in (d.get("single") or {}).items()},
                   dict(d.get("per_sample") or {}), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write ``sweep.csv``, ``sweep.json``, ``report.html`` and ``figures/sweep.png``, ``figures/drops.png``
        into the folder ``path`` (or the folder of ``path`` naming its ``sweep.json``); return the folder.
        :meth:`load` reads the folder or the file."""
        b = self.by_pairs()
        st, top = self.settings, ", ".join(h.name for h in self.heads)
        single = "; ".join(f"{self.label(c)} removed alone" for c in self.single)
        if self.heads:
            conds = (f"Conditions: intact; top-1 ({self.heads[0].name}) removed; top-{self.k} ({top}) removed; "
                     f"{self.k} random heads removed ({len(self.random)} draws, the same heads at every size)"
                     f"{'; ' + single if single else ''}.")
        else:
            conds = f"Conditions: intact; {single}."
        notes = [f"Heads: {self.source}.", f"{conds} Zero ablation; {st.get('samples')} prompts per size, values "
                 f"0-{st.get('max_value')}, seed {st.get('seed')}."]
        notes += ([self._drop_line()] if self.heads else []) + self.notes
        bs = int(st.get("bootstrap", N_BOOTSTRAP))
        section = [part("heading", "Accuracy by dictionary size"), table_html(b),
                   part("heading", "Drop slope over dictionary size"),
                   part("note", "Least-squares slope of each condition's drop from intact against the number of "
                        "pairs, per 10 pairs (accuracy; ld_: mean logit difference); lo-hi: "
                        + (f"{LEVEL:.0%} percentile bootstrap interval over the prompts ({bs} resamples)" if bs else
                           "no bootstrap (bootstrap=0)") + "; trend: grows / shrinks when the interval excludes 0."),
                   table_html(self.slopes())]
        return self.folder(path).write(self.table, self.to_dict(), title=f"Dictionary sweep: {self.model}",
                                       figures={"sweep": self.figure, "drops": self.drop_figure},
                                       notes=notes, sections=section, png=png)

    def _repr_html_(self) -> str:
        what = (f"top {self.k} heads {', '.join(h.name for h in self.heads)}" if self.heads else
                f"single heads {', '.join(self.label(c) for c in self.single)}")
        return part("lead", f"Dictionary sweep of {self.model}", what) + table_html(self.by_pairs())

    def __repr__(self) -> str:
        m = self.metrics
        single = f"single {[self.label(c) for c in self.single]}" if self.single else ""
        if not self.heads:
            return f"Sweep({self.model!r}, pairs {self.pairs}, {single})"
        return (f"Sweep({self.model!r}, pairs {self.pairs}, top {self.k} {[h.name for h in self.heads]}, "
                f"mean drop top-k {m['drop_topk']:.3f} vs random {m['drop_random']:.3f}{', ' + single if single else ''})")


# ---- the experiment --------------------------------------------------------------------------------------
@options
class SweepConfig(TaskOptions, RunOptions):
    """How :func:`sweep` runs (the task knobs of :class:`~gna_interp.tasks.options.TaskOptions`; ``pairs``
    here are the dictionary sizes, comma-separated text or a list).

    Attributes:
        k: heads removed together; seeds: random ``k``-head draws.
        heads: single heads, each removed alone as one more condition: head names and the role words
            ``gather`` / ``aggregate`` (the circuit's pair), comma-separated text or a list (:func:`parse_single`);
            head names only and no circuit: nothing is discovered, only these heads are measured.
        bootstrap: resamples of the drop slopes' bootstrap interval (0: no interval).
        device, dtype: used only when the model is a spec.
        on_point: called with each finished row.

    and the run options of :class:`~gna_interp.experiments.options.RunOptions` (``batch_size``, ``resume``,
    ``fresh``, ``progress``, ``png``).
    """

    pairs: Any = PAPER_SIZES
    samples: int = 48
    max_value: Any = 99
    k: int = 5
    seeds: int = 5
    heads: Any = None
    bootstrap: int = N_BOOTSTRAP
    device: str | None = None
    dtype: str = "float32"
    on_point: Callable[[dict[str, Any]], None] | None = None

    def validate(self) -> None:
        sizes = parse_pairs(self.pairs)
        check_counts(self, {"k": 1, "seeds": 1, "samples": 1, "batch_size": 1, "max_value": 1})
        if self.template not in TEMPLATES:
            raise InputError(f"unknown template {self.template!r}; choose one of {TEMPLATES}")
        check_pairs_fit(max(sizes), self.max_value)
        check_knobs(self._at_size(max(sizes)))
        parse_single(self.heads)  # a malformed name, a repeat or an empty list fail here, before any model loads
        check_int("bootstrap", self.bootstrap, 0)

    def _at_size(self, n: int) -> TaskOptions:
        """The task knobs of dictionary size ``n`` (not a :class:`SweepConfig`: that would validate again)."""
        return TaskOptions(**{**{f: getattr(self, f) for f in TaskOptions.field_names()}, "pairs": n})


@dataclass
class _Conditions:
    """The heads of a sweep: the circuit's top ``k`` and the random draws (empty without a circuit), the single
    heads by condition name, where they came from and notes."""

    top: list[HeadRef]
    draws: list[list[HeadRef]]
    single: dict[str, HeadRef]
    source: str
    notes: list[str]
    k: int = 0

    def rows(self) -> list[tuple[str, int, list[HeadRef]]]:
        """``(condition, seed, heads)`` in the order they are measured and reported."""
        out: list[tuple[str, int, list[HeadRef]]] = [("intact", 0, [])]
        if self.top:
            out += [("top1", 0, self.top[:1]), ("topk", 0, self.top)] + [("random", s, d)
                                                                         for s, d in enumerate(self.draws)]
        return out + [(c, 0, [h]) for c, h in self.single.items()]


def _conditions(m: Model, circuit: Circuit | str | os.PathLike | None, wanted: list[str | HeadRef],
                cfg: SweepConfig, cfolder: Path | None) -> _Conditions:
    """The heads each condition removes (the module docstring): named heads only and no circuit need none."""
    if circuit is None and wanted and all(isinstance(h, HeadRef) for h in wanted):
        return _Conditions([], [], {h.name: h for h in wanted if isinstance(h, HeadRef)},
                           "single heads named by the caller, no circuit (give a circuit for the top-1, top-k, random, "
                           "gather and aggregate conditions)", [])
    circ, source = resolve_circuit(m, circuit, cfolder, Discovery(seed=cfg.seed, k=cfg.k, batch_size=cfg.batch_size,
                                                                  progress=cfg.progress))
    k = removed_k(circ, cfg.k)
    notes = []
    if k < cfg.k:
        notes.append(f"removes k = {k} heads, not {cfg.k}: {len(circ.scan.heads)} scanned heads ({len(circ.heads)} "
                     f"in the circuit), and k random heads must stay a small draw (at most a quarter of them)")
    top = circ.heads[:k]
    roles: dict[str, HeadRef] = {}
    if any(h in ROLES for h in wanted):
        pair = circ.pair()
        if pair is None:
            raise InputError(f"heads {cfg.heads!r} asks for the circuit's gather/aggregate pair, but {source} has "
                             f"none (no measured gather -> aggregate path and no aggregate head among its best-ranked "
                             f"heads that hurt when removed); name the heads instead, e.g. heads='L16H0,L18H6'")
        m.check_heads(list(pair))
        roles = {"gather": pair[0], "aggregate": pair[1]}
        source += (f"; gather {pair[0].name} and aggregate {pair[1].name} from its "
                   f"{'measured gather -> aggregate path' if circ.path() is not None else 'pattern roles'}")
    single = {(h if isinstance(h, str) else h.name): (roles[h] if isinstance(h, str) else h) for h in wanted}
    return _Conditions(top, random_draws(circ.scan.heads, top, k, cfg.seeds, "gna-sweep-random"), single, source,
                       notes, k)


class _Measurer:
    """Measures a sweep's points in order: one :class:`~gna_interp.engine.replay.SetAblation` (and its clean prefixes)
    per dictionary size, released when the next size starts; a head set named twice at one size is measured once."""

    def __init__(self, model: Model, tasks: dict[int, KVRetrieval], batch_size: int) -> None:
        self.model, self.tasks, self.batch_size = model, tasks, batch_size
        self.pairs: int | None = None
        self.runner: SetAblation | None = None
        self.measured: dict[tuple[HeadRef, ...], dict[str, Any]] = {}

    def measure(self, n: int, cond: str, seed: int, heads: list[HeadRef]) -> dict[str, Any]:
        """The row of condition ``cond`` (draw ``seed``) at ``n`` pairs: ``heads`` removed together."""
        if self.pairs != n:
            self.pairs, self.runner, self.measured = n, None, {}
        got = self.measured.get(tuple(heads))
        if got is None:
            self.runner = self.runner or SetAblation(self.model, self.tasks[n], batch_size=self.batch_size)
            scores = self.runner.run(heads)
            got = self.measured[tuple(heads)] = {**{c: scores.metrics[c] for c in _METRICS},
                                                 "per_sample": _per_sample(scores)}
        return {"pairs": n, "condition": cond, "seed": seed, "k": len(heads), **{c: got[c] for c in _METRICS},
                "heads": ",".join(h.name for h in heads), "per_sample": got["per_sample"]}


def _points(m: Model, tasks: dict[int, KVRetrieval], conditions: list[tuple[str, int, list[HeadRef]]],
            batch_size: int) -> list[Point]:
    """One point per size and condition (:class:`_Measurer`)."""
    measurer = _Measurer(m, tasks, batch_size)
    return [Point(f"{n}/{c}/{s}", functools.partial(measurer.measure, n, c, s, hs)) for n in tasks
            for c, s, hs in conditions]


def sweep(model: Model | str, pairs: int | str | Iterable[int] | None = None,
          circuit: Circuit | str | os.PathLike | None = None, out: str | os.PathLike | None = None,
          config: SweepConfig | None = None, **overrides: Any) -> Sweep:
    """KV accuracy at each dictionary size of ``pairs`` (default the paper's 10, 15, ..., 50): intact, with
    the circuit's top-1 and top-``k`` heads removed, with ``k`` random heads removed (``seeds`` draws), and
    with each of ``heads`` removed alone (``gather``, ``aggregate``: the circuit's pair; head names).

    ``model`` is a :class:`Model` or a spec (loaded with ``device``, ``dtype``); ``circuit`` a
    :class:`Circuit` or a ``gna scan`` folder (None: discovered first, see the module docstring). With
    ``out`` the folder is written (and points are checkpointed as they finish; ``resume``/``fresh`` as in
    ``gna scan``). ``config`` (:class:`SweepConfig`) and keyword ``overrides`` of its fields: the same
    options as ``gna sweep``. With ``heads`` naming heads only and no ``circuit``, no circuit is used (none
    discovered): the conditions are ``intact`` and the named heads.
    """
    cfg = SweepConfig.build(config, **overrides, **({} if pairs is None else {"pairs": pairs}))
    sizes = parse_pairs(cfg.pairs)
    folder = Path(out) if out is not None else None
    cfolder = folder / CIRCUIT_DIR if folder is not None else None
    if cfolder is not None:
        open_folder(folder, CKPT, cfg, also=[cfolder / SCAN_CKPT, cfolder / CIRCUIT_JSON], circuits=[cfolder])
    wanted = parse_single(cfg.heads)
    m = model_of(model, cfg.device, cfg.dtype)
    named = [h for h in wanted if isinstance(h, HeadRef)]
    if named:
        try:
            m.check_heads(named)  # out of range, a kind the model lacks: before any work
        except HeadError as e:
            raise HeadError(f"heads {cfg.heads!r}: {e}") from None
    tasks = {n: cfg.replace(pairs=n).kv(m.kv_words)
             for n in sizes}  # built before any work: a size the word list cannot fill fails here
    cond = _conditions(m, circuit, wanted, cfg, cfolder)
    settings = {"samples": cfg.samples, "seed": cfg.seed, "max_value": cfg.max_value, "template": cfg.template,
                "k": cond.k, "k_requested": cfg.k, "seeds": cfg.seeds, "batch_size": cfg.batch_size, "method": "zero"}
    key_settings = {**settings, "pairs": sizes, "heads": [h.name for h in cond.top],
                    "random": [[h.name for h in d] for d in cond.draws]}
    if cond.single:  # only then, so that a run without single heads keeps its fingerprint (and older checkpoints)
        key_settings["single"] = {c: h.name for c, h in cond.single.items()}
        settings["heads"] = list(cond.single)
    settings["bootstrap"] = cfg.bootstrap
    log = Checkpoint(folder / CKPT if folder is not None else None, NAME, fingerprint(m, key_settings))
    log.save()
    start = time.perf_counter()
    points = _points(m, tasks, cond.rows(), cfg.batch_size)
    run_points(log, points, f"sweep {m.name}", cfg.progress,
               on_point=(lambda key, row: cfg.on_point(row)) if cfg.on_point is not None else None)  # type: ignore[misc]
    rows = [log[p.key] for p in points]
    per_sample = {p.key: log[p.key]["per_sample"] for p in points if log[p.key].get("per_sample") is not None}
    if len(per_sample) < len(rows) and cfg.bootstrap:
        cond.notes.append(f"{len(rows) - len(per_sample)} points (resumed from an older checkpoint) lack their "
                          f"per-prompt results: the drop slopes have no bootstrap interval")
    result = Sweep(m.name, sizes, cond.top, cond.draws, pd.DataFrame(rows, columns=COLUMNS), cond.source,
                   time.perf_counter() - start, cond.single, per_sample, settings=settings, notes=cond.notes)
    if folder is not None:
        result.save(folder, png=cfg.png)
    return result
