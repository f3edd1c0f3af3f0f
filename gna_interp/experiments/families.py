"""`compare`: model families side by side -- how sharp their G&A heads are, and how redundant.

The paper's second claim: SSMs implement Gather-and-Aggregate too, but *smoother* (their aggregate
patterns spread over many lines) and *more redundant* (removing one head costs little; several must go).
:func:`compare` measures both on two or more models with the same KV task, and on a hybrid it shows which
kind of mixer aggregates (the paper's third claim: hybrids delegate aggregation to attention).

**Per model** (one after the other, each loaded, measured and released):

1. its circuit: ``circuits[i]`` (a :class:`~gna_interp.circuits.Circuit` or ``gna scan`` folder) or
   discovered with ``gna scan``'s default discovery on a task of the measured shape (``pairs`` lines,
   ``samples`` prompts, values ``0..max_value``) seeded ``seed + 1``, so heads are not scored on the
   prompts they were found on (:func:`~gna_interp.experiments.run.resolve_circuit`; saved in
   ``DIR/circuits/MODEL``). A model at chance on that task cannot be compared (an error names it; the
   models measured before it stay in the checkpoint);
2. the **removal cost**: on the measured task (``pairs`` lines, ``samples`` prompts, values
   ``0..max_value``, ``seed``), accuracy with the circuit's top ``j`` heads removed together,
   ``j = 0..k``, and with ``j`` random heads of the others (``seeds`` random orders, every ``j``);
   ``cost = intact − accuracy``. ``k`` follows the ablation curve's rule (at most a quarter of the heads);
3. the **aggregation scores** (:func:`aggregation_scores`) of its ``pool`` best-ranked heads on
   ``sharp_samples`` prompts: how the decision row of each head's pattern spreads over the dictionary
   lines. The model's **aggregate head** is the one with the most aligned gold-line mass among the
   ``pool`` heads whose removal hurts (scan drop > 0).

**Aligned lines.** A head's decision row (the position the answer is read at) is split over the lines:
``m_j = Σ p[f, t]`` over the tokens ``t`` of line ``j`` shifted by ``δ`` tokens
(:func:`~gna_interp.circuits.scan.offsets.shifted_items`). Mixers with a short convolution (every SSM here)
can move a line's summary a token or two forward before an attention or SSM head reads it
(:mod:`gna_interp.circuits.scan.offsets`): the zoo Mamba-2's aggregate heads read the token after the gold
line, the zoo hybrid's attention head two tokens after. ``δ`` is chosen per head from ``shifts`` (default
0-3) as the smallest within :data:`~gna_interp.circuits.scan.offsets.OFFSET_TOLERANCE` of the most mean gold mass
(:func:`~gna_interp.circuits.scan.offsets.pick_offset`, the rule of the role scores; choosing among four still
lets an unrelated head's score rise a little; ``shifts=(0,)`` is
:func:`~gna_interp.circuits.scan.roles.role_scores`' ``aggregate`` at offset 0). Then:

- ``aggregate`` ``m_gold``; ``to_lines`` ``Σ_j m_j``; ``gold_share`` ``m_gold / Σ_j m_j`` (chance ``1/n``);
- ``line_entropy`` the normalised entropy of ``m_j / Σ m`` over the ``n`` lines (0: one line, 1: uniform);
- ``final_entropy``, ``final_top1``: the normalised entropy and top-1 mass of the whole decision row over
  its keys (:func:`~gna_interp.mixing.sharpness.sharpness`).

Sharp G&A (the zoo Transformer's aggregate head) puts nearly all of the row on the gold line
(``gold_share`` near 1, ``line_entropy`` near 0); a smooth one spreads it.

**Output** (``out=DIR``, :class:`~gna_interp.experiments.output.ResultFolder` ``families``):
``families.csv`` (one row per model, columns :data:`TABLE_COLUMNS`), ``families_curve.csv`` (the removal
points), ``families_heads.csv`` (aggregation scores and scan drops of the pool heads),
``families_kinds.csv`` (per mixer kind: its best aggregate head and its largest single-head drop),
``families.json``, ``report.html`` with the figure (left: the aggregate head's gold share per prompt,
per model; right: accuracy cost of removing 1..k top heads vs k random ones) and ``figures/families.png``.
Each model's finished parts go to ``DIR/families.ckpt.json`` as they finish (``resume``/``fresh``).
"""

from __future__ import annotations

import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch

