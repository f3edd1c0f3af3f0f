"""`discover(model, task)`: scan + G&A roles -> a :class:`Circuit`, with its ablation curve against random heads.

The ablation curve is the task score (accuracy, logit difference) after removing the ``k`` best-ranked
heads together, ``k = 0..K``, beside ``k`` heads drawn at random from every scanned head (each seed
draws one random order and removes its first ``k``). A circuit saves into a folder and loads back
(:meth:`Circuit.save`, :meth:`Circuit.load`): ``scan.csv`` (the ranked table with role columns),
``scan.json`` (every per-sample result), ``circuit.json`` (model, the task itself, settings, baseline,
roles, the gather/aggregate pair, the curve), ``views.pt`` (what the report draws: patterns of the
card heads on a few samples) and ``summary.md``. Formats: :mod:`gna_interp.store`.
"""

from __future__ import annotations

import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.circuits.roles import RoleRule, role_scores
from gna_interp.circuits.scan import HeadScan, ScanConfig, scan_heads
from gna_interp.circuits.views import CardViews, card_views
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod, ablate
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_choice, check_int, check_names, options
from gna_interp.store import atomic_write, read_json, write_json
from gna_interp.tasks.base import Task
from gna_interp.tasks.io import task_from_dict
from gna_interp.tasks.scoring import plan_scoring, run_plan

CURVE_COLUMNS = ["k", "series", "seed", "accuracy", "logit_diff", "gold_prob", "heads"]
FILES = ("scan.csv", "scan.json", "circuit.json", "views.pt", "summary.md")

__all__ = ["CURVE_COLUMNS", "Circuit", "DiscoverConfig", "ablation_curve", "discover"]


@options
class DiscoverConfig(Options):
    """How :func:`discover` runs, beyond the scan itself.

    Attributes:
        scan: the head scan's options (:class:`~gna_interp.circuits.scan.ScanConfig`; strategy ``auto``
            by default here).
        k, seeds: heads removed together in the ablation curve, and random draws to compare with.
        role_samples, role_heads: samples and best-ranked heads the G&A roles are scored on.
        form: SSM implicit-attention form for roles and views (``exact`` or ``attention``).
        rule: the role-labelling rule.
        n_cards: task samples whose patterns are kept for the report's G&A cards.
    """

    scan: ScanConfig = field(default_factory=lambda: ScanConfig(strategy="auto"))
    k: int = 5
    seeds: int = 3
    role_samples: int = 8
    role_heads: int = 512
    form: str = "exact"
    rule: RoleRule = field(default_factory=RoleRule)
    n_cards: int = 2

    def validate(self) -> None:
        check_int("k", self.k, 0)
        check_int("seeds", self.seeds, 0)
        check_int("role_samples", self.role_samples, 1)
        check_int("role_heads", self.role_heads, 1)
        check_int("n_cards", self.n_cards, 0)
        check_choice("form", self.form, ("exact", "attention"))

    @classmethod
    def build(cls, base: "DiscoverConfig | None" = None, **overrides: Any) -> "DiscoverConfig":
        """``base`` with ``overrides``, which may name fields of this class or of its ``scan``."""
        own = set(cls.field_names())
        check_names(overrides, own | set(ScanConfig.field_names()), cls.__name__)
        scan_kw = {k: v for k, v in overrides.items() if k not in own}
        mine = {k: v for k, v in overrides.items() if k in own}
        cfg = super().build(base, **mine)
        return cfg.replace(scan=ScanConfig.build(cfg.scan, **scan_kw)) if scan_kw else cfg


