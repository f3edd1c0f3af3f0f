"""`Circuit`: what :func:`~gna_interp.circuits.search.discovery.discover` found, and its folder.

A circuit saves into a folder and loads back (:meth:`Circuit.save`, :meth:`Circuit.load`): ``scan.csv`` (the
ranked table with role columns), ``scan.json`` (every per-sample result), ``circuit.json`` (model, the task
itself, settings, baseline, roles, the gather/aggregate pair, the ablation curve), ``views.pt`` (what the report
draws: patterns of the card heads, and of every head, on a few samples), ``control.json``, ``delegation.json``
and ``formatN.json`` when measured; one run id ties them together. :meth:`Circuit.to_dict` /
:meth:`Circuit.from_dict` are the document and back. The Markdown summary and the report are drawn from a
circuit by :mod:`gna_interp.report`. Formats: :mod:`gna_interp.store`.
"""

from __future__ import annotations

import math
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gna_interp.engine.profile import Cost
from gna_interp.constants import CIRCUIT_JSON, CONTROL_JSON, DELEGATION_CSV, DELEGATION_JSON, SCAN_CSV, SCAN_JSON, SUMMARY_MD, VIEWS_PT, format_scan
from gna_interp.circuits.edges.causal import EDGE_COLUMNS, causal_roles, check_edge_table, strongest_path
from gna_interp.circuits.search.curve import CURVE_COLUMNS
from gna_interp.circuits.scan.delegation import Delegation
from gna_interp.circuits.search.formats import consistency_order, format_frame
from gna_interp.circuits.scan.roles import RoleRule
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.circuits.scan.specificity import DEFAULT_GENERIC_FRACTION, specificity_frame
from gna_interp.circuits.search.views import CardViews
from gna_interp.circuits.edges.whole_circuit import WholeCircuit
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.spec import IN_MEMORY_PREFIX
from gna_interp.options import Options, options
from gna_interp.results import Result, folder_of
from gna_interp.store import as_path, atomic_write, make_folder, read_json, records
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import Calibration, chance_margin
from gna_interp.tasks.io import task_from_dict

FILES = (SCAN_CSV, SCAN_JSON, CONTROL_JSON, CIRCUIT_JSON, VIEWS_PT, SUMMARY_MD, DELEGATION_JSON,
         DELEGATION_CSV)  # summary.md: written beside them by the report (gna_interp.report)

__all__ = ["FILES", "Circuit", "CircuitParts"]


@options
class CircuitParts(Options):
    """The parts of a :class:`Circuit` that its folder keeps in files of their own, besides the scan (each optional):
    the card ``views``, the ``control`` scan, the hybrid ``delegation``, the other retrieval ``formats``' scans and
    their tasks (``format_tasks``)."""

    views: CardViews | None = None
    control: HeadScan | None = None
    delegation: Delegation | None = None
    formats: dict[str, HeadScan] | None = None
    format_tasks: dict[str, dict[str, Any]] | None = None