from gna_interp.constants import CIRCUIT_JSON, SCAN_CKPT
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.engine.replay import SetAblation
from gna_interp.circuits.scan.offsets import intact_at, pick_offset
from gna_interp.circuits.scan.roles import ScoreOptions, decision_inputs, item_masses
from gna_interp.errors import InputError
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.store import make_folder, records
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint, settings_fingerprint
from gna_interp.experiments.run import (Discovery, Point, model_of, open_folder, random_draws, removed_k,
                                        resolve_circuit, run_points, slug)
from gna_interp.mixing import PatternOptions, patterns
from gna_interp.mixing.sharpness import row_distribution, sharpness
from gna_interp.models.heads import HeadRef
from gna_interp.tasks.segments import segments_of
from gna_interp.models.model import Model
from gna_interp.options import check_counts, check_pairs_fit, options
from gna_interp.store import atomic_write
from gna_interp.tasks import KVRetrieval
from gna_interp.tasks.base import Task
from gna_interp.tasks.choice import check_knobs
from gna_interp.tasks.options import TaskOptions
from gna_interp.tasks.segments import Segments
from gna_interp.viz.html import part

__all__ = ["AGGREGATION_COLUMNS", "Aggregation", "CURVE_COLUMNS", "FamilyComparison", "TABLE_COLUMNS",
           "CompareConfig", "aggregation_scores", "compare"]

NAME = "families"
CKPT = "families.ckpt.json"
CIRCUITS_DIR = "circuits"
AGGREGATION_COLUMNS = ["name", "layer", "head", "kind", "shift", "aggregate", "to_lines", "gold_share", "line_entropy",
                       "final_entropy", "final_top1"]
CURVE_COLUMNS = ["model", "j", "series", "seed", "accuracy", "cost", "heads"]
TABLE_COLUMNS = ["model", "architecture", "mixers", "heads", "k", "intact", "chance", "top_heads", "cost_1",
                 "cost_k", "random_cost_k", "heads_to_half", "aggregate_head", "aggregate_kind", "shift",
                 "aggregate", "gold_share", "line_entropy", "final_entropy"]
_PALETTE = ["#c0392b", "#2471a3", "#1e8449", "#7d3c98", "#d68910", "#17a589", "#566573"]


# ---- aggregation scores -----------------------------------------------------------------------------------
@dataclass
class Aggregation:
    """Result of :func:`aggregation_scores`: ``per_head`` (one row per head, :data:`AGGREGATION_COLUMNS`, at
    its chosen shift) and ``per_sample`` (the same columns plus ``sample``, one row per head and prompt)."""

    per_head: pd.DataFrame
    per_sample: pd.DataFrame

    def to_frame(self) -> pd.DataFrame:
        """The per-head scores."""
        return self.per_head.copy()


def _sample_rows(p: torch.Tensor, seg: Segments, gold: int, shifts: Sequence[int]) -> torch.Tensor:
    """``[heads, shifts, 4]``: gold mass, mass on all lines, gold share, line entropy, for one sample, the
    lines read at each shift (:func:`~gna_interp.circuits.scan.offsets.shifted_items`; NaN where a shift pushes
    a line past the prompt's end); ``p`` is ``[heads, q, k]`` row-normalised, its last row the decision row."""
    row = p[:, p.shape[-1] - 1]
    out = []
    for d in shifts:
        items = intact_at(seg, d)
        if items is None:
            out.append(torch.full((row.shape[0], 4), math.nan))
            continue
        m = item_masses(row, items)  # [heads, lines]
        total = m.sum(-1)
        share = torch.where(total > 0, m[:, gold] / total.clamp_min(1e-12), torch.full_like(total, math.nan))
        ent = sharpness(m[:, None, :], causal=False).normalized_entropy[:, 0]
        out.append(torch.stack([m[:, gold], total, share, ent], -1))
    return torch.stack(out, 1)