@dataclass
class Circuit:
    """Result of :func:`discover`.

    Attributes:
        model: the model's name (its spec when loaded by spec).
        task: the task as :meth:`Task.to_dict <gna_interp.tasks.base.Task.to_dict>` saves it
            (:meth:`load_task` rebuilds it).
        scan: the head scan.
        roles: :func:`role_scores` of the scored heads.
        baseline: metrics of the unablated model (accuracy, logit_diff, gold_prob, chance, ...).
        curve: ablation curve, columns :data:`CURVE_COLUMNS` (``series`` is ``top`` or ``random``).
        rule: the role rule used.
        views: patterns of the card heads on a few samples, for the report (None when not computed).
    """

    model: str
    task: dict[str, Any]
    scan: HeadScan
    roles: pd.DataFrame
    baseline: dict[str, float]
    curve: pd.DataFrame
    rule: RoleRule = field(default_factory=RoleRule)
    seconds: float = 0.0
    views: CardViews | None = None

    @property
    def heads(self) -> list[HeadRef]:
        """Every scanned head, best-ranked first."""
        return self.scan.top(len(self.scan.heads))

    @property
    def metrics(self) -> dict[str, Any]:
        """The baseline metrics of the intact model plus the curve summary (``top_k_*``, ``random_k_*``)."""
        cs = self.curve_summary()
        extra = {f"{k}_{cs['metric']}": cs[k] for k in ("top", "random_mean")} if cs else {}
        return {**self.baseline, **extra}

    def load_task(self) -> Task:
        """The task this circuit was found on, rebuilt from :attr:`task`."""
        return task_from_dict(self.task)

    def to_frame(self) -> pd.DataFrame:
        """The scan frame (ranked) with the role columns merged in (role ``unscored`` where not scored)."""
        df = self.scan.to_frame()
        extra = [c for c in self.roles.columns if c not in ("layer", "head", "kind")]
        df = df.merge(self.roles[extra], on="name", how="left")
        df["role"] = df["role"].fillna("unscored")
        return df

    def pair(self, pool: int = 20) -> tuple[HeadRef, HeadRef] | None:
        """The top gather/aggregate pair among the ``pool`` best-ranked heads that hurt when ablated: the
        best-ranked aggregate head, and the best-ranked gather head in an earlier layer (any layer if
        none is earlier). ``None`` when either role is missing."""
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

    def curve_summary(self, metric: str = "accuracy") -> dict[str, Any]:
        """``metric`` after removing the top K heads and K random heads (mean, min, max over seeds)."""
        if self.curve.empty:
            return {}
        k = int(self.curve["k"].max())
        top = self.curve[(self.curve["series"] == "top") & (self.curve["k"] == k)][metric]
        rnd = self.curve[(self.curve["series"] == "random") & (self.curve["k"] == k)][metric]
        return {"k": k, "metric": metric, "baseline": self.baseline.get(metric), "top": float(top.iloc[0]),
                "random_mean": float(rnd.mean()) if len(rnd) else math.nan,
                "random_min": float(rnd.min()) if len(rnd) else math.nan,
                "random_max": float(rnd.max()) if len(rnd) else math.nan, "seeds": int(len(rnd))}

    def to_dict(self, top: int = 50) -> dict[str, Any]:
        """The JSON-able circuit (``circuit.json``): the ``top`` best-ranked heads with their roles, every
        role score, the curve and what rebuilds the task."""
        heads = self.to_frame().head(top)
        pair = self.pair()
        return {
            "model": self.model, "task": self.task, "n_samples": self.task.get("n_samples"),
            "seed": (self.task.get("args") or {}).get("seed"), "method": self.scan.method, "metric": self.scan.metric,
            "strategy": self.scan.strategy, "baseline": self.baseline, "chance": self.baseline.get("chance"),
            "rule": self.rule.to_dict(),
            "heads": _records(heads),
            "roles": _records(self.roles),
            "pair": {"gather": pair[0].name, "aggregate": pair[1].name} if pair else None,
            "curve": _records(self.curve),
            "curve_summary": self.curve_summary(), "seconds": round(self.seconds, 2),
            "scan_rows": len(self.scan.heads), "views": "views.pt" if self.views is not None else None,
        }

    def summary(self, top: int = 10) -> str:
        """A short Markdown summary: baseline, top heads with roles, the G&A pair, the curve."""
        b = self.baseline
        lines = [f"# G&A circuit: {self.model} on {self.task.get('name')}", "",
                 f"- baseline: accuracy {b.get('accuracy', math.nan):.3f} (chance {b.get('chance', math.nan):.3f}), "
                 f"logit_diff {b.get('logit_diff', math.nan):.3f}; {self.task.get('n_samples')} samples",
                 f"- scan: {len(self.scan.heads)} heads, {self.scan.strategy} strategy, {self.scan.method} ablation, "
                 f"metric {self.scan.metric}, {len(self.scan.exact)} heads run exactly", ""]
        df = self.to_frame().head(top)
        lines += ["| rank | head | drop | source | role | gather | aggregate | selectivity |",
                  "|---:|---|---:|---|---|---:|---:|---:|"]
        for _, r in df.iterrows():
            lines.append(f"| {r['rank']} | {r['name']} | {r['drop']:.3f} | {r['source']} | {r['role']} | "
                         f"{_f(r.get('gather'))} | {_f(r.get('aggregate'))} | {_f(r.get('selectivity'))} |")
        pair = self.pair()
        lines.append("")
        lines.append(f"- gather/aggregate pair: {pair[0].name} -> {pair[1].name}" if pair else
                     "- gather/aggregate pair: none (no aggregate or no gather head among the best-ranked heads)")
        cs = self.curve_summary()
        if cs:
            lines.append(f"- removing the top {cs['k']} heads: accuracy {cs['top']:.3f}; {cs['k']} random heads: "
                         f"{cs['random_mean']:.3f} (min {cs['random_min']:.3f}, max {cs['random_max']:.3f}, "
                         f"{cs['seeds']} seeds); baseline {cs['baseline']:.3f}")
            means = self.curve.groupby(["series", "k"])["accuracy"].mean()
            steps = [f"k={k} {means['top', k]:.3f} vs {means['random', k]:.3f}"
                     for k in range(1, cs["k"] + 1) if ("top", k) in means and ("random", k) in means]
            if steps:
                lines.append("- accuracy curve, top k vs k random (mean over seeds): " + ", ".join(steps))
        return "\n".join(lines) + "\n"

    def save(self, out: str | os.PathLike) -> Path:
        """Write the circuit into folder ``out`` (:data:`FILES`, each atomically); return the folder."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        self.scan.save(d / "scan.json")
        if self.views is not None:
            self.views.save(d / "views.pt")
        atomic_write(d / "scan.csv", self.to_frame().to_csv(index=False))
        atomic_write(d / "summary.md", self.summary())
        write_json(d / "circuit.json", "circuit", self.to_dict())  # last: it vouches for the others
        return d

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Circuit":
        """Read a circuit saved by :meth:`save` (a folder, or its ``circuit.json``); no model needed."""
        d = Path(path)
        d = d.parent if d.name == "circuit.json" else d
        doc = read_json(d / "circuit.json", "circuit")
        scan = HeadScan.load(d / "scan.json")
        if len(scan.heads) != doc.get("scan_rows"):
            raise InputError(f"{d / 'scan.json'} holds {len(scan.heads)} heads but circuit.json records "
                             f"{doc.get('scan_rows')}; the folder mixes two runs: rerun `gna scan`")
        views = CardViews.load(d / doc["views"]) if doc.get("views") else None
        roles = pd.DataFrame(doc.get("roles") or [], columns=None)
        return cls(doc["model"], doc["task"], scan, roles, dict(doc["baseline"]),
                   pd.DataFrame(doc.get("curve") or [], columns=CURVE_COLUMNS),
                   RoleRule(**doc["rule"]), float(doc.get("seconds") or 0.0), views)

    def __repr__(self) -> str:
        return (f"Circuit({self.model!r}, {self.task.get('name')!r}, {len(self.scan.heads)} heads, "
                f"top {[h.name for h in self.heads[:5]]}, baseline accuracy {self.baseline.get('accuracy', math.nan):.3f})")


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain Python values (numpy scalars converted; :mod:`gna_interp.store` writes NaN as null)."""
    return [{str(k): (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
            for rec in df.to_dict(orient="records")]


def _f(v: Any) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.2f}"


def ablation_curve(model: Model, task: Task, ranked: Sequence[HeadRef], pool: Sequence[HeadRef], k: int = 5,
                   seeds: int = 3, method: AblationMethod = "zero", reference: Any = None,
                   batch_size: int = 16) -> pd.DataFrame:
    """Task metrics after removing ``ranked[:j]`` (``j = 0..k``) and ``j`` random heads of ``pool``
    (``seeds`` random orders); columns :data:`CURVE_COLUMNS`."""
    if k < 0 or seeds < 0:
        raise InputError(f"k and seeds must be >= 0, got k={k}, seeds={seeds}")
    if k > len(ranked) or k > len(pool):
        raise InputError(f"cannot remove k={k} heads: only {len(ranked)} ranked and {len(pool)} in the pool")
    plan = plan_scoring(model, task.samples)
    # resampling aligns activations per forward, so candidates must not continue from a cached prompt
    share = False if method == "resample" else None
    rows = []

    def point(series: str, seed: int, j: int, heads: Sequence[HeadRef]) -> None:
        with ablate(model, list(heads), method, reference):
            m = run_plan(model, plan, batch_size, share_prefix=share).metrics
        rows.append({"k": j, "series": series, "seed": seed, "accuracy": m["accuracy"], "logit_diff": m["logit_diff"],
                     "gold_prob": m["gold_prob"], "heads": ",".join(h.name for h in heads)})

    point("top", 0, 0, [])
    base = dict(rows[0])
    for j in range(1, k + 1):
        point("top", 0, j, ranked[:j])
    for s in range(seeds):
        order = list(pool)
        random.Random(f"gna-random-heads-{s}").shuffle(order)
        rows.append({**base, "series": "random", "seed": s})
        for j in range(1, k + 1):
            point("random", s, j, order[:j])
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def discover(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None = None,
             config: DiscoverConfig | None = None, **overrides: Any) -> Circuit:
    """Find the G&A circuit of ``model`` on ``task``: scan every head (:func:`scan_heads`), score the
    roles of the best-ranked ``role_heads`` heads on ``role_samples`` samples (:func:`role_scores`),
    measure the ablation curve of the top ``k`` heads against ``seeds`` random draws of ``k`` heads, and
    keep the card heads' patterns for the report.

    ``config`` is a :class:`DiscoverConfig`; keyword overrides may name its fields or the scan's
    (``strategy``, ``method``, ``checkpoint``, ...); an unknown keyword raises naming the closest one.
    """
    cfg = DiscoverConfig.build(config, **overrides)
    if not isinstance(task, Task):
        raise InputError(f"discover needs a Task (e.g. KVRetrieval(...)), got {type(task).__name__}")
    start = time.perf_counter()
    sc = cfg.scan
    scan = scan_heads(model, task, heads=heads, config=sc)
    ranked = scan.top(len(scan.heads))
    roles = role_scores(model, task, heads=ranked[:cfg.role_heads], n_samples=cfg.role_samples,
                        batch_size=min(sc.batch_size, 8), form=cfg.form, rule=cfg.rule)
    kk = min(cfg.k, len(ranked))
    curve = ablation_curve(model, task, ranked, scan.heads, kk, cfg.seeds, sc.method, sc.reference, sc.batch_size)
    base_row = curve.iloc[0]
    baseline = {"accuracy": float(base_row["accuracy"]), "logit_diff": float(base_row["logit_diff"]),
                "gold_prob": float(base_row["gold_prob"]), "chance": task.chance, "n_samples": len(task)}
    circuit = Circuit(model.name, task.to_dict(), scan, roles, baseline, curve, cfg.rule)
    if cfg.n_cards:
        circuit.views = card_views(model, task, ranked, circuit.to_frame(), circuit.pair(), cfg.n_cards, cfg.form)
    circuit.seconds = time.perf_counter() - start
    return circuit
