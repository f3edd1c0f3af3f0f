"""`hybrid_build`: distilled hybrids that keep the scan's top-k heads, k random heads, or none, compared on KV.

The paper's claim (Bick, Xing & Gu 2025): a hybrid that keeps the attention heads a KV-retrieval scan ranks
highest and replaces the others with Mamba-2 recovers retrieval; one that keeps other heads does not.
:func:`hybrid_build` tests it end to end on a zoo Transformer: for each **condition** and each seed it
distils a student with :func:`gna_interp.zoo.hybrid_build.build_hybrid` (Falcon-H1: Mamba-2 heads in every
layer beside the kept attention heads, see that module) and measures its KV accuracy at every dictionary
size:

=============  ======================================================================================
``top``        the top ``k`` attention heads of the teacher's KV scan ranking (the same heads at every seed)
``random``     ``k`` attention heads drawn uniformly from all of the teacher's
               (:func:`~gna_interp.zoo.hybrid_build.random_heads`, one draw per seed: it may hit a top head)
``none``       no attention head kept: Mamba-2 only
=============  ======================================================================================

Seeds change the student's initialisation, its training data stream and (``random``) the heads drawn.
Accuracy is :func:`~gna_interp.zoo.training.evaluate_checkpoint` of the saved student (``load_model`` +
``evaluate`` on ``KVRetrieval(n, samples, seed=0, words=keys)``, official template), the zoo cards'
measurement; the teacher intact and the teacher with only the top ``k`` heads (the rest zero-ablated:
the ``top`` student before training when ``ssm_init="zero"``) are measured on the same prompts.

**Ranking**: ``scan`` (a ``gna scan`` folder, a scan/circuit or a list of heads, as ``gna hybrid plan``
reads it) or, by default, ``gna scan``'s default discovery on the teacher (saved in ``DIR/circuit``).

**Output** (``out=DIR``, :class:`~gna_interp.experiments.output.ResultFolder` ``hybrid_build``): every
student in ``DIR/students/{condition}-s{seed}/`` (a zoo checkpoint: loads with ``load_model``),
``hybrid_build.csv`` (one row per student and size, columns :data:`COLUMNS`), ``hybrid_build.json``
(settings, ranking, per-condition summary, metrics), ``report.html`` and ``figures/hybrid_build.png``
(accuracy vs dictionary size, mean over seeds with the min-max band). Each finished student is recorded in
``DIR/hybrid_build.ckpt.json``; ``resume=True`` skips it on a rerun (also a rerun with more seeds or other
conditions, which adds the missing students), ``fresh=True`` deletes the earlier run's students,
checkpoint and discovered circuit.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from gna_interp.constants import CARD_JSON, CIRCUIT_JSON, SCAN_CKPT
from gna_interp.circuits.hybrid import load_ranking
from gna_interp.errors import InputError
from gna_interp.experiments.options import FolderOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint, stale_files
from gna_interp.experiments.run import Discovery, Point, clear_circuit, model_of, resolve_circuit, run_points
from gna_interp.engine.replay import FORWARDS, SetAblation
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import check_counts, options
from gna_interp.store import records
from gna_interp.tasks import KVRetrieval
from gna_interp.viz.html import part
from gna_interp.zoo.hybrid_build import HybridConfig, build_hybrid, is_attention, random_heads
from gna_interp.zoo.training import DEFAULT_EVAL_SIZES, TrainingRun

__all__ = ["COLUMNS", "CONDITIONS", "HybridBuild", "HybridBuildConfig", "hybrid_build", "kept_heads"]

NAME = "hybrid_build"
CKPT = "hybrid_build.ckpt.json"
STUDENTS = "students"
CIRCUIT_DIR = "circuit"
CONDITIONS: tuple[str, ...] = ("top", "random", "none")
COLUMNS = ["condition", "seed", "k", "kept", "pairs", "accuracy", "logit_diff", "gold_prob", "chance", "n_samples",
           "final_loss", "train_seconds"]
_COLOURS = {"top": "#c0392b", "random": "#7f8c8d", "none": "#2980b9"}
_LABELS = {"top": "top-{k} scan heads kept", "random": "{k} random heads kept", "none": "no attention (Mamba-2 only)"}


def kept_heads(condition: str, k: int, seed: int, ranking: Sequence[HeadRef], teacher: Model) -> list[HeadRef]:
    """The attention heads the student of ``condition`` keeps at ``seed`` (see the module docstring)."""
    if condition == "top":
        attn = [h for h in ranking if is_attention(h)]
        if k > len(attn):
            raise InputError(f"the ranking has {len(attn)} attention heads; cannot keep the top {k}")
        return sorted(attn[:k])
    if condition == "random":
        return random_heads(teacher, k, seed)
    if condition == "none":
        return []
    raise InputError(f"unknown condition {condition!r}; choose from {', '.join(CONDITIONS)}")


@dataclass
class HybridBuild(ExperimentResult, format=NAME):
    """Result of :func:`hybrid_build`: a folder result (:meth:`save` / :meth:`load`) with a figure
    (:meth:`figure`, :meth:`plot`).

    Attributes:
        teacher: the teacher's name.
        k: attention heads kept by the ``top`` and ``random`` students.
        pairs: dictionary sizes, ascending.
        table: one row per student and size (columns :data:`COLUMNS`).
        reference: ``pairs, teacher, teacher_top_only, chance``: the teacher intact and with only the top
            ``k`` heads (others zero-ablated), on the same prompts.
        ranking: the teacher's heads, best first, and ``source`` where the ranking came from.
        settings: the run's settings (``config`` holds the :class:`HybridConfig`).
        students: the folder of each student (``condition/seed`` -> path).
    """

    teacher: str
    k: int
    pairs: list[int]
    table: pd.DataFrame
    reference: pd.DataFrame
    ranking: list[str]
    source: str
    students: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def conditions(self) -> list[str]:
        return [c for c in CONDITIONS if c in set(self.table["condition"])]

    def to_frame(self) -> pd.DataFrame:
        """The per-student rows (columns :data:`COLUMNS`)."""
        return self.table.copy()

    def by_condition(self) -> pd.DataFrame:
        """One row per condition and size: ``condition, pairs, mean, std, min, max, seeds`` of the accuracy
        over seeds (``std`` the sample standard deviation; 0 with one seed)."""
        g = self.table.groupby(["condition", "pairs"])["accuracy"]
        df = g.agg(["mean", "std", "min", "max", "count"]).reset_index().rename(columns={"count": "seeds"})
        df["std"] = df["std"].fillna(0.0)
        order = {c: i for i, c in enumerate(CONDITIONS)}
        return df.sort_values(["condition", "pairs"], key=lambda s: s.map(order) if s.name == "condition" else s
                              ).reset_index(drop=True)

    @property
    def metrics(self) -> dict[str, Any]:
        """For ``top`` against each other condition: whether its mean accuracy is higher at every size
        (``top_beats_{c}``), the smallest mean margin (``margin_{c}``) and whether even its worst seed beats
        the other's best seed at every size (``top_worst_beats_{c}_best``); ``mean_{c}``: mean accuracy
        over sizes and seeds."""
        b = self.by_condition().set_index(["condition", "pairs"])
        out: dict[str, Any] = {"k": self.k, "seeds": int(self.table["seed"].nunique()), "sizes": len(self.pairs)}
        for c in self.conditions:
            out[f"mean_{c}"] = float(self.table.loc[self.table["condition"] == c, "accuracy"].mean())
        if "top" not in self.conditions:
            return out
        for c in self.conditions:
            if c == "top":
                continue
            margins = [b.loc[("top", n), "mean"] - b.loc[(c, n), "mean"] for n in self.pairs]
            strict = [b.loc[("top", n), "min"] > b.loc[(c, n), "max"] for n in self.pairs]
            out[f"top_beats_{c}"] = bool(all(m > 0 for m in margins))
            out[f"margin_{c}"] = float(min(margins))
            out[f"top_worst_beats_{c}_best"] = bool(all(strict))
        return out

    def summary(self) -> str:
        """A few lines: the kept heads, mean (min-max) accuracy per condition and size, the verdict."""
        b = self.by_condition().set_index(["condition", "pairs"])
        ref = self.reference.set_index("pairs")
        conds = self.conditions
        cfg = self.settings.get("config", {})
        lines = [f"hybrid build from {self.teacher}: k = {self.k}, {self.settings.get('seeds')} seed(s), "
                 f"{cfg.get('steps')} steps, loss {cfg.get('loss')}; "
                 f"top heads {', '.join(self.ranking[:self.k]) or 'none'} ({self.source})"]
        for c in conds:
            kept = sorted(set(self.table.loc[self.table["condition"] == c, "kept"]))
            lines.append(f"  {c}: kept {' | '.join(k or '-' for k in kept)}")
        lines.append("pairs  teacher  top-only  " + "  ".join(f"{c:>19}" for c in conds))
        for n in self.pairs:
            cells = [f"{b.loc[(c, n), 'mean']:.3f} ({b.loc[(c, n), 'min']:.2f}-{b.loc[(c, n), 'max']:.2f})"
                     for c in conds]
            lines.append(f"{n:5d}  {ref.loc[n, 'teacher']:.3f}    {ref.loc[n, 'teacher_top_only']:.3f}     "
                         + "  ".join(f"{x:>19}" for x in cells))
        m = self.metrics
        for c in conds:
            if c != "top" and "top" in conds:
                lines.append(f"top beats {c} at every size: {'yes' if m[f'top_beats_{c}'] else 'NO'} (smallest mean "
                             f"margin {m[f'margin_{c}']:+.3f}; worst top seed above best {c} seed everywhere: "
                             f"{'yes' if m[f'top_worst_beats_{c}_best'] else 'no'})")
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def figure(self, title: str | None = None) -> Any:
        """KV accuracy vs dictionary size: per condition the mean over seeds (line) and the min-max band,
        each seed faint; the teacher, the teacher with only the top-k heads, and chance for reference."""
        import plotly.graph_objects as go

        fig = go.Figure()
        b = self.by_condition()
        for c in self.conditions:
            colour = _COLOURS[c]
            rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
            for s, one in self.table[self.table["condition"] == c].groupby("seed"):
                one = one.sort_values("pairs")
                fig.add_trace(go.Scatter(x=one["pairs"], y=one["accuracy"], mode="lines", showlegend=False,
                                         line=dict(color=f"rgba{rgb + (0.35,)}", width=1), name=f"{c} seed {s}",
                                         hovertemplate=f"{c} seed {s} (kept {one['kept'].iloc[0] or 'none'})<br>"
                                                       f"%{{x}} pairs: %{{y:.3f}}<extra></extra>"))
            one = b[b["condition"] == c]
            fig.add_trace(go.Scatter(x=list(one["pairs"]) + list(one["pairs"])[::-1],
                                     y=list(one["max"]) + list(one["min"])[::-1], fill="toself", mode="lines",
                                     fillcolor=f"rgba{rgb + (0.15,)}", line=dict(width=0), hoverinfo="skip",
                                     showlegend=False))
            fig.add_trace(go.Scatter(x=one["pairs"], y=one["mean"], mode="lines+markers",
                                     line=dict(color=colour, width=3),
                                     error_y=dict(type="data", array=one["std"], visible=True, thickness=1),
                                     name=_LABELS[c].format(k=self.k) + f" (mean ± sd, band min-max, "
                                                                        f"{int(one['seeds'].max())} seeds)"))
        ref = self.reference
        fig.add_trace(go.Scatter(x=ref["pairs"], y=ref["teacher"], mode="lines+markers", name="teacher (Transformer)",
                                 line=dict(color="#222222", dash="dash", width=2)))
        if self.k and ref["teacher_top_only"].notna().any():
            fig.add_trace(go.Scatter(x=ref["pairs"], y=ref["teacher_top_only"], mode="lines",
                                     name=f"teacher with only the top-{self.k} heads (untrained start)",
                                     line=dict(color=_COLOURS["top"], dash="dot", width=1.5)))
        fig.add_trace(go.Scatter(x=ref["pairs"], y=ref["chance"], mode="lines", name="chance (1/n)",
                                 line=dict(color="#aaaaaa", dash="dot", width=1)))
        fig.update_layout(title=title or f"Distilled hybrids of {self.teacher}: KV retrieval vs dictionary size",
                          template="plotly_white", height=520, xaxis_title="dictionary size (key:value lines)",
                          yaxis_title="accuracy", yaxis_range=[-0.02, 1.02],
                          legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
        fig.update_xaxes(tickvals=self.pairs, type="log")
        return fig

    def to_dict(self) -> dict[str, Any]:
        """The ``hybrid_build`` document's body: teacher, ranking, settings, students, metrics, the per-condition
        summary, the reference and the per-student rows (``table``, last)."""
        return {"teacher": self.teacher, "k": self.k, "pairs": self.pairs, "ranking": self.ranking,
                "source": self.source, "settings": self.settings, "students": self.students, "notes": self.notes,
                "seconds": round(self.seconds, 1), "metrics": self.metrics,
                "by_condition": self.by_condition().to_dict(orient="records"),
                "reference": self.reference.to_dict(orient="records"), "table": records(self.table)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "HybridBuild":
        """The result :meth:`to_dict` described."""
        return cls(d["teacher"], int(d["k"]), [int(n) for n in d["pairs"]], doc_table(d, COLUMNS),
                   pd.DataFrame(d["reference"]), list(d["ranking"]), d.get("source", ""),
                   dict(d.get("students") or {}), float(d.get("seconds") or 0.0), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write ``hybrid_build.csv``, ``hybrid_build.json``, ``report.html`` and the figure into the folder
        ``path`` (or the folder of ``path`` naming its ``hybrid_build.json``); return the folder. :meth:`load`
        reads the folder or the file."""
        cfg = self.settings.get("config", {})
        notes = [f"Teacher {self.teacher}; ranking: {self.source}.",
                 f"Students: Falcon-H1, Mamba-2 in every layer beside the kept attention heads "
                 f"(gna_interp.zoo.hybrid_build); {cfg.get('steps')} steps of {cfg.get('loss')} distillation, "
                 f"teacher parts {'trained' if cfg.get('train_teacher_parts') else 'frozen'}; "
                 f"{self.settings.get('samples')} prompts per size.", self.summary().splitlines()[-1]] + self.notes
        wide = self.by_condition()
        sections = [part("heading", "Accuracy by condition and dictionary size (over seeds)"), table_html(wide),
                    part("heading", "Reference"), table_html(self.reference),
                    part("heading", "Metrics"), part("pre", self.summary())]
        return self.folder(path).write(self.table, self.to_dict(), title=f"Hybrid build: {self.teacher}",
                                       figures={NAME: self.figure}, notes=notes, sections=sections, png=png)

    def _repr_html_(self) -> str:
        return part("lead", f"Hybrid build from {self.teacher}") + table_html(self.by_condition())

    def __repr__(self) -> str:
        m = self.metrics
        return (f"HybridBuild({self.teacher!r}, k={self.k}, conditions {self.conditions}, "
                + ", ".join(f"mean {c} {m[f'mean_{c}']:.3f}" for c in self.conditions) + ")")