@torch.no_grad()
def aggregation_scores(model: Model, task: Task, heads: Sequence[HeadRef | str], shifts: Sequence[int] = (0, 1, 2, 3),
                       config: ScoreOptions | None = None, **overrides: Any) -> Aggregation:
    """How each head's decision row spreads over the dictionary lines of ``task``'s first ``n_samples``
    prompts, at the line shift that suits it best (see the module docstring for every column).

    The prompt is fed with the tokens all candidates share, so the last position is the one the answer
    is scored at (:func:`~gna_interp.circuits.scan.roles.decision_inputs`); SSM heads are read as implicit
    attention in ``form``. Means over prompts ignore prompts where a head puts no mass on the lines. ``config``
    (:class:`~gna_interp.circuits.scan.roles.ScoreOptions`) or keyword ``overrides`` of its fields: ``n_samples``
    (default 8), ``batch_size``, ``form``.
    """
    cfg = ScoreOptions.build(config, **overrides)
    n_samples, batch_size, form = cfg.n_samples, cfg.batch_size, cfg.form
    chosen = list(dict.fromkeys(model.check_heads(list(heads))))
    if not chosen:
        raise InputError("aggregation_scores needs at least one head")
    shifts = list(shifts)
    if not shifts or any(not isinstance(d, int) or d < 0 for d in shifts):
        raise InputError(f"shifts must be non-negative integers (tokens after each line), got {list(shifts)}")
    if n_samples < 1 or batch_size < 1:
        raise InputError(f"n_samples and batch_size must be >= 1, got {n_samples}, {batch_size}")
    samples = list(task.samples[:n_samples])
    segs = segments_of(model.tokenizer, samples)
    if any(not sg.items for sg in segs):
        raise InputError(f"{task.name}: a prompt has no segments (dictionary lines) to score aggregation on")
    fed = decision_inputs(model, samples)
    per: list[torch.Tensor] = []  # [heads, shifts, 4] per sample
    finals: list[torch.Tensor] = []  # [heads, 2] per sample
    for b0 in range(0, len(samples), batch_size):
        ps = patterns(model, model.pad_ids(fed[b0:b0 + batch_size]), heads=chosen, options=PatternOptions(form=form))
        for j in range(len(fed[b0:b0 + batch_size])):
            sg, s = segs[b0 + j], samples[b0 + j]
            pat = ps.sample(j, chosen).float().cpu()
            if pat.shape[-1] < sg.n_tokens:
                raise InputError(f"sample {b0 + j}: the model's tokenization ({pat.shape[-1]} tokens) differs from the "
                                 f"segment annotation ({sg.n_tokens}); cannot place the lines")
            per.append(_sample_rows(row_distribution(pat), sg, s.gold, shifts))
            sh = sharpness(pat[:, -1:, :])
            finals.append(torch.stack([sh.normalized_entropy[:, 0], sh.top1[:, 0]], -1))
    stack = torch.stack(per)  # [samples, heads, shifts, 4]
    mean_gold = stack[..., 0].nanmean(0)  # [heads, shifts]
    best = [shifts.index(pick_offset(dict(zip(shifts, mean_gold[i].tolist())))) for i in range(len(chosen))]
    fin = torch.stack(finals)  # [samples, heads, 2]
    head_rows, sample_rows = [], []
    for i, h in enumerate(chosen):
        d = best[i]
        vals = stack[:, i, d]  # [samples, 4]
        base = {"name": h.name, "layer": h.layer, "head": h.head, "kind": h.kind, "shift": shifts[d]}
        mean = vals.nanmean(0).tolist()
        head_rows.append({**base, "aggregate": mean[0], "to_lines": mean[1], "gold_share": mean[2],
                          "line_entropy": mean[3], "final_entropy": float(fin[:, i, 0].nanmean()),
                          "final_top1": float(fin[:, i, 1].nanmean())})
        for si in range(len(samples)):
            v = vals[si].tolist()
            sample_rows.append({**base, "sample": si, "aggregate": v[0], "to_lines": v[1], "gold_share": v[2],
                                "line_entropy": v[3], "final_entropy": float(fin[si, i, 0]),
                                "final_top1": float(fin[si, i, 1])})
    return Aggregation(pd.DataFrame(head_rows, columns=AGGREGATION_COLUMNS),
                       pd.DataFrame(sample_rows, columns=AGGREGATION_COLUMNS + ["sample"]))