@dataclass
class Circuit(Result):
    """Result of :func:`~gna_interp.circuits.search.discovery.discover`: a folder result (:meth:`save` / :meth:`load`); its
    figures are drawn a layer up (:meth:`plot` names them).

    Attributes:
        model: the model's name (its spec when loaded by spec; ``<in-memory ARCH>`` for a model wrapped from memory,
            see :attr:`model_in_memory`).
        task: the task as :meth:`Task.to_dict <gna_interp.tasks.base.Task.to_dict>` saves it
            (:meth:`load_task` rebuilds it).
        scan: the head scan.
        roles: :func:`~gna_interp.circuits.scan.roles.role_scores` of the scored heads.
        baseline: metrics of the unablated model (accuracy, logit_diff, gold_prob, chance, ...).
        curve: ablation curve, columns :data:`CURVE_COLUMNS` (``series`` is ``top`` or ``random``).
        rule: the role rule used.
        views: patterns of the card heads on a few samples, for the report (None when not computed).
        control: the ``logprob`` scan of the LM-loss control (None when not measured; ``notes`` says why).
        generic_fraction, keep_generic: the generic rule (see :mod:`gna_interp.circuits.scan.specificity`).
        notes: sentences about how the circuit was found (control, chance check).
        twin: the task's knowledge twin (e.g. the cloze form of multiple-choice letters) with the curve's
            top k and random k heads removed: ``{"task", "k", "intact", "top", "random", "random_median"}``
            accuracies (None when the task has no twin).
        timings: wall seconds of each stage of :func:`~gna_interp.circuits.search.discovery.discover` (check, scan, roles, control, curve, twin,
            delegation, views), in the order they ran.
        profile: each stage's :class:`~gna_interp.engine.profile.Cost` (wall and CPU seconds, the model's blocks run
            with their rows and tokens, peak memory), the calibration of the task form included.
        delegation: on a hybrid, the roles per head kind and the cost of removing each kind's aggregate
            heads (:class:`~gna_interp.circuits.scan.delegation.Delegation`); None otherwise.
        calibration: the grid of task forms the intact model was measured on and the one chosen
            (:class:`~gna_interp.tasks.calibration.Calibration`; None when the task was given as is).
        formats, format_tasks: the scans of the other retrieval formats and their tasks (``to_dict``), by
            format name; when present, ``circuit_rank`` follows the consistent effect.
        edges: the edge table among the top heads (columns
            :data:`~gna_interp.circuits.edges.causal.EDGE_COLUMNS`, effects with 95 % intervals), measured by path
            patching; the frame's ``causal_role`` / ``causal_reason`` / ``direct_*`` columns and :meth:`pair` come
            from it (None: not measured).
        whole: the smallest edge set of the whole graph (embeddings, heads, MLPs, logits) that keeps a threshold
            share of the intact metric, with that share (:class:`~gna_interp.circuits.edges.whole_circuit.WholeCircuit`;
            None: not searched, as in a plain scan).
    """

    FORMAT = "circuit"
    FILE = CIRCUIT_JSON
    DRAWN_BY = "gna_interp.viz.score_heatmap(circuit) or gna_interp.viz.ablation_curve(circuit)"

    model: str
    task: dict[str, Any]
    scan: HeadScan
    roles: pd.DataFrame
    baseline: dict[str, float]
    curve: pd.DataFrame
    rule: RoleRule = field(default_factory=RoleRule)
    seconds: float = 0.0
    views: CardViews | None = None
    control: HeadScan | None = None
    generic_fraction: float = DEFAULT_GENERIC_FRACTION
    keep_generic: bool = False
    notes: list[str] = field(default_factory=list)
    twin: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    profile: dict[str, Cost] = field(default_factory=dict)
    delegation: Delegation | None = None
    calibration: Calibration | None = None
    formats: dict[str, HeadScan] = field(default_factory=dict)
    format_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    edges: pd.DataFrame | None = None
    whole: WholeCircuit | None = None

    @property
    def heads(self) -> list[HeadRef]:
        """The circuit: scanned heads best-ranked first, generic heads left out (unless ``keep_generic``)."""
        df = self.to_frame()
        if "circuit_rank" in df:
            df = df[df["circuit_rank"].notna()].sort_values("circuit_rank")
        return [HeadRef.parse(n) for n in df["name"]]

    @property
    def generic(self) -> list[HeadRef]:
        """Heads labelled generic (their removal raises the LM loss by ``generic_fraction`` or more), by rank."""
        df = self.to_frame()
        return [HeadRef.parse(n) for n in df.loc[df["role"] == "generic", "name"]] if "generic" in df else []

    @property
    def metrics(self) -> dict[str, Any]:
        """The baseline metrics of the intact model plus the curve summary (``top_k_*``, ``random_k_*``)."""
        cs = self.curve_summary()
        extra = {f"{k}_{cs['metric']}": cs[k] for k in ("top", "random_median", "random_mean")} if cs else {}
        return {**self.baseline, **extra}

    @property
    def model_in_memory(self) -> bool:
        """Whether the circuit was found on a model wrapped from memory (``model`` is ``<in-memory ARCH>``): there is
        no spec to reload it from, so anything that would load the model needs one given explicitly."""
        return self.model.startswith(IN_MEMORY_PREFIX)

    @property
    def kv_args(self) -> dict[str, Any]:
        """The KV task's constructor arguments (``n_pairs``, ``template``, ``max_value``, ...); empty for other tasks."""
        return dict(self.task.get("args") or {}) if self.task.get("kind") == "kv" else {}

    def load_task(self) -> Task:
        """The task this circuit was found on, rebuilt from :attr:`task`."""
        return task_from_dict(self.task)

    def to_frame(self) -> pd.DataFrame:
        """The scan frame (ranked) with the role columns merged in (role ``unscored`` where not scored)."""
        df = self.scan.to_frame()
        extra = [c for c in self.roles.columns if c not in ("layer", "head", "kind")]
        df = df.merge(self.roles[extra], on="name", how="left")
        df["role"] = df["role"].fillna("unscored")
        if self.control is not None:
            df = df.merge(specificity_frame(self.scan, self.control, self.generic_fraction), on="name", how="left")
            df["pattern_role"] = df["role"]
            gen = df["generic"].fillna(False).astype(bool)
            df.loc[gen, "role"] = "generic"
            if "role_reason" in df:
                df.loc[gen, "role_reason"] = [
                    f"generic: removing it raises the LM loss on neutral text by {c:.3f} nats/token ({r:.1%} of the "
                    f"intact loss, threshold {self.generic_fraction:.0%})" for c, r in zip(df.loc[gen, "control_drop"],
                                                                                        df.loc[gen, "control_rel"])]
        if self.formats:
            df = df.merge(format_frame({self.task.get("name", "task"): self.scan, **self.formats}), on="name",
                          how="left")
        if self.edges is not None and len(self.edges):
            df = df.merge(self._causal_roles(), on="name", how="left")
            n = len(set(self.edges["sender"]))
            df.loc[df["causal_role"].isna(), "causal_reason"] = (
                f"not measured: the edge table covers the circuit's top {n} heads (DiscoverConfig.paths; "
                f"gna_interp.circuits.edges.causal.measure_edges measures any heads)")
        if self.control is not None or self.formats:
            member = ~df["generic"].fillna(False).astype(bool) | self.keep_generic if "generic" in df else \
                pd.Series(True, index=df.index)
            keep = dict(zip(df["name"], member))
            names = [n for n in (consistency_order(df) if self.formats else list(df["name"])) if keep[n]]
            df["circuit_rank"] = df["name"].map({n: i + 1 for i, n in enumerate(names)})
        return df

    def path(self) -> dict[str, Any] | None:
        """The strongest gather -> aggregate path of the edge table (a row of it: ``edge``, ``sender``,
        ``receiver``, ``input``, ``effect``, ``low``, ``high``), or None (no edge table, or no key/value edge whose
        interval lies above 0)."""
        if self.edges is None or not len(self.edges):
            return None
        return strongest_path(self.edges, self._causal_roles())

    def edge_drops(self) -> dict[str, float]:
        """Each scanned head's own drop in the unit of the edge table (``{name: drop}``): the drop of the scan's
        estimand (the logit difference, or the log-prob of a ``logprob`` scan), which the edges are measured in --
        exact where the head was run exactly, else its attribution estimate. An ``accuracy`` scan's own drops are
        NaN for the heads it did not run, and accuracy is not what the edges measure."""
        return {h.name: d for h, d in self.scan.drops(self.scan.estimand).items()}

    def _causal_roles(self) -> pd.DataFrame:
        """:func:`~gna_interp.circuits.edges.causal.causal_roles` of the edge table, each head's drop from the scan
        (:meth:`edge_drops`)."""
        assert self.edges is not None
        return causal_roles(self.edges, self.edge_drops())

    def pair(self, pool: int = 20) -> tuple[HeadRef, HeadRef] | None:
        """The gather/aggregate pair: the sender and receiver of the strongest measured gather -> aggregate path
        (:meth:`path`) when the edge table has one; otherwise, from the pattern roles among the ``pool``
        best-ranked heads that hurt when ablated, the best-ranked aggregate head and the best-ranked gather head
        in an earlier layer (any layer if none is earlier). ``None`` when neither gives a pair."""
        p = self.path()
        if p is not None:
            return HeadRef.parse(p["sender"]), HeadRef.parse(p["receiver"])
        df = self.to_frame().head(pool)
        df = df[df["drop"] > 0]
        agg = df[df["role"] == "aggregate"]
        if agg.empty:
            return None
        a = HeadRef.parse(agg["name"].iloc[0])
        gat = df[df["role"] == "gather"]
        earlier = gat[gat["layer"] < a.layer]
        gat = earlier if not earlier.empty else gat
        return (HeadRef.parse(gat["name"].iloc[0]), a) if not gat.empty else None

    def at_chance(self) -> bool:
        """Whether the intact model is itself within the chance margin on the task (a run with ``allow_chance``)."""
        chance, acc = self.baseline.get("chance"), self.baseline.get("accuracy")
        n = len(next(iter(self.scan.baseline.values()), []))
        return chance is not None and acc is not None and n > 0 and acc <= chance + chance_margin(chance, n)

    def decisive(self) -> list[tuple[HeadRef, float]]:
        """Heads whose removal alone brings the task's accuracy to chance (within the margin of
        :func:`~gna_interp.circuits.search.discovery.check_solvable`), with that accuracy, best-ranked first: the paper's "one head: 66% -> 25%"."""
        chance, n = self.baseline.get("chance"), len(next(iter(self.scan.baseline.values()), []))
        if chance is None or not n:
            return []
        margin = chance_margin(chance, n)
        if self.at_chance():  # nothing to bring there: every head would be named
            return []
        out = [(h, self.scan.ablated(h, "accuracy")) for h in self.scan.top(len(self.scan.heads)) if h in self.scan.exact]
        return [(h, a) for h, a in out if a <= chance + margin]

    def curve_summary(self, metric: str = "accuracy") -> dict[str, Any]:
        """``metric`` after removing the top K heads and K random heads (mean, median, min, max over seeds)."""
        if self.curve.empty:
            return {}
        k = int(self.curve["k"].max())
        top = self.curve[(self.curve["series"] == "top") & (self.curve["k"] == k)][metric]
        rnd = self.curve[(self.curve["series"] == "random") & (self.curve["k"] == k)][metric]
        return {"k": k, "metric": metric, "baseline": self.baseline.get(metric), "top": float(top.iloc[0]),
                "random_mean": float(rnd.mean()) if len(rnd) else math.nan,
                "random_median": float(rnd.median()) if len(rnd) else math.nan,
                "random_min": float(rnd.min()) if len(rnd) else math.nan,
                "random_max": float(rnd.max()) if len(rnd) else math.nan, "seeds": int(len(rnd))}

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        """The JSON-able circuit (``circuit.json``): the ``top`` best-ranked heads with their roles, every
        role score, the curve and what rebuilds the task."""
        heads = self.to_frame().head(top)
        pair, path = self.pair(), self.path()
        return {
            "model": self.model, "model_in_memory": self.model_in_memory, "task": self.task, "n_samples": self.task.get("n_samples"),
            "seed": (self.task.get("args") or {}).get("seed"), "method": self.scan.method, "metric": self.scan.metric,
            "strategy": self.scan.strategy, "baseline": self.baseline, "chance": self.baseline.get("chance"),
            "rule": self.rule.to_dict(),
            "heads": records(heads),
            "roles": records(self.roles),
            "pair": {"gather": pair[0].name, "aggregate": pair[1].name} if pair else None,
            "pair_from": "edges" if path is not None else "patterns" if pair else None,
            "edges": records(self.edges) if self.edges is not None else None,
            "path": path,
            "curve": records(self.curve),
            "curve_summary": self.curve_summary(), "seconds": round(self.seconds, 2),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "profile": {k: v.to_dict() for k, v in self.profile.items()},
            "scan_rows": len(self.scan.heads), "views": VIEWS_PT if self.views is not None else None,
            "control": CONTROL_JSON if self.control is not None else None, "generic_fraction": self.generic_fraction,
            "keep_generic": self.keep_generic, "notes": list(self.notes),
            "circuit": [h.name for h in self.heads], "generic": [h.name for h in self.generic],
            "stability": self.scan.stability(),
            "decisive": [{"head": h.name, "accuracy": a} for h, a in self.decisive()],
            "twin": self.twin,
            "delegation": DELEGATION_JSON if self.delegation is not None else None,
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "formats": [{"name": n, "task": self.format_tasks.get(n), "scan": format_scan(i)}
                        for i, n in enumerate(self.formats)],
            **({"whole": self.whole.to_dict()} if self.whole is not None else {}),
        }

    def save(self, path: str | os.PathLike) -> Path:
        """Write the circuit into the folder ``path`` (or the folder of ``path`` naming its ``circuit.json``):
        :data:`FILES`, each atomically; return the folder."""
        d = folder_of(path, CIRCUIT_JSON)
        make_folder(d)
        run = uuid.uuid4().hex  # written into every file of this save: Circuit.load refuses a file from another run
        self.scan.save(d / SCAN_JSON, run)
        if self.control is not None:
            self.control.save(d / CONTROL_JSON, run)
        if self.views is not None:
            self.views.save(d / VIEWS_PT, run)
        if self.delegation is not None:
            self.delegation.save(d, run)
        for i, fs in enumerate(self.formats.values()):
            fs.save(d / format_scan(i), run)
        atomic_write(d / SCAN_CSV, self.to_frame().to_csv(index=False))
        self._write(d, run_id=run)  # circuit.json, last: it vouches for the others
        return d

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Circuit":
        """Read a circuit saved by :meth:`save` (a folder, or its ``circuit.json``); no model needed."""
        d = folder_of(as_path(path, "Circuit.load's path"), CIRCUIT_JSON)
        _own_files(d, [CIRCUIT_JSON, SCAN_JSON, VIEWS_PT, CONTROL_JSON, DELEGATION_JSON] +
                   [p.name for p in d.glob("format*.json")])
        doc = read_json(d / CIRCUIT_JSON, "circuit")  # checked against its schema (gna_interp.schemas)
        run = doc["run_id"]
        scan = HeadScan.load(d / SCAN_JSON, run)
        if len(scan.heads) != doc["scan_rows"]:
            raise InputError(f"{d / SCAN_JSON} holds {len(scan.heads)} heads but circuit.json records "
                             f"{doc['scan_rows']}; the folder mixes two runs: rerun `gna scan`")
        _check_heads(d, doc, scan)
        views = CardViews.load(d / _member(d, doc, "views", VIEWS_PT), run) if doc.get("views") else None
        control = HeadScan.load(d / _member(d, doc, "control", CONTROL_JSON), run) if doc.get("control") else None
        deleg = (Delegation.load(d / _member(d, doc, "delegation", DELEGATION_JSON), run) if doc.get("delegation")
                 else None)
        formats, format_tasks = _load_formats(d, doc.get("formats") or [], run)
        try:
            return cls.from_dict(doc, scan, views=views, control=control, delegation=deleg,
                                 formats=formats, format_tasks=format_tasks)
        except (KeyError, TypeError, ValueError, IndexError) as e:  # what the schema cannot say (a table's columns)
            raise InputError(f"{d / CIRCUIT_JSON} does not describe a circuit ({type(e).__name__}: {str(e)[:120]}); "
                             f"rerun `gna scan`") from None

    @classmethod
    def from_dict(cls, doc: dict[str, Any], scan: HeadScan, parts: CircuitParts | None = None,  # type: ignore[override]
                  **overrides: Any) -> "Circuit":
        """The circuit :meth:`to_dict` described, with the parts it keeps in files of their own: the ``scan``, and
        ``parts`` (:class:`CircuitParts`) or keyword ``overrides`` of its fields (``views``, ``control``,
        ``delegation``, ``formats``, ``format_tasks``): ``Circuit.from_dict(c.to_dict(), c.scan, ...)`` rebuilds
        ``c``."""
        own = CircuitParts.build(parts, **overrides)
        views, control, delegation, formats, format_tasks = (own.views, own.control, own.delegation, own.formats,
                                                             own.format_tasks)
        return cls(
            model=doc["model"], task=doc["task"], scan=scan, roles=pd.DataFrame(doc.get("roles") or []),
            baseline=dict(doc["baseline"]), curve=pd.DataFrame(doc.get("curve") or [], columns=CURVE_COLUMNS),
            rule=RoleRule(**doc["rule"]), seconds=float(doc.get("seconds") or 0.0), views=views, control=control,
            generic_fraction=float(doc.get("generic_fraction") or DEFAULT_GENERIC_FRACTION),
            keep_generic=bool(doc.get("keep_generic")), notes=list(doc.get("notes") or []), twin=doc.get("twin"),
            timings=dict(doc.get("timings") or {}), delegation=delegation,
            profile={k: Cost.from_dict(v) for k, v in (doc.get("profile") or {}).items()},
            calibration=Calibration.from_dict(doc["calibration"]) if doc.get("calibration") else None,
            formats=dict(formats or {}), format_tasks=dict(format_tasks or {}),
            edges=check_edge_table(doc["edges"], scan.heads, "circuit field 'edges'") if doc.get("edges") is not None
            else None,
            whole=WholeCircuit.from_dict(doc["whole"], scan.heads, "circuit field 'whole'")
            if doc.get("whole") is not None else None)

    def __repr__(self) -> str:
        pair = self.pair()
        return (f"Circuit({self.model!r}, {self.task.get('name')!r}, {len(self.scan.heads)} heads, "
                f"top {[h.name for h in self.heads[:5]]}, baseline accuracy "
                f"{self.baseline.get('accuracy', math.nan):.3f}"
                + (f", pair {pair[0].name} -> {pair[1].name}" if pair else "") + ")")

    def _repr_html_(self) -> str:
        """Jupyter's display: baseline, the circuit's top heads with their pattern and causal roles, the gather ->
        aggregate pair (the measured path when the edge table has one), the ablation curve and the drop heatmap."""
        from gna_interp import html_repr
        from gna_interp.circuits.scan.result import TOP_HEADS, drop_heatmap, interval_text

        df = self.to_frame()
        facts: list[tuple[str, Any]] = [("task", self.task.get("name", "?")),
                                        ("scan", f"{len(self.scan.heads)} heads, {self.scan.strategy}, "
                                                 f"{self.scan.method} ablation, metric {self.scan.metric}"),
                                        ("baseline", ", ".join(f"{k} {html_repr.fmt(self.baseline[k])}" for k in
                                                               ("accuracy", "chance", "logit_diff", "gold_prob")
                                                               if k in self.baseline))]
        if "circuit_rank" in df:  # the circuit's heads in order (what .heads gives), from the one frame
            top = df[df["circuit_rank"].notna()].sort_values("circuit_rank")
        else:
            top = df
        generic = list(df.loc[df["role"] == "generic", "name"]) if "generic" in df else []
        facts.append(("circuit", ", ".join(top["name"].head(5)) or "–"))
        if generic:
            facts.append(("generic, left out", ", ".join(generic[:8]) + (f" (+{len(generic) - 8})"
                                                                         if len(generic) > 8 else "")))
        path = self.path()
        pair = (HeadRef.parse(path["sender"]), HeadRef.parse(path["receiver"])) if path is not None else self.pair()
        if path is not None:
            facts.append(("gather -> aggregate", f"{path['sender']} -> {path['receiver']}: measured path "
                                                 f"{path['input']}@{path['positions']}, effect "
                                                 f"{html_repr.fmt(path['effect'])} {interval_text(path['low'], path['high'])}"))
        elif pair is not None:
            facts.append(("gather -> aggregate", f"{pair[0].name} -> {pair[1].name} (from pattern roles"
                                                 + ("; no edge holds above 0)" if self.edges is not None else
                                                    "; edges not measured)")))
        else:
            facts.append(("gather -> aggregate", "none found"))
        if self.whole is not None:
            facts.append(("whole circuit", self.whole.sentence()))
        cs = self.curve_summary()
        if cs:
            facts.append(("ablation curve", f"top {cs['k']} removed: {cs['metric']} {html_repr.fmt(cs['top'])}; "
                                            f"{cs['k']} random removed: median {html_repr.fmt(cs['random_median'])} "
                                            f"({html_repr.fmt(cs['random_min'])}-{html_repr.fmt(cs['random_max'])} over "
                                            f"{cs['seeds']} draws); intact {html_repr.fmt(cs['baseline'])}"))
        decisive = self.decisive()
        if decisive:
            facts.append(("alone to chance", ", ".join(f"{h.name} ({html_repr.fmt(a)})" for h, a in decisive[:5])))
        if self.calibration is not None:
            c = self.calibration.rows[self.calibration.chosen]
            facts.append(("task form", f"{c.task} ({', '.join(f'{k}={v}' for k, v in c.form.items())}), chosen of "
                                       f"{len(self.calibration.rows)} by calibration"))
        if self.formats:
            facts.append(("formats", ", ".join(self.formats)))
        facts.append(("seconds", html_repr.fmt(self.seconds, 1)))
        top = top.head(TOP_HEADS)
        pattern = top["pattern_role"] if "pattern_role" in top else top["role"]
        causal = top["causal_role"] if "causal_role" in top else pd.Series(None, index=top.index, dtype=object)
        header = ["rank", "head", "drop", "95% interval", "pattern role", "causal role"]
        rows = [[i + 1, r["name"], html_repr.fmt(r["drop"]), interval_text(r["drop_lo"], r["drop_hi"]),
                 html_repr.fmt(p), html_repr.fmt(c)] for i, ((_, r), p, c) in enumerate(zip(top.iterrows(), pattern, causal))]
        if "control_drop" in top:
            header.append("LM loss rise")
            for row, v in zip(rows, top["control_drop"]):
                row.append(html_repr.fmt(v))
        parts = [html_repr.title(f"Circuit on {self.model}", self.task.get("name", "")), html_repr.facts(facts),
                 html_repr.title(f"top {len(rows)} heads of the circuit", "drop: " + self.scan.metric + " of the intact "
                             "model minus with the head removed"), html_repr.table(header, rows)]
        if not self.curve.empty:
            parts.append(html_repr.Raw(_curve_table(self.curve, cs.get("metric", "accuracy"))))
        parts.append(html_repr.Raw(drop_heatmap(df, self.scan.metric)))
        if self.notes:
            parts.append(html_repr.bullets(self.notes))
        return html_repr.block(parts)


