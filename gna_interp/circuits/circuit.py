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
import uuid
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.circuits.delegation import Delegation, delegation, is_hybrid
from gna_interp.circuits.formats import consistency_order, cross_format, format_frame, one_format_heads
from gna_interp.circuits.replay import SetAblation
from gna_interp.circuits.roles import RoleRule, role_scores
from gna_interp.circuits.scan import HeadScan, ScanConfig, scan_heads
from gna_interp.circuits.specificity import DEFAULT_GENERIC_FRACTION, control_task, specificity_frame
from gna_interp.circuits.views import CardViews, card_views
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.models.spec import IN_MEMORY_PREFIX
from gna_interp.errors import OptionError
from gna_interp.options import Options, check_choice, check_int, check_names, options
from gna_interp.store import atomic_write, read_json, write_json
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import Calibration, chance_margin
from gna_interp.tasks.io import task_from_dict
from gna_interp.tasks.evaluation import evaluate
from gna_interp.tasks.text import lm_loss

CURVE_COLUMNS = ["k", "series", "seed", "accuracy", "logit_diff", "gold_prob", "lm_loss", "heads"]
CONTROL_VERIFY = 8  # control heads run exactly before the error bound of the estimates is calibrated
FILES = ("scan.csv", "scan.json", "control.json", "circuit.json", "views.pt", "summary.md", "delegation.json",
         "delegation.csv")