# ---- the result -----------------------------------------------------------------------------------------------
@dataclass
class FamilyComparison(ExperimentResult, format=NAME):
    """Result of :func:`compare`: a folder result (:meth:`save` / :meth:`load`) with a figure (:meth:`figure`,
    :meth:`plot`).

    Attributes:
        models: the model names, in the order given.
        table: one row per model, :data:`TABLE_COLUMNS` (``cost_j`` columns for every ``j`` measured).
        curve: the removal points, :data:`CURVE_COLUMNS` (``series`` ``top`` or ``random``).
        heads: the pool heads of every model: ``model``, ``rank``, scan ``drop`` and
            :data:`AGGREGATION_COLUMNS`.
        samples: per-prompt aggregation scores of each model's aggregate head (for the figure).
        kinds: per model and mixer kind: heads, best aggregate head and its scores, the largest single-head
            scan drop and its head.
        settings: the options of the run; ``sources``: where each model's heads came from.
    """

    models: list[str]
    table: pd.DataFrame
    curve: pd.DataFrame
    heads: pd.DataFrame
    samples: pd.DataFrame
    kinds: pd.DataFrame
    sources: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per model: ``cost_1``, ``cost_k``, ``random_cost_k``, ``gold_share``, ``line_entropy`` of its
        aggregate head."""
        keys = ("k", "intact", "cost_1", "cost_k", "random_cost_k", "heads_to_half", "aggregate_head", "gold_share",
                "line_entropy")
        return {r["model"]: {k: r[k] for k in keys} for _, r in self.table.iterrows()}

    def to_frame(self) -> pd.DataFrame:
        """The per-model table."""
        return self.table.copy()

    def summary(self) -> str:
        """One paragraph per model, and the per-kind lines of hybrids."""
        lines = []
        for _, r in self.table.iterrows():
            costs = ", ".join(f"{j} {r[f'cost_{j}']:.3f}" for j in range(1, int(r["k"]) + 1) if f"cost_{j}" in r)
            half = "not within k" if pd.isna(r["heads_to_half"]) else f"{int(r['heads_to_half'])}"
            lines.append(f"{r['model']} ({r['mixers']}, {r['heads']} heads): intact {r['intact']:.3f} (chance "
                         f"{r['chance']:.3f}); accuracy lost removing the top 1..{int(r['k'])} heads: {costs}; "
                         f"{int(r['k'])} random heads: {r['random_cost_k']:.3f} (median); heads to lose half the "
                         f"above-chance accuracy: {half}")
            if isinstance(r["aggregate_head"], str) and r["aggregate_head"]:
                lines.append(f"  aggregate head {r['aggregate_head']} ({r['aggregate_kind']}, "
                             f"shift {int(r['shift'])}): "
                             f"gold-line mass {r['aggregate']:.3f}, gold share {r['gold_share']:.3f}, line entropy "
                             f"{r['line_entropy']:.3f}, decision-row entropy {r['final_entropy']:.3f}")
            else:
                lines.append("  no aggregate head among the pool heads that hurt when removed")
            kinds = self.kinds[self.kinds["model"] == r["model"]]
            if len(kinds) > 1:
                for _, kr in kinds.iterrows():
                    metric = self.settings.get("drop_metric")
                    lines.append(f"  {kr['kind']} heads ({kr['heads']}): best aggregate {kr['best_aggregate_head']} "
                                 f"(gold mass {kr['aggregate']:.3f}, gold share {kr['gold_share']:.3f}); largest "
                                 f"single drop {kr['top_drop_head']} ({kr['top_drop']:.3f} {metric}, accuracy alone "
                                 f"{kr['top_drop_accuracy']:.3f})")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def figure(self, title: str | None = None) -> Any:
        """Two panels: left, each model's aggregate head -- its gold share per prompt (box with the prompts as
        points; 1 = all of the decision row's line mass on the gold line, dotted: chance 1/n); right, the
        accuracy lost removing the top 1..k heads (solid) and j random heads (dashed: median of the draws;
        band: min-max), one colour per model."""
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1, column_widths=[0.42, 0.58],
                            subplot_titles=["sharpness: aggregate head's gold share",
                                            "redundancy: accuracy lost removing j heads"])
        for i, name in enumerate(self.models):
            colour = _PALETTE[i % len(_PALETTE)]
            row = self.table[self.table["model"] == name].iloc[0]
            s = self.samples[self.samples["model"] == name]
            if not s.empty:
                label = f"{name}<br>{row['aggregate_head']} ({row['aggregate_kind']})"
                fig.add_trace(go.Box(y=s["gold_share"], x=[label] * len(s), name=name, marker_color=colour,
                                     boxpoints="all", jitter=0.4, pointpos=0, legendgroup=name, showlegend=False,
                                     hovertemplate="prompt gold share %{y:.3f}<extra></extra>"), row=1, col=1)
            c = self.curve[self.curve["model"] == name]
            top = c[c["series"] == "top"].sort_values("j")
            fig.add_trace(go.Scatter(x=top["j"], y=top["cost"], mode="lines+markers", line=dict(color=colour, width=3),
                                     name=f"{name}: top j removed", legendgroup=name, customdata=top["heads"],
                                     hovertemplate="j=%{x}: cost %{y:.3f}<br>%{customdata}<extra></extra>"),
                          row=1, col=2)
            rnd = c[c["series"] == "random"]
            if not rnd.empty:
                st = rnd.groupby("j")["cost"].agg(["median", "min", "max"]).reset_index()
                st = pd.concat([pd.DataFrame({"j": [0], "median": [0.0], "min": [0.0], "max": [0.0]}), st])
                band_x, band_y = list(st["j"]) + list(st["j"])[::-1], list(st["max"]) + list(st["min"])[::-1]
                fig.add_trace(go.Scatter(x=band_x, y=band_y,
                                         fill="toself", mode="lines", line=dict(width=0), fillcolor=_rgba(colour, 0.15),
                                         hoverinfo="skip", legendgroup=name, showlegend=False), row=1, col=2)
                fig.add_trace(go.Scatter(x=st["j"], y=st["median"], mode="lines", line=dict(color=colour, dash="dash"),
                                         name=f"{name}: j random (median)", legendgroup=name), row=1, col=2)
        n = self.settings.get("pairs")
        if n:
            fig.add_hline(y=1 / n, line=dict(color="#999", dash="dot", width=1), row=1, col=1,
                          annotation_text=f"chance 1/{n}", annotation_position="bottom right")
        fig.update_yaxes(title_text="gold share", range=[-0.02, 1.05], row=1, col=1)
        fig.update_yaxes(title_text="intact − accuracy", row=1, col=2)
        fig.update_xaxes(title_text="heads removed (j)", dtick=1, row=1, col=2)
        fig.update_layout(title=title or "G&A across families: sharpness and redundancy", template="plotly_white",
                          height=540, legend=dict(orientation="h", yanchor="top", y=-0.22, x=0))
        return fig

    def to_dict(self) -> dict[str, Any]:
        """The ``families`` document's body: models, settings, sources, notes, the curve, heads, samples and kinds
        tables, and the per-model table (``table``, last)."""
        return {"models": self.models, "settings": self.settings, "sources": self.sources, "notes": self.notes,
                "seconds": round(self.seconds, 2), "curve": records(self.curve), "heads": records(self.heads),
                "samples": records(self.samples), "kinds": records(self.kinds), "table": records(self.table)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FamilyComparison":
        """The comparison :meth:`to_dict` described."""
        return cls(list(d["models"]), doc_table(d), pd.DataFrame(d["curve"], columns=CURVE_COLUMNS),
                   pd.DataFrame(d["heads"]), pd.DataFrame(d["samples"]), pd.DataFrame(d["kinds"]),
                   dict(d.get("sources") or {}), float(d.get("seconds") or 0.0), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write ``families.csv`` (+ ``_curve``, ``_heads``, ``_kinds`` CSVs), ``families.json``,
        ``report.html`` and ``figures/families.png`` into the folder ``path`` (or the folder of ``path`` naming its
        ``families.json``); return the folder. :meth:`load` reads the folder or the file."""
        folder = self.folder(path)
        d = folder.path
        make_folder(d)
        for table, df in (("curve", self.curve), ("heads", self.heads), ("kinds", self.kinds)):
            atomic_write(d / f"{NAME}_{table}.csv", df.to_csv(index=False))
        st = self.settings
        notes = [f"Measured on KV retrieval, {st.get('pairs')} lines, {st.get('samples')} prompts, values "
                 f"0-{st.get('max_value')}, seed {st.get('seed')}; zero ablation; aggregation scores on "
                 f"{st.get('sharp_samples')} prompts, line shifts {st.get('shifts')}."]
        notes += [f"{m}: heads from {src}." for m, src in self.sources.items()] + self.notes
        sections = [part("heading", "Per mixer kind"), table_html(self.kinds),
                    part("heading", "Heads (aggregation scores)"), table_html(self.heads)]
        return folder.write(self.table, self.to_dict(), title="G&A across model families",
                            figures={NAME: self.figure}, notes=notes, sections=sections, png=png)

    def _repr_html_(self) -> str:
        return part("lead", "G&A across families") + table_html(self.table)

    def __repr__(self) -> str:
        parts = [f"{m}: cost_1 {v['cost_1']:.3f}, gold share {v['gold_share']:.3f}" for m, v in self.metrics.items()]
        return f"FamilyComparison({'; '.join(parts)})"