def _reference(m: Model, top: list[HeadRef], pairs: list[int], samples: int) -> list[dict[str, Any]]:
    """Teacher intact and with only ``top`` kept, on the prompts :func:`evaluate_checkpoint` scores."""
    rows = []
    others = [h for h in m.heads() if is_attention(h) and h not in set(top)]
    for n in pairs:
        task = KVRetrieval(n, samples, seed=0, template="official", words=m.kv_words)
        runner = SetAblation(m, task, batch_size=32, replays=FORWARDS)
        full = runner.run([]).metrics
        only = runner.run(others).metrics["accuracy"] if top else math.nan
        rows.append({"pairs": n, "teacher": round(full["accuracy"], 4), "teacher_top_only": round(only, 4),
                     "chance": round(full["chance"], 4)})
    return rows


@options
class HybridBuildConfig(FolderOptions):
    """How :func:`hybrid_build` runs (the students' own build is a
    :class:`~gna_interp.zoo.hybrid_build.HybridConfig`).

    Attributes:
        conditions: ``top``, ``random`` and/or ``none``; seeds: students per condition (seeds ``0..N-1``).
        pairs: dictionary sizes measured; samples: prompts per size.
        scan: a ``gna scan`` folder or ``scan.json`` whose ranking gives the top heads (None: discovered).
        threads: torch CPU threads; log: where progress lines go.

    and the folder options of :class:`~gna_interp.experiments.options.FolderOptions` (``resume`` skips the
    finished students, ``fresh`` deletes them and starts over; ``png``).
    """

    conditions: Sequence[str] = CONDITIONS
    seeds: int = 3
    pairs: Sequence[int] = DEFAULT_EVAL_SIZES
    samples: int = 200
    scan: Any = None
    threads: int = 1
    log: Callable[[str], None] | None = print

    def validate(self) -> None:
        bad = [c for c in self.conditions if c not in CONDITIONS]
        if bad or not self.conditions:
            raise InputError(f"conditions {bad or 'none'}: choose from {', '.join(CONDITIONS)}")
        check_counts(self, {"seeds": 1, "samples": 1, "threads": 1})
        if not self.pairs or min(int(n) for n in self.pairs) < 2:
            raise InputError(f"pairs must be dictionary sizes >= 2, got {list(self.pairs)}")