__all__ = ["CURVE_COLUMNS", "Circuit", "DiscoverConfig", "ablation_curve", "discover", "random_orders"]


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
        control: measure every head's LM-loss rise on neutral text (:mod:`gna_interp.circuits.specificity`).
        generic_fraction: a head whose removal raises the LM loss by at least this fraction of the intact
            model's loss is ``generic``; ``keep_generic`` keeps such heads in the circuit.
        allow_chance: discover even when the intact model is near chance on the task (refused otherwise:
            nothing can be found in a task the model fails).
        twin: the task's knowledge twin (a :class:`~gna_interp.tasks.base.Task` needing the same knowledge
            without retrieval, e.g. ``MultipleChoice(questions, format="cloze")`` next to letters), evaluated
            with the curve's heads removed (:func:`twin_check`); None: no twin.
        delegation: on a hybrid (attention and SSM heads), measure which kind takes which role and what
            removing each kind's aggregate heads costs on the task and on the knowledge twin (else the
            neutral-text control) against random heads (:func:`~gna_interp.circuits.delegation.delegation`,
            ``seeds`` draws); nothing runs on a model of one kind.
        formats: other retrieval formats of the task (tasks, e.g. the other KV template or stated multiple
            choice), each scanned like the task; the circuit then ranks heads by their consistent effect, the
            smallest relative drop over all formats (:mod:`gna_interp.circuits.formats`). A format the
            intact model does not solve is skipped with a note.
    """

    scan: ScanConfig = field(default_factory=lambda: ScanConfig(strategy="auto"))
    k: int = 5
    seeds: int = 6
    role_samples: int = 8
    role_heads: int = 512
    form: str = "exact"
    rule: RoleRule = field(default_factory=RoleRule)
    n_cards: int = 2
    control: bool = True
    generic_fraction: float = DEFAULT_GENERIC_FRACTION
    keep_generic: bool = False
    allow_chance: bool = False
    twin: Any = None
    delegation: bool = True
    formats: tuple = ()

    def validate(self) -> None:
        check_int("k", self.k, 0)
        check_int("seeds", self.seeds, 0)
        check_int("role_samples", self.role_samples, 1)
        check_int("role_heads", self.role_heads, 1)
        check_int("n_cards", self.n_cards, 0)
        check_choice("form", self.form, ("exact", "attention"))
        if self.twin is not None and not isinstance(self.twin, Task):
            raise OptionError(f"twin must be a Task (e.g. MultipleChoice(questions, format='cloze')), got "
                              f"{type(self.twin).__name__}")
        bad = [type(t).__name__ for t in self.formats if not isinstance(t, Task)]
        if bad:
            raise OptionError(f"formats must be Tasks (e.g. KVRetrieval(..., template='official')), got {bad}")
        if not isinstance(self.generic_fraction, (int, float)) or not 0 < self.generic_fraction:
            raise OptionError(f"generic_fraction must be a positive number, got {self.generic_fraction!r}")

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
        model: the model's name (its spec when loaded by spec; ``<in-memory ARCH>`` for a model wrapped from memory,
            see :attr:`model_in_memory`).
        task: the task as :meth:`Task.to_dict <gna_interp.tasks.base.Task.to_dict>` saves it
            (:meth:`load_task` rebuilds it).
        scan: the head scan.
        roles: :func:`role_scores` of the scored heads.
        baseline: metrics of the unablated model (accuracy, logit_diff, gold_prob, chance, ...).
        curve: ablation curve, columns :data:`CURVE_COLUMNS` (``series`` is ``top`` or ``random``).
        rule: the role rule used.
        views: patterns of the card heads on a few samples, for the report (None when not computed).
        control: the ``logprob`` scan of the LM-loss control (None when not measured; ``notes`` says why).
        generic_fraction, keep_generic: the generic rule (see :mod:`gna_interp.circuits.specificity`).
        notes: sentences about how the circuit was found (control, chance check).
        twin: the task's knowledge twin (e.g. the cloze form of multiple-choice letters) with the curve's
            top k and random k heads removed: ``{"task", "k", "intact", "top", "random", "random_median"}``
            accuracies (None when the task has no twin).
        timings: wall seconds of each stage of :func:`discover` (check, scan, roles, control, curve, twin,
            delegation, views), in the order they ran.
        delegation: on a hybrid, the roles per head kind and the cost of removing each kind's aggregate
            heads (:class:`~gna_interp.circuits.delegation.Delegation`); None otherwise.
        calibration: the grid of task forms the intact model was measured on and the one chosen
            (:class:`~gna_interp.tasks.calibration.Calibration`; None when the task was given as is).
        formats, format_tasks: the scans of the other retrieval formats and their tasks (``to_dict``), by
            format name; when present, ``circuit_rank`` follows the consistent effect.
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
    control: HeadScan | None = None
    generic_fraction: float = DEFAULT_GENERIC_FRACTION
    keep_generic: bool = False
    notes: list[str] = field(default_factory=list)
    twin: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)
    delegation: Delegation | None = None
    calibration: Calibration | None = None
    formats: dict[str, HeadScan] = field(default_factory=dict)
    format_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)

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
        if self.control is not None or self.formats:
            member = ~df["generic"].fillna(False).astype(bool) | self.keep_generic if "generic" in df else \
                pd.Series(True, index=df.index)
            keep = dict(zip(df["name"], member))
            names = [n for n in (consistency_order(df) if self.formats else list(df["name"])) if keep[n]]
            df["circuit_rank"] = df["name"].map({n: i + 1 for i, n in enumerate(names)})
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

    def decisive(self) -> list[tuple[HeadRef, float]]:
        """Heads whose removal alone brings the task's accuracy to chance (within the margin of
        :func:`check_solvable`), with that accuracy, best-ranked first: the paper's "one head: 66% -> 25%"."""
        chance, n = self.baseline.get("chance"), len(next(iter(self.scan.baseline.values()), []))
        if chance is None or not n:
            return []
        margin = chance_margin(chance, n)
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
        pair = self.pair()
        return {
            "model": self.model, "model_in_memory": self.model_in_memory, "task": self.task, "n_samples": self.task.get("n_samples"),
            "seed": (self.task.get("args") or {}).get("seed"), "method": self.scan.method, "metric": self.scan.metric,
            "strategy": self.scan.strategy, "baseline": self.baseline, "chance": self.baseline.get("chance"),
            "rule": self.rule.to_dict(),
            "heads": _records(heads),
            "roles": _records(self.roles),
            "pair": {"gather": pair[0].name, "aggregate": pair[1].name} if pair else None,
            "curve": _records(self.curve),
            "curve_summary": self.curve_summary(), "seconds": round(self.seconds, 2),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "scan_rows": len(self.scan.heads), "views": "views.pt" if self.views is not None else None,
            "control": "control.json" if self.control is not None else None, "generic_fraction": self.generic_fraction,
            "keep_generic": self.keep_generic, "notes": list(self.notes),
            "circuit": [h.name for h in self.heads], "generic": [h.name for h in self.generic],
            "stability": self.scan.stability(),
            "decisive": [{"head": h.name, "accuracy": a} for h, a in self.decisive()],
            "twin": self.twin,
            "delegation": "delegation.json" if self.delegation is not None else None,
            "calibration": self.calibration.to_dict() if self.calibration is not None else None,
            "formats": [{"name": n, "task": self.format_tasks.get(n), "scan": f"format{i}.json"}
                        for i, n in enumerate(self.formats)],
        }

    def summary(self, top: int = 10) -> str:
        """A short Markdown summary: baseline, the circuit's heads with roles and control effects, the
        generic heads left out, the G&A pair, the curve of retrieval and control."""
        b = self.baseline
        loss = f", LM loss {b['lm_loss']:.3f} nats/token on neutral text" if "lm_loss" in b else ""
        lines = [f"# G&A circuit: {self.model} on {self.task.get('name')}", "",
                 f"- baseline: accuracy {b.get('accuracy', math.nan):.3f} (chance {b.get('chance', math.nan):.3f}), "
                 f"logit_diff {b.get('logit_diff', math.nan):.3f}{loss}; {self.task.get('n_samples')} samples",
                 f"- scan: {len(self.scan.heads)} heads, {self.scan.strategy} strategy, {self.scan.method} ablation, "
                 f"metric {self.scan.metric}, {len(self.scan.exact)} heads run exactly"
                 + (f", {len(set(self.scan.screened) - set(self.scan.exact))} more ruled out by exact runs on "
                    f"{len(self.scan.screen_index)} screening samples" if self.scan.screened else "")
                 + (f" (stopped at max_exact: {self.scan.unsettled} unrun heads could still enter the leading ones)"
                    if self.scan.unsettled else "")]
        lines += [f"- {n}" for n in self.notes]
        decisive = self.decisive()
        lines.append("- heads whose removal alone brings accuracy to chance: " + (", ".join(
            f"{h.name} ({a:.3f})" for h, a in decisive) if decisive else "none (the task survives every single removal)"))
        df = self.to_frame()
        has_control = "control_drop" in df
        if has_control:
            gen = df[df["role"] == "generic"]
            lines.append(f"- generic heads (LM-loss rise >= {self.generic_fraction:.0%} of the intact loss), "
                         f"{'kept in' if self.keep_generic else 'left out of'} the circuit: " +
                         (", ".join(f"{r['name']} (rank {r['rank']}, +{r['control_drop']:.3f} nats/token"
                                    f"{'' if r['control_source'] == 'exact' else ', estimated'})"
                                    for _, r in gen.iterrows()) or "none"))
        if "circuit_rank" in df:
            df = df[df["circuit_rank"].notna()].sort_values("circuit_rank")
        lines += ["", "| rank | head | drop | source | role | gather | aggregate | selectivity"
                  + (" | LM-loss rise | specificity |" if has_control else " |"),
                  "|---:|---|---:|---|---|---:|---:|---:|" + ("---:|---:|" if has_control else "")]
        for _, r in df.head(top).iterrows():
            lines.append(f"| {r['rank']} | {r['name']} | {r['drop']:.3f} | {r['source']} | {r['role']} | "
                         f"{_f(r.get('gather'))} | {_f(r.get('aggregate'))} | {_f(r.get('selectivity'))} |"
                         + (f" {_f(r.get('control_drop'), 3)} | {_f(r.get('specificity'))} |" if has_control else ""))
        pair = self.pair()
        lines.append("")
        st = self.scan.stability()
        if st:
            lines.append(f"- rank stability ({st['n_exact']} heads run exactly, ranked on the even and on the odd "
                         f"samples): top-5 overlap {st['top5_overlap']}/{min(5, st['k'])}, top-{st['k']} overlap "
                         f"{st['top_k_overlap']}/{st['k']}; drops carry 95% bootstrap intervals "
                         f"(drop_lo, drop_hi in scan.csv)")
        if self.formats:
            lines += self.format_lines()
        lines.append(f"- gather/aggregate pair: {pair[0].name} -> {pair[1].name}" if pair else
                     "- gather/aggregate pair: none (no aggregate or no gather head among the best-ranked heads)")
        lines += self._curve_lines()
        if self.twin:
            t = self.twin
            rnd = (f", {_f(t['random_median'], 3)} with {t['k']} random heads removed (median of {len(t['random'])} "
                   f"draws)" if t.get("random") else "")
            lines.append(f"- knowledge twin {t['task']}: accuracy {t['intact']:.3f} intact, {t['top']:.3f} with the top "
                         f"{t['k']} removed{rnd} (zero ablation)")
        if self.delegation is not None:
            lines += ["", "```", self.delegation.summary(), "```", ""]
        if self.timings:
            lines.append(f"- run time: {self.seconds:.0f} s (" + ", ".join(f"{k} {v:.0f} s" for k, v in self.timings.items())
                         + ")")
        if self.calibration is not None:
            lines += ["", "## Task form", ""] + self.calibration.lines()
        return "\n".join(lines) + "\n"

    def format_lines(self) -> list[str]:
        """The formats scanned, the circuit's consistent effects and the heads that matter in one format only."""
        names = [self.task.get("name", "task"), *self.formats]
        df = self.to_frame()
        members = df[df["circuit_rank"].notna()].sort_values("circuit_rank")
        top = ", ".join(f"{r['name']} ({r['consistent']:.2f})" for _, r in members.head(5).iterrows())
        one = one_format_heads(df, names)
        return [f"- formats scanned: {', '.join(names)}; the circuit is ranked by the consistent effect (the smallest "
                f"relative logit-difference drop over the formats): {top}",
                "- heads that matter in one format only (top 10 there, consistent effect below a quarter of it): " +
                (", ".join(f"{h} ({f}: {d:.2f}, consistent {c:.2f})" for h, f, d, c in one) or "none")]

    def _curve_lines(self) -> list[str]:
        cs = self.curve_summary()
        if not cs:
            return []
        k = cs["k"]
        out = [f"- removing the top {k} circuit heads: accuracy {cs['top']:.3f}; {k} random heads (not in the "
               f"circuit's top {k}): median {cs['random_median']:.3f}, mean {cs['random_mean']:.3f} (min "
               f"{cs['random_min']:.3f}, max {cs['random_max']:.3f}, {cs['seeds']} seeds); baseline {cs['baseline']:.3f}"]
        if cs["seeds"] and cs["baseline"] is not None:
            top_drop, rnd_drop = cs["baseline"] - cs["top"], cs["baseline"] - cs["random_max"]
            verdict = ("more than any random draw" if top_drop > cs["baseline"] - cs["random_min"] else
                       "no more than some random draw: the circuit is not distinguished at this k")
            med_drop = cs["baseline"] - cs["random_median"]
            ratio = (f", {top_drop / med_drop:.1f}x the random median's drop ({med_drop:.3f})" if med_drop > 1e-9
                     else f"; the random median's drop is {med_drop:.3f}")
            out.append(f"- so the top {k} cost {top_drop:.3f} accuracy, {verdict}{ratio} (the smallest random drop "
                       f"was {rnd_drop:.3f})")
        curve = self.curve if "lm_loss" in self.curve else self.curve.assign(lm_loss=math.nan)
        means = curve.groupby(["series", "k"])[["accuracy", "lm_loss"]].median()
        steps = [f"k={j} {means.loc[('top', j), 'accuracy']:.3f} vs {means.loc[('random', j), 'accuracy']:.3f}"
                 for j in range(1, k + 1) if ("top", j) in means.index and ("random", j) in means.index]
        if steps:
            out.append("- accuracy curve, top k vs k random (median over seeds): " + ", ".join(steps))
        if means["lm_loss"].notna().any() and ("top", k) in means.index:
            base = self.baseline.get("lm_loss", math.nan)
            parts = [f"top {k} +{means.loc[('top', k), 'lm_loss'] - base:.3f}"]
            if ("random", k) in means.index:
                parts.append(f"{k} random +{means.loc[('random', k), 'lm_loss'] - base:.3f} (median)")
            gk = int(curve.loc[curve["series"] == "generic", "k"].max()) if "generic" in set(curve["series"]) else 0
            if gk:
                parts.append(f"top {gk} generic +{means.loc[('generic', gk), 'lm_loss'] - base:.3f} (accuracy "
                             f"{means.loc[('generic', gk), 'accuracy']:.3f})")
            out.append("- LM-loss rise on neutral text (nats/token): " + ", ".join(parts))
        return out

    def save(self, out: str | os.PathLike) -> Path:
        """Write the circuit into folder ``out`` (:data:`FILES`, each atomically); return the folder."""
        d = Path(out)
        d.mkdir(parents=True, exist_ok=True)
        run = uuid.uuid4().hex  # written into every file of this save: Circuit.load refuses a file from another run
        self.scan.save(d / "scan.json", run)
        if self.control is not None:
            self.control.save(d / "control.json", run)
        if self.views is not None:
            self.views.save(d / "views.pt", run)
        if self.delegation is not None:
            self.delegation.save(d, run)
        for i, fs in enumerate(self.formats.values()):
            fs.save(d / f"format{i}.json", run)
        atomic_write(d / "scan.csv", self.to_frame().to_csv(index=False))
        atomic_write(d / "summary.md", self.summary())
        write_json(d / "circuit.json", "circuit", {**self.to_dict(), "run_id": run})  # last: it vouches for the others
        return d

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Circuit":
        """Read a circuit saved by :meth:`save` (a folder, or its ``circuit.json``); no model needed."""
        d = Path(path)
        d = d.parent if d.name == "circuit.json" else d
        doc = read_json(d / "circuit.json", "circuit")  # checked against its schema (gna_interp.schemas)
        run = doc["run_id"]
        scan = HeadScan.load(d / "scan.json", run)
        if len(scan.heads) != doc["scan_rows"]:
            raise InputError(f"{d / 'scan.json'} holds {len(scan.heads)} heads but circuit.json records "
                             f"{doc['scan_rows']}; the folder mixes two runs: rerun `gna scan`")
        views = CardViews.load(d / _member(d, doc, "views", "views.pt"), run) if doc.get("views") else None
        control = HeadScan.load(d / _member(d, doc, "control", "control.json"), run) if doc.get("control") else None
        deleg = (Delegation.load(d / _member(d, doc, "delegation", "delegation.json"), run) if doc.get("delegation")
                 else None)
        try:
            roles = pd.DataFrame(doc.get("roles") or [], columns=None)
            return cls(doc["model"], doc["task"], scan, roles, dict(doc["baseline"]),
                       pd.DataFrame(doc.get("curve") or [], columns=CURVE_COLUMNS),
                       RoleRule(**doc["rule"]), float(doc.get("seconds") or 0.0), views, control,
                       float(doc.get("generic_fraction") or DEFAULT_GENERIC_FRACTION), bool(doc.get("keep_generic")),
                       list(doc.get("notes") or []), doc.get("twin"), dict(doc.get("timings") or {}), deleg,
                       Calibration.from_dict(doc["calibration"]) if doc.get("calibration") else None,
                       *_load_formats(d, doc.get("formats") or [], run))
        except (KeyError, TypeError, ValueError, IndexError) as e:  # what the schema cannot say (a table's columns)
            raise InputError(f"{d / 'circuit.json'} does not describe a circuit ({type(e).__name__}: {str(e)[:120]}); "
                             f"rerun `gna scan`") from None

    def __repr__(self) -> str:
        return (f"Circuit({self.model!r}, {self.task.get('name')!r}, {len(self.scan.heads)} heads, "
                f"top {[h.name for h in self.heads[:5]]}, baseline accuracy {self.baseline.get('accuracy', math.nan):.3f})")