def _rgba(hex_colour: str, alpha: float) -> str:
    r, g, b = (int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))
    return f"rgba({r},{g},{b},{alpha})"


def _mixers(model: Model) -> str:
    """``attn x2`` / ``ssm2 x3 + attn x1``: the model's token mixers by kind, in order of first appearance."""
    counts: dict[str, int] = {}
    for k in model.layer_kinds():
        counts[k] = counts.get(k, 0) + 1
    return " + ".join(f"{k} x{n}" for k, n in counts.items())


# ---- the experiment ---------------------------------------------------------------------------------------------
def _one_model(m: Model, circ: Circuit, log: Checkpoint, key: str, task: KVRetrieval, cfg: "CompareConfig",
               desc: str) -> dict[str, Any]:
    """Every measurement of one model, each a point of ``log`` under ``key/`` (:func:`run_points`): the accuracy with
    the top ``j`` heads and with ``j`` heads of each random draw removed, and the pool's aggregation scores."""
    k = removed_k(circ, cfg.k)
    top = circ.heads[:k]
    draws = random_draws(circ.scan.heads, top, k, cfg.seeds, "gna-families-random")
    @functools.cache
    def runner() -> SetAblation:  # made at the first point that needs it (none when every point is resumed)
        return SetAblation(m, task, batch_size=cfg.batch_size)

    def accuracy(heads: Sequence[HeadRef]) -> float:
        return runner().run(heads).metrics["accuracy"]

    def aggregation() -> dict[str, Any]:
        pool_heads = [HeadRef.parse(n) for n in circ.scan.to_frame()["name"].head(cfg.pool)]
        agg = aggregation_scores(m, task, pool_heads, n_samples=cfg.sharp_samples, shifts=tuple(cfg.shifts),
                                 batch_size=min(cfg.batch_size, 8))
        return {"per_head": records(agg.per_head), "per_sample": records(agg.per_sample)}

    sets = [("top", 0, j, top[:j], f"top/{j}") for j in range(k + 1)]
    sets += [("random", s, j, d[:j], f"random/{s}/{j}") for s, d in enumerate(draws) for j in range(1, k + 1)]
    points = [Point(f"{key}/{label}", functools.partial(accuracy, heads), label) for *_, heads, label in sets]
    run_points(log, points + [Point(f"{key}/aggregation", aggregation, "aggregation")], desc, cfg.progress)
    intact = float(log[f"{key}/top/0"])
    curve = [{"j": j, "series": series, "seed": s, "accuracy": float(log[p.key]),
              "cost": intact - float(log[p.key]), "heads": ",".join(h.name for h in heads)}
             for (series, s, j, heads, _), p in zip(sets, points)]
    saved = log[f"{key}/aggregation"]
    return {"k": k, "top": top, "draws": draws, "curve": curve, "intact": intact,
            "per_head": pd.DataFrame(saved["per_head"], columns=AGGREGATION_COLUMNS),
            "per_sample": pd.DataFrame(saved["per_sample"], columns=AGGREGATION_COLUMNS + ["sample"])}