def hybrid_build(teacher: Model | str = "zoo:transformer-kv", k: int = 2, *, out: str | os.PathLike,
                 config: HybridConfig | None = None, run: HybridBuildConfig | None = None,
                 **overrides: Any) -> HybridBuild:
    """Distil one student per condition (``top``, ``random``, ``none``) and seed ``0..seeds-1`` from
    ``teacher`` and measure each one's KV accuracy at every size of ``pairs`` (see the module docstring).

    ``config`` (:class:`~gna_interp.zoo.hybrid_build.HybridConfig`) sets the students' build, ``run``
    (:class:`HybridBuildConfig`) the experiment; keyword ``overrides`` adjust either by its field names.
    ``scan`` gives the ranking (default: discovered); ``out`` is required (every student is saved there,
    and a rerun with ``resume=True`` skips the finished ones).
    """
    run_names = HybridBuildConfig.field_names()
    opts = HybridBuildConfig.build(run, **{n: v for n, v in overrides.items() if n in run_names})
    overrides = {n: v for n, v in overrides.items() if n not in run_names}
    conds = list(dict.fromkeys(opts.conditions))
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        raise InputError(f"k must be an integer >= 0, got {k!r}")
    sizes = sorted(dict.fromkeys(int(n) for n in opts.pairs))
    cfg = HybridConfig.build(config, **overrides)
    folder = Path(out)
    cfolder = folder / CIRCUIT_DIR
    stale_files(folder, CKPT, opts.resume, opts.fresh, also=[folder / STUDENTS, cfolder / CIRCUIT_JSON,
                                                             cfolder / SCAN_CKPT])
    if opts.fresh:
        (folder / CKPT).unlink(missing_ok=True)
        if (folder / STUDENTS).is_dir():
            shutil.rmtree(folder / STUDENTS)
        if opts.scan is None and cfolder.is_dir():
            clear_circuit(cfolder)
    m = model_of(teacher)
    if m.kv_words is None:
        raise InputError(f"{m.name} has no zoo keys: hybrid_build distils zoo Transformers (e.g. zoo:transformer-kv)")
    attention = [h for h in m.heads() if is_attention(h)]
    if not attention:
        raise InputError(f"{m.name} has no attention heads: a retrieval-guided hybrid keeps a Transformer's attention "
                         f"heads; pass a zoo Transformer (e.g. zoo:transformer-kv)")
    if k > len(attention):
        raise InputError(f"k={k}: {m.name} has only {len(attention)} attention heads to keep")
    for n in sizes:
        KVRetrieval(n, 1, seed=0, words=m.kv_words)  # a size the key set cannot fill fails before any training
    start = time.perf_counter()
    if opts.scan is None:
        circ, _ = resolve_circuit(m, None, cfolder, Discovery(seed=0, k=max(k, 1), progress=False))
        ranking, source, _ = load_ranking(circ)
        source = f"gna scan's default discovery on the teacher, saved in {cfolder}: {source}"
    else:
        ranking, source, _ = load_ranking(opts.scan)
    ranking = m.check_heads(ranking)
    top = kept_heads("top", k, 0, ranking, m)
    plan = [(c, s, kept_heads(c, k, s, ranking, m)) for c in conds for s in range(opts.seeds)]
    settings = {"k": k, "conditions": conds, "seeds": opts.seeds, "samples": opts.samples, "pairs": sizes,
                "config": cfg.to_dict(), "threads": opts.threads}
    # what a student's numbers depend on (not how many seeds or which conditions: more of them resume)
    fp = fingerprint(m, {"k": k, "samples": opts.samples, "pairs": sizes, "config": cfg.to_dict(),
                         "top": [h.name for h in top]})
    points = Checkpoint(folder / CKPT, NAME, fp)
    if "reference" not in points.extra:
        points.extra["reference"] = _reference(m, top, sizes, opts.samples)
    points.save()
    students, rows = _students(m, plan, points, folder, opts, cfg, sizes, lambda c, s: _chosen_by(c, k, s, source))
    notes = []
    if k == 0 and len(conds) > 1:
        notes.append("k = 0: every condition keeps no heads (the conditions differ only in name)")
    result = HybridBuild(m.name, k, sizes, pd.DataFrame(rows, columns=COLUMNS), pd.DataFrame(points.extra["reference"]),
                         [h.name for h in ranking], source, students, time.perf_counter() - start, settings=settings,
                         notes=notes)
    result.save(folder, png=opts.png)
    return result