def _curve_table(curve: pd.DataFrame, metric: str) -> str:
    """The ablation curve as a table: for each k, ``metric`` with the top k heads removed and with k random heads
    removed (median, min and max over the draws)."""
    from gna_interp import html_repr

    rows = []
    for k in sorted(curve["k"].unique()):
        at = curve[curve["k"] == k]
        top = at.loc[at["series"] == "top", metric]
        rnd = at.loc[at["series"] == "random", metric].astype(float)
        rows.append([int(k), html_repr.fmt(float(top.iloc[0]) if len(top) else math.nan),
                     html_repr.fmt(float(rnd.median()) if len(rnd) else math.nan),
                     f"{html_repr.fmt(float(rnd.min()))}-{html_repr.fmt(float(rnd.max()))}" if len(rnd) else "–"])
    return (html_repr.title("ablation curve", f"{metric} with k heads removed")
            + html_repr.table(["k", "top k", "random k (median)", "random k (range)"], rows))


def _own_files(d: Path, names: list[str]) -> None:
    """Refuse a circuit folder whose files are symbolic links (to another run's files, to ``/etc/passwd``) or folders
    (a loader given a folder would look inside it): a folder keeps its own files; nothing is opened before this
    check."""
    for name in names:
        p = d / name
        if p.is_symlink():
            raise InputError(f"{str(p)!r} is a symbolic link (to {os.readlink(p)[:80]!r}); a circuit folder keeps its "
                             f"own files: copy the file in, or rerun `gna scan`")
        if p.is_dir():
            raise InputError(f"{str(p)!r} is a folder, not a file; a circuit folder keeps its {name} as a file: rerun "
                             f"`gna scan`")