def _kinds_rows(name: str, circ: Circuit, heads: pd.DataFrame) -> list[dict[str, Any]]:
    """Per mixer kind of a model: scanned heads, best aggregate head (of the pool), largest single-head drop."""
    frame = circ.scan.to_frame()
    rows = []
    for kind, part in frame.groupby("kind", sort=False):
        scored = heads[heads["kind"] == kind].sort_values("aggregate", ascending=False)
        top = part.sort_values("drop", ascending=False).iloc[0]
        acc = circ.scan.ablated(top["name"], "accuracy")
        best = scored.iloc[0] if len(scored) else None
        rows.append({"model": name, "kind": kind, "heads": len(part), "scored": len(scored),
                     "best_aggregate_head": best["name"] if best is not None else "",
                     "shift": best["shift"] if best is not None else math.nan,
                     "aggregate": best["aggregate"] if best is not None else math.nan,
                     "gold_share": best["gold_share"] if best is not None else math.nan,
                     "line_entropy": best["line_entropy"] if best is not None else math.nan,
                     "top_drop_head": top["name"], "top_drop": float(top["drop"]), "top_drop_accuracy": acc})
    return rows


def _split_specs(models: str | Sequence[Model | str]) -> list[Model | str]:
    if isinstance(models, str):
        models = [s.strip() for s in models.split(",")]
    out = list(models)
    if len(out) < 2:
        raise InputError(f"compare needs two or more models, got {len(out)}; e.g. "
                         f"zoo:transformer-kv,zoo:mamba2-kv,zoo:hybrid-kv")
    if any(isinstance(s, str) and not s for s in out):
        raise InputError("a model spec in the list is empty; give comma-separated specs, e.g. "
                         "zoo:transformer-kv,zoo:mamba2-kv")
    names = [s if isinstance(s, str) else s.name for s in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise InputError(f"model(s) {dup} listed more than once")
    return out


@options
class CompareConfig(TaskOptions, RunOptions):
    """How :func:`compare` runs (the measured KV task's knobs of :class:`~gna_interp.tasks.options.TaskOptions`).

    Attributes:
        k: most heads removed; seeds: random head orders; sharp_samples: prompts the aggregation scores
            are read on; pool: best-ranked heads of each model whose aggregation is scored; shifts: the
            summary offsets tried.
        device, dtype: used only for the models given as specs.

    and the run options of :class:`~gna_interp.experiments.options.RunOptions` (``batch_size``, ``resume``,
    ``fresh``, ``progress``, ``png``).
    """

    samples: int = 24
    k: int = 5
    seeds: int = 5
    sharp_samples: int = 8
    pool: int = 64
    shifts: Sequence[int] = (0, 1, 2, 3)
    device: str | None = None
    dtype: str = "float32"

    def validate(self) -> None:
        check_counts(self, {"k": 1, "seeds": 1, "pairs": 2, "samples": 1, "sharp_samples": 1, "pool": 1,
                            "batch_size": 1, "max_value": 1})
        check_pairs_fit(self.pairs, self.max_value)
        check_knobs(self)


def compare(models: str | Sequence[Model | str], circuits: Sequence[Circuit | str | os.PathLike | None] | None = None,
            out: str | os.PathLike | None = None, config: CompareConfig | None = None,
            **overrides: Any) -> FamilyComparison:
    """Two or more models side by side on one KV task: their aggregate heads' sharpness and the accuracy that
    removing their top 1..k heads costs against random heads (see the module docstring).

    ``models`` are :class:`Model` objects or specs (comma-separated text or a list; specs are loaded one at a
    time with ``device``, ``dtype``); ``circuits`` one entry per model (a :class:`Circuit`, a ``gna scan``
    folder, or None to discover). With ``out`` the folder is written and each finished part checkpointed
    (``resume``/``fresh`` as in ``gna scan``). ``config`` (:class:`CompareConfig`) and keyword ``overrides``
    of its fields: the same options as ``gna compare``.
    """
    cfg = CompareConfig.build(config, **overrides)
    specs = _split_specs(models)
    circuits = list(circuits) if circuits is not None else [None] * len(specs)
    if len(circuits) != len(specs):
        raise InputError(f"{len(circuits)} circuits for {len(specs)} models; give one per model (None / an empty "
                         f"entry to discover that model's)")
    folder = Path(out) if out is not None else None
    names = [s if isinstance(s, str) else s.name for s in specs]
    cdirs = [folder / CIRCUITS_DIR / slug(n) for n in names] if folder is not None else []
    if folder is not None:
        open_folder(folder, CKPT, cfg, also=[p for c in cdirs for p in (c / SCAN_CKPT, c / CIRCUIT_JSON)],
                    circuits=cdirs)
    settings = {"pairs": cfg.pairs, "samples": cfg.samples, "max_value": cfg.max_value, "template": cfg.template,
                "seed": cfg.seed, "k": cfg.k, "seeds": cfg.seeds, "sharp_samples": cfg.sharp_samples, "pool": cfg.pool,
                "shifts": list(cfg.shifts), "batch_size": cfg.batch_size, "method": "zero"}
    log = Checkpoint(folder / CKPT if folder is not None else None, NAME, settings_fingerprint(settings))
    log.save()
    start = time.perf_counter()
    parts = _Parts()
    for spec, given, name in zip(specs, circuits, names):
        _measure_model(spec, given, name, log, folder, cfg, settings, parts)
    result = parts.assemble(names, {**settings, "drop_metric": "logit_diff"}, time.perf_counter() - start)
    if folder is not None:
        result.save(folder, png=cfg.png)
    return result


@dataclass
class _Parts:
    """What :func:`compare` collects model by model, and the result it makes of them."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    curves: list[pd.DataFrame] = field(default_factory=list)
    heads: list[pd.DataFrame] = field(default_factory=list)
    samples: list[pd.DataFrame] = field(default_factory=list)
    kinds: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def assemble(self, names: list[str], settings: dict[str, Any], seconds: float) -> "FamilyComparison":
        table = pd.DataFrame(self.rows)
        cost_cols = sorted([c for c in table.columns if c.startswith("cost_") and c[5:].isdigit()],
                           key=lambda c: int(c[5:]))
        table = table[[c for c in TABLE_COLUMNS if c in table] + [c for c in cost_cols if c not in TABLE_COLUMNS]]
        heads_df = pd.concat(self.heads, ignore_index=True)
        heads_df = heads_df[["model"] + [c for c in heads_df.columns if c != "model"]]
        samples_df = (pd.concat(self.samples, ignore_index=True) if self.samples
                      else pd.DataFrame(columns=AGGREGATION_COLUMNS + ["sample", "model"]))
        return FamilyComparison(names, table, pd.concat(self.curves, ignore_index=True), heads_df, samples_df,
                                pd.DataFrame(self.kinds), self.sources, seconds, settings=settings,
                                notes=self.notes)


def _measure_model(spec: Model | str, given: Any, name: str, log: Checkpoint, folder: Path | None,
                   cfg: CompareConfig, settings: dict[str, Any], parts: _Parts) -> None:
    """Load (a spec), resolve the circuit of and measure one model, adding its parts to ``parts``."""
    m = model_of(spec, cfg.device, cfg.dtype)
    task = cfg.kv(m.kv_words)
    cdir = folder / CIRCUITS_DIR / slug(name) if folder is not None else None
    found_on = cfg.kv(m.kv_words, seed=cfg.seed + 1)
    try:
        circ, parts.sources[name] = resolve_circuit(m, given, cdir, Discovery(
            seed=cfg.seed, task=found_on, k=cfg.k, batch_size=cfg.batch_size, progress=cfg.progress))
    except InputError as e:
        kept = (f"; the models measured so far are kept in {folder / CKPT}: leave {name} out and rerun with "
                f"--resume" if folder is not None and parts.rows else "")
        raise InputError(f"{'' if name in str(e) else name + ': '}{e}{kept}") from e
    best = [h.name for h in circ.heads[:max(cfg.k, cfg.pool)]]
    key = f"{slug(name)}:{fingerprint(m, {'heads': best, **settings})[:16]}"
    k = removed_k(circ, cfg.k)
    got = _one_model(m, circ, log, key, task, cfg, f"compare {name}")
    if k < cfg.k:
        parts.notes.append(f"{name}: removes up to k = {k} heads, not {cfg.k} ({len(circ.scan.heads)} scanned heads; "
                           f"k random heads must stay at most a quarter of them)")
    curve = pd.DataFrame(got["curve"]).assign(model=name)[CURVE_COLUMNS]
    parts.curves.append(curve)
    frame = circ.scan.to_frame()[["name", "rank", "drop"]]
    ph = frame.merge(got["per_head"], on="name", how="inner").sort_values("rank")
    parts.heads.append(ph.assign(model=name))
    hurt = ph[ph["drop"] > 0]
    agg = hurt.sort_values("aggregate", ascending=False).iloc[0] if len(hurt) else None
    if agg is not None:
        ps = got["per_sample"]
        parts.samples.append(ps[ps["name"] == agg["name"]].assign(model=name))
    parts.kinds += _kinds_rows(name, circ, ph)
    parts.rows.append(_table_row(m, name, circ, got, curve, agg, task.chance))


def _table_row(m: Model, name: str, circ: Circuit, got: dict[str, Any], curve: pd.DataFrame, agg: Any,
               chance: float) -> dict[str, Any]:
    k, intact = got["k"], got["intact"]
    top = curve[curve["series"] == "top"].set_index("j")["cost"]
    rnd = curve[(curve["series"] == "random") & (curve["j"] == k)]["cost"]
    half = next((j for j in range(1, k + 1) if top.get(j, -1) >= (intact - chance) / 2), math.nan)
    row = {"model": name, "architecture": m.architecture, "mixers": _mixers(m), "heads": len(circ.scan.heads),
           "k": k, "intact": intact, "chance": chance, "top_heads": ",".join(h.name for h in got["top"]),
           "cost_1": float(top.get(1, math.nan)), "cost_k": float(top.get(k, math.nan)),
           "random_cost_k": float(rnd.median()) if len(rnd) else math.nan,
           "heads_to_half": half if intact > chance else math.nan,
           "aggregate_head": agg["name"] if agg is not None else "",
           "aggregate_kind": agg["kind"] if agg is not None else "",
           "shift": agg["shift"] if agg is not None else math.nan,
           "aggregate": agg["aggregate"] if agg is not None else math.nan,
           "gold_share": agg["gold_share"] if agg is not None else math.nan,
           "line_entropy": agg["line_entropy"] if agg is not None else math.nan,
           "final_entropy": agg["final_entropy"] if agg is not None else math.nan}
    for j in range(1, k + 1):
        row[f"cost_{j}"] = float(top.get(j, math.nan))
    return row