def _students(m: Model, plan: list[tuple[str, int, list[HeadRef]]], points: Checkpoint, folder: Path,
              opts: HybridBuildConfig, cfg: HybridConfig, sizes: list[int], chosen_by: Callable[[str, int], str]
              ) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Build (or find in ``points``) the student of every ``(condition, seed, heads)`` of ``plan``; their folders and
    the table's rows. ``chosen_by(condition, seed)``: what a student's card says chose its heads. A student recorded
    in ``points`` whose folder has no ``card.json`` (deleted, or its build cut short) is built again."""
    say = opts.log or (lambda _msg: None)

    def build(i: int, c: str, s: int, heads: list[HeadRef], where: Path) -> dict[str, Any]:
        if where.exists():
            shutil.rmtree(where)  # an interrupted build of this student: start it again
        say(f"[{i + 1}/{len(plan)}] {c} seed {s}: keeps {', '.join(h.name for h in heads) or 'no heads'}")
        card = build_hybrid(m, heads, where, seed=s, config=cfg, name=f"hybrid-{c}-s{s}", chosen_by=chosen_by(c, s),
                            run=TrainingRun(eval_sizes=sizes, eval_samples=opts.samples, threads=opts.threads,
                                            log=opts.log)).card
        return {"kept": [h.name for h in heads], "by_pairs": card["evaluation"]["by_pairs"],
                "final_loss": card["training"]["final_loss"], "train_seconds": card["training"]["wall_seconds"]}

    students = {f"{c}/{s}": folder / STUDENTS / f"{c}-s{s}" for c, s, _ in plan}
    for key, where in students.items():
        if key in points and not (where / CARD_JSON).is_file():
            points.drop(key)
    run_points(points, [Point(f"{c}/{s}", partial(build, i, c, s, heads, students[f"{c}/{s}"]))
                        for i, (c, s, heads) in enumerate(plan)], "hybrid build", progress=False)
    rows: list[dict[str, Any]] = []
    for c, s, _ in plan:
        p = points[f"{c}/{s}"]
        for n in sizes:
            e = p["by_pairs"][str(n)]
            rows.append({"condition": c, "seed": s, "k": len(p["kept"]), "kept": ",".join(p["kept"]), "pairs": n,
                         "accuracy": e["accuracy"], "logit_diff": e["logit_diff"], "gold_prob": e["gold_prob"],
                         "chance": e["chance"], "n_samples": opts.samples, "final_loss": p["final_loss"],
                         "train_seconds": p["train_seconds"]})
    return {k: str(v) for k, v in students.items()}, rows


def _chosen_by(condition: str, k: int, seed: int, source: str) -> str:
    if condition == "top":
        return f"the top {k} attention heads of the teacher's KV ranking ({source})"
    if condition == "random":
        return f"{k} attention heads drawn at random (seed {seed}, random_heads)"
    return "none (no attention head kept)"