def _check_heads(d: Path, doc: dict[str, Any], scan: HeadScan) -> None:
    """What the schema cannot say of circuit.json: the heads it names are the scan's, each table row's layer and
    head agree with its name, and its task rebuilds."""
    if not scan.baseline:
        raise InputError(f"{d / SCAN_JSON}: field 'baseline' is empty, but a circuit's scan measures the intact model "
                         f"first; the file was edited: rerun `gna scan`")
    scanned = {h.name for h in scan.heads}
    for key in ("circuit", "generic"):
        stray = [n for n in doc.get(key) or [] if n not in scanned]
        if stray:
            raise InputError(f"{d / CIRCUIT_JSON}: field {key!r} names {stray[0]!r}, which is not among the "
                             f"{len(scanned)} scanned heads of scan.json; the file was edited: rerun `gna scan`")
    for key in ("heads", "roles"):
        for i, row in enumerate(doc.get(key) or []):
            if "name" not in row:
                continue
            h = HeadRef.parse(row["name"])
            if (row.get("layer", h.layer), row.get("head", h.head)) != (h.layer, h.head) or row["name"] not in scanned:
                raise InputError(f"{d / CIRCUIT_JSON}: field '{key}/{i}' is {row['name']!r} at layer "
                                 f"{row.get('layer')}, head {row.get('head')}, which do not agree (or it was not "
                                 f"scanned); the file was edited: rerun `gna scan`")
    if doc.get("edges") is not None:
        check_edge_table(doc["edges"], scan.heads, f"{d / CIRCUIT_JSON}: field 'edges'")
    if doc.get("whole") is not None:
        WholeCircuit.from_dict(doc["whole"], scan.heads, f"{d / CIRCUIT_JSON}: field 'whole'")
    try:
        task_from_dict(doc["task"])
    except (InputError, OverflowError, ValueError, TypeError, KeyError) as e:
        raise InputError(f"{d / CIRCUIT_JSON}: field 'task' does not rebuild its task ({str(e)[:160]}); "
                         f"the file was edited: rerun `gna scan`") from None


def _member(d: Path, doc: dict[str, Any], key: str, name: str) -> str:
    """``doc[key]``, which must name the file :meth:`Circuit.save` writes there: a folder is untrusted input, and
    a path that leads elsewhere (``../../etc/passwd``, another run's folder) is refused, never opened."""
    if doc[key] != name:
        raise InputError(f"{d / CIRCUIT_JSON}: {key!r} is {str(doc[key])[:80]!r}, but a circuit folder keeps it in "
                         f"{name!r} beside circuit.json; the file was edited or comes from elsewhere: rerun `gna scan`")
    return name


def _load_formats(d: Path, entries: list[Any], run: str | None = None
                  ) -> tuple[dict[str, HeadScan], dict[str, dict[str, Any]]]:
    """The format scans and tasks a ``circuit.json`` lists (files ``formatN.json`` inside the folder)."""
    scans, tasks = {}, {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e.get("scan") != format_scan(i):
            raise InputError(f"{d / CIRCUIT_JSON}: formats entry {i} is malformed ({e!r:.80}); rerun `gna scan`")
        scans[e["name"]] = HeadScan.load(d / e["scan"], run)
        tasks[e["name"]] = e.get("task") or {}
    return scans, tasks