def _member(d: Path, doc: dict[str, Any], key: str, name: str) -> str:
    """``doc[key]``, which must name the file :meth:`Circuit.save` writes there: a folder is untrusted input, and
    a path that leads elsewhere (``../../etc/passwd``, another run's folder) is refused, never opened."""
    if doc[key] != name:
        raise InputError(f"{d / 'circuit.json'}: {key!r} is {str(doc[key])[:80]!r}, but a circuit folder keeps it in "
                         f"{name!r} beside circuit.json; the file was edited or comes from elsewhere: rerun `gna scan`")
    return name


def _load_formats(d: Path, entries: list[Any], run: str | None = None
                  ) -> tuple[dict[str, HeadScan], dict[str, dict[str, Any]]]:
    """The format scans and tasks a ``circuit.json`` lists (files ``formatN.json`` inside the folder)."""
    scans, tasks = {}, {}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("name"), str) or e.get("scan") != f"format{i}.json":
            raise InputError(f"{d / 'circuit.json'}: formats entry {i} is malformed ({e!r:.80}); rerun `gna scan`")
        scans[e["name"]] = HeadScan.load(d / e["scan"], run)
        tasks[e["name"]] = e.get("task") or {}
    return scans, tasks


def _records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as plain Python values (numpy scalars converted; :mod:`gna_interp.store` writes NaN as null)."""
    return [{str(k): (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
            for rec in df.to_dict(orient="records")]


def _f(v: Any, digits: int = 2) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.{digits}f}"


def random_orders(heads: Sequence[HeadRef], seeds: int, salt: str = "gna-random-heads") -> list[list[HeadRef]]:
    """``seeds`` shuffles of ``heads``, seed ``s`` seeded by ``f"{salt}-{s}"`` (the same on every machine); the
    ablation curve's random draws are their prefixes, so any caller with the same pool and salt draws the same."""
    orders = []
    for s in range(seeds):
        order = list(heads)
        random.Random(f"{salt}-{s}").shuffle(order)
        orders.append(order)
    return orders


