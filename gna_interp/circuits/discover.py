"""`discover(model, task)`: scan + G&A roles -> a circuit, with its ablation curve against random heads.

The ablation curve is the task score (accuracy, logit difference) after removing the ``k`` best-ranked
heads together, ``k = 0..K``, beside ``k`` heads drawn at random from every scanned head (each seed
draws one random order and removes its first ``k``). A circuit is saved as ``scan.csv`` (the scan
with role columns), ``circuit.json`` (model, task, settings, baseline, ranked heads with roles, the
gather/aggregate pair, the curve) and ``summary.md``.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.circuits.roles import RoleRule, role_scores
from gna_interp.circuits.scan import DEFAULT_CERTIFY, HeadScan, Metric, Strategy, scan_heads
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod, ablate
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.tasks.scoring import plan_scoring, run_plan

CURVE_COLUMNS = ["k", "series", "seed", "accuracy", "logit_diff", "gold_prob", "heads"]
FILES = ("scan.csv", "circuit.json", "summary.md")

__all__ = ["CURVE_COLUMNS", "Circuit", "ablation_curve", "discover", "task_description"]


def task_description(task: Task) -> dict[str, Any]:
    """What rebuilds ``task``: its name and, for KV retrieval, its constructor arguments."""
    out: dict[str, Any] = {"name": task.name, "n_samples": len(task)}
    for attr in ("n_pairs", "seed", "template", "max_value", "value_suffix"):
        if hasattr(task, attr):
            out[attr] = getattr(task, attr)
    if getattr(task, "words", None) is not None:
        out["words"] = list(task.words)
    if hasattr(task, "n_pairs"):
        out["kind"] = "kv"
    return out


@dataclass
class Circuit:
    """Result of :func:`discover`.

    Attributes:
        model: the model's name (its spec when loaded by spec).
        task: :func:`task_description` of the task.
        scan: the head scan.
        roles: :func:`role_scores` of the scored heads.
        baseline: metrics of the unablated model (accuracy, logit_diff, gold_prob, chance, ...).
        curve: ablation curve, columns :data:`CURVE_COLUMNS` (``series`` is ``top`` or ``random``).
        rule: the role rule used.
    """

    model: str
    task: dict[str, Any]
    scan: HeadScan
    roles: pd.DataFrame
    baseline: dict[str, float]
    curve: pd.DataFrame
    rule: RoleRule = field(default_factory=RoleRule)
    seconds: float = 0.0

    def heads(self) -> pd.DataFrame:
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
        df = self.heads().head(pool)
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
        """The JSON-able circuit (``circuit.json``): the ``top`` best-ranked heads with their roles."""
        heads = self.heads().head(top)
        pair = self.pair()
        return {
            "model": self.model, "task": self.task, "n_samples": self.task.get("n_samples"),
            "seed": self.task.get("seed"), "method": self.scan.method, "metric": self.scan.metric,
            "strategy": self.scan.strategy, "baseline": self.baseline, "chance": self.baseline.get("chance"),
            "rule": self.rule.to_dict(),
            "heads": json.loads(heads.to_json(orient="records")),
            "pair": {"gather": pair[0].name, "aggregate": pair[1].name} if pair else None,
            "curve": json.loads(self.curve.to_json(orient="records")),
            "curve_summary": self.curve_summary(), "seconds": round(self.seconds, 2),
        }

    def summary(self, top: int = 10) -> str:
        """A short Markdown summary: baseline, top heads with roles, the G&A pair, the curve."""
        b = self.baseline
        lines = [f"# G&A circuit: {self.model} on {self.task.get('name')}", "",
                 f"- baseline: accuracy {b.get('accuracy', math.nan):.3f} (chance {b.get('chance', math.nan):.3f}), "
                 f"logit_diff {b.get('logit_diff', math.nan):.3f}; {self.task.get('n_samples')} samples",
                 f"- scan: {len(self.scan.heads)} heads, {self.scan.strategy} strategy, {self.scan.method} ablation, "
                 f"metric {self.scan.metric}, {len(self.scan.exact)} heads run exactly", ""]
        df = self.heads().head(top)
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

    def save(self, out: str | Path) -> Path:
        """Write ``scan.csv``, ``circuit.json`` and ``summary.md`` into ``out``; return the folder."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        self.heads().to_csv(d / "scan.csv", index=False)
        (d / "circuit.json").write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        (d / "summary.md").write_text(self.summary(), encoding="utf-8")
        return d


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
            m = run_plan(model, plan, batch_size, share_prefix=share).metrics()
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
             strategy: Strategy = "auto", method: AblationMethod = "zero", metric: Metric = "logit_diff",
             reference: Any = None, k: int = 5, seeds: int = 3, batch_size: int = 16, role_samples: int = 8,
             role_heads: int = 512, form: str = "exact", rule: RoleRule | None = None,
             checkpoint: str | Path | None = None, verify: int | None = None, certify: int = DEFAULT_CERTIFY,
             progress: bool = True) -> Circuit:
    """Find the G&A circuit of ``model`` on ``task``: scan every head (see :func:`scan_heads`), score
    the roles of the best-ranked ``role_heads`` heads on ``role_samples`` samples (see
    :func:`role_scores`), and measure the ablation curve of the top ``k`` heads against ``seeds``
    random draws of ``k`` heads.
    """
    if not isinstance(task, Task):
        raise InputError(f"discover needs a Task (e.g. KVRetrieval(...)), got {type(task).__name__}")
    start = time.perf_counter()
    rule = rule or RoleRule()
    scan = scan_heads(model, task, heads=heads, method=method, metric=metric, strategy=strategy,
                      batch_size=batch_size, reference=reference, checkpoint=checkpoint, verify=verify,
                      certify=certify, progress=progress)
    ranked = scan.top(len(scan.heads))
    scored = ranked[:role_heads]
    roles = role_scores(model, task, heads=scored, n_samples=role_samples, batch_size=min(batch_size, 8),
                        form=form, rule=rule)
    kk = min(k, len(ranked))
    curve = ablation_curve(model, task, ranked, scan.heads, kk, seeds, method, reference, batch_size)
    base_row = curve.iloc[0]
    baseline = {"accuracy": float(base_row["accuracy"]), "logit_diff": float(base_row["logit_diff"]),
                "gold_prob": float(base_row["gold_prob"]), "chance": task.chance, "n_samples": len(task)}
    return Circuit(model.name, task_description(task), scan, roles, baseline, curve, rule,
                   time.perf_counter() - start)