def ablation_curve(model: Model, task: Task, ranked: Sequence[HeadRef], pool: Sequence[HeadRef], k: int = 5,
                   seeds: int = 3, method: AblationMethod = "zero", reference: Any = None,
                   batch_size: int = 16, control: Task | None = None,
                   generic: Sequence[HeadRef] = (), band: int | None = 2,
                   runner: SetAblation | None = None) -> pd.DataFrame:
    """Task metrics (and the LM loss on ``control`` when given) after removing ``ranked[:j]``
    (``j = 0..k``), ``j`` random heads of ``pool`` that are not among ``ranked[:k]`` (``seeds`` random
    orders), and the first ``k`` of ``generic`` (fewer when there are fewer); columns :data:`CURVE_COLUMNS`.

    The first ``band`` random orders are measured at every ``j`` (the curve's band); the others only at
    ``j = k``, where the top ``k`` are compared with the median of all ``seeds`` draws (``band=None``:
    every order at every ``j``). The generic heads are measured at ``j = k`` only, and the LM loss at
    ``j = 0`` and ``j = k`` (where the comparison is made). Each point replays only the blocks from its earliest removed head on
    (:class:`~gna_interp.circuits.replay.SetAblation`; pass ``runner``, one made for ``task`` with the
    same method, to reuse its clean prefixes)."""
    if k < 0 or seeds < 0:
        raise InputError(f"k and seeds must be >= 0, got k={k}, seeds={seeds}")
    others = [h for h in pool if h not in set(ranked[:k])]
    if k > len(ranked) or k > len(others):
        raise InputError(f"cannot remove k={k} heads: only {len(ranked)} ranked and {len(others)} other heads "
                         f"in the pool to draw random ones from")
    runner = runner if runner is not None else SetAblation(model, task, method, reference, batch_size)
    ctl = SetAblation(model, control, method, reference, batch_size) if control is not None else None
    rows = []

    def point(series: str, seed: int, j: int, heads: Sequence[HeadRef]) -> None:
        m = runner.run(heads).metrics
        measured = j in (0, k) or series == "generic"  # the generic point sits at min(k, len(generic))
        loss = lm_loss(ctl.run(heads)) if ctl is not None and measured else math.nan
        rows.append({"k": j, "series": series, "seed": seed, "accuracy": m["accuracy"], "logit_diff": m["logit_diff"],
                     "gold_prob": m["gold_prob"], "lm_loss": loss, "heads": ",".join(h.name for h in heads)})

    point("top", 0, 0, [])
    base = dict(rows[0])
    for j in range(1, k + 1):
        point("top", 0, j, ranked[:j])
    for s, order in enumerate(random_orders(others, seeds)):
        rows.append({**base, "series": "random", "seed": s})
        for j in range(1 if band is None or s < band else k, k + 1):
            point("random", s, j, order[:j])
    if generic and k:
        rows.append({**base, "series": "generic", "seed": 0})
        point("generic", 0, min(k, len(generic)), generic[:k])
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def curve_k(n_heads: int, k: int) -> int:
    """How many heads the curve removes: ``k``, but at most a quarter of the heads (at least 1), so that
    ``k`` random heads are a small draw that cannot contain the circuit by construction."""
    return max(1, min(k, n_heads // 4)) if n_heads > 1 else min(k, n_heads)


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
    timings: dict[str, float] = {}
    clock = [start]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        timings[stage] = timings.get(stage, 0.0) + now - clock[0]
        clock[0] = now

    sc = cfg.scan
    runner = SetAblation(model, task, sc.method, sc.reference, sc.batch_size)  # its clean pass serves the curve too
    notes = [check_solvable(model, task, sc.batch_size, cfg.allow_chance,
                            accuracy=runner.clean().metrics["accuracy"])]
    lap("check")
    scan = scan_heads(model, task, heads=heads, config=sc)
    lap("scan")
    formats, format_tasks = _format_scans(model, task, scan, cfg, notes)
    if formats:
        lap("formats")
    ranked = scan.top(len(scan.heads))
    roles = role_scores(model, task, heads=ranked[:cfg.role_heads], n_samples=cfg.role_samples,
                        batch_size=min(sc.batch_size, 8), form=cfg.form, rule=cfg.rule)
    lap("roles")
    circuit = Circuit(model.name, task.to_dict(), scan, roles, {}, pd.DataFrame(columns=CURVE_COLUMNS), cfg.rule,
                      generic_fraction=cfg.generic_fraction, keep_generic=cfg.keep_generic, notes=notes,
                      timings=timings, formats=formats, format_tasks=format_tasks)
    ctask = None
    if cfg.control:
        ctask, note = control_task(model)
        notes.append(note)
        if ctask is not None:
            circuit.control = _control_scan(model, ctask, scan, cfg)
    members = circuit.heads
    kk = curve_k(len(scan.heads), cfg.k)
    if circuit.control is not None:
        _settle_control(model, ctask, circuit, members[:kk], cfg)
    lap("control")
    if kk < cfg.k:
        notes.append(f"the curve removes k = {kk} heads, not {cfg.k}: {len(scan.heads)} heads in all, and k random "
                     f"heads must stay a small draw (at most a quarter) that cannot contain the circuit")
    circuit.curve = ablation_curve(model, task, members, scan.heads, min(kk, len(members)), cfg.seeds, sc.method,
                                   sc.reference, sc.batch_size, control=ctask, generic=circuit.generic, runner=runner)
    lap("curve")
    base_row = circuit.curve.iloc[0]
    circuit.baseline = {"accuracy": float(base_row["accuracy"]), "logit_diff": float(base_row["logit_diff"]),
                        "gold_prob": float(base_row["gold_prob"]), "chance": task.chance, "n_samples": len(task),
                        **({"lm_loss": float(base_row["lm_loss"])} if ctask is not None else {})}
    if cfg.twin is not None:
        circuit.twin = twin_check(model, cfg.twin, circuit.curve, sc.batch_size)
        lap("twin")
    if cfg.delegation and is_hybrid(model):
        knowledge = cfg.twin if cfg.twin is not None else ctask if ctask is not None else "auto" if cfg.control else None
        circuit.delegation = delegation(model, task, knowledge, roles=roles, seeds=cfg.seeds,
                                        n_samples=cfg.role_samples, rule=cfg.rule, form=cfg.form, method=sc.method,
                                        reference=sc.reference, batch_size=sc.batch_size, runner=runner)
        lap("delegation")
    if cfg.n_cards:
        circuit.views = card_views(model, task, members, circuit.to_frame(), circuit.pair(), cfg.n_cards, cfg.form)
        lap("views")
    circuit.seconds = time.perf_counter() - start
    return circuit


def _format_scans(model: Model, task: Task, scan: HeadScan, cfg: DiscoverConfig, notes: list[str],
                  ) -> tuple[dict[str, HeadScan], dict[str, dict[str, Any]]]:
    """Scan each of ``cfg.formats`` the intact model solves (a note for each one skipped), then make the
    scans comparable (:func:`~gna_interp.circuits.formats.cross_format`)."""
    if not cfg.formats:
        return {}, {}
    sc = cfg.scan
    scans, tasks = {task.name: scan}, {task.name: task}
    for i, t in enumerate(cfg.formats):
        name = t.name if t.name not in tasks else f"{t.name}-{i + 2}"
        line = check_solvable(model, t, sc.batch_size, allow_chance=True)
        if "NEAR CHANCE" in line:
            notes.append(f"format {name} not scanned: {line.split(' -- ')[0]} (at chance)")
            continue
        ckpt = Path(sc.checkpoint).with_suffix(f".format{i}.json") if sc.checkpoint is not None else None
        scans[name] = scan_heads(model, t, heads=scan.heads, config=sc.replace(checkpoint=ckpt))
        tasks[name] = t
        notes.append(f"format {name}: {line}")
    cross_format(model, scans, tasks, sc, sc.certify)
    return ({n: s for n, s in scans.items() if n != task.name},
            {n: t.to_dict() for n, t in tasks.items() if n != task.name})


def twin_check(model: Model, twin: Task, curve: pd.DataFrame, batch_size: int = 16) -> dict[str, Any]:
    """Accuracy on ``twin`` (a task that needs the same knowledge but no retrieval, e.g. the cloze form
    of letter multiple choice) intact, with the curve's top ``k`` heads removed and with each of its
    random ``k``-head draws removed (the same heads as the curve's largest ``k``; zero ablation)."""
    k = int(curve["k"].max())
    at_k = curve[curve["k"] == k]

    runner = SetAblation(model, twin, batch_size=batch_size)

    def acc(names: str) -> float:
        return runner.run([HeadRef.parse(n) for n in names.split(",") if n]).metrics["accuracy"]

    top = at_k[at_k["series"] == "top"]["heads"].iloc[0]
    rnd = [acc(h) for h in at_k[at_k["series"] == "random"]["heads"]]
    return {"task": twin.name, "k": k, "method": "zero", "intact": acc(""), "top": acc(top), "random": rnd,
            "random_median": float(pd.Series(rnd).median()) if rnd else math.nan}


def check_solvable(model: Model, task: Task, batch_size: int = 16, allow_chance: bool = False,
                   accuracy: float | None = None) -> str:
    """Evaluate the intact model on ``task`` (or take its ``accuracy`` when already measured) and refuse
    (:class:`InputError`) when it is within two standard errors (at least 0.05) of chance: a task the
    model fails cannot reveal a circuit. Returns a sentence with the numbers; ``allow_chance`` turns the
    refusal into that sentence."""
    acc = evaluate(model, task, batch_size=batch_size, progress=False).accuracy if accuracy is None else accuracy
    chance, n = task.chance, len(task)
    margin = chance_margin(chance, n)
    line = (f"intact model: accuracy {acc:.3f} on {task.name} ({n} samples), chance {chance:.3f}, "
            f"margin {margin:.3f}")
    if acc <= chance + margin:
        if not allow_chance:
            raise InputError(f"{model.name} is at chance on {task.name}: {line}. Nothing can be discovered from a "
                             f"task the model fails; make it easier (KV: fewer pairs, another template; multiple choice: "
                             f"more shots, or the 'stated' form, gna scan --mc-form stated) or pass allow_chance=True "
                             f"(gna scan --allow-chance)")
        return line + " -- NEAR CHANCE: the circuit below is not evidence of retrieval"
    return line


def _control_scan(model: Model, ctask: Task, scan: HeadScan, cfg: DiscoverConfig) -> HeadScan:
    """The LM-loss control of every scanned head: attribution estimates for all of them, and exact runs for
    the heads that can enter the circuit (the scan's best-ranked ``2 * max(certify, k)``) whose rise could
    reach the generic threshold."""
    sc = cfg.scan
    base_loss = lm_loss(evaluate(model, ctask, batch_size=sc.batch_size, progress=False).scores)
    ckpt = Path(sc.checkpoint).with_suffix(".control.json") if sc.checkpoint is not None else None
    focus = scan.top(min(len(scan.heads), 2 * max(sc.certify, cfg.k)))
    return scan_heads(model, ctask, heads=scan.heads, strategy="auto", metric="logprob", method=sc.method,
                      reference=sc.reference, batch_size=min(sc.batch_size, 8), checkpoint=ckpt, certify=0,
                      verify=CONTROL_VERIFY, focus=focus, settle_above=cfg.generic_fraction * base_loss,
                      progress=sc.progress)


def _settle_control(model: Model, ctask: Task, circuit: Circuit, heads: Sequence[HeadRef], cfg: DiscoverConfig) -> None:
    """Run the control exactly for circuit heads that only have an estimate (merged into ``circuit.control``)."""
    control = circuit.control
    assert control is not None
    missing = [h for h in heads if h not in control.exact]
    if missing:
        sc = cfg.scan
        extra = scan_heads(model, ctask, heads=missing, strategy="exact", metric="logprob", method=sc.method,
                           reference=sc.reference, batch_size=min(sc.batch_size, 8), progress=False)
        control.exact.update(extra.exact)
