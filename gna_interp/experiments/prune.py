"""`prune`: layer pruning on a retrieval task and a knowledge task side by side, and head-keeping tables.

The paper's pruning evidence: cut a model's last layers and retrieval (KV, multiple-choice *letters*)
survives as long as the G&A heads do, while knowledge (the same questions scored on the option texts,
*cloze*) fades with the layers that store it; keep every head of layers ``0..A`` and only the G&A heads
of layers ``A+1..B`` and retrieval stays, remove one of those heads and it falls to chance.

- **gradual from the end** (``from_end``): the last ``k`` blocks removed, ``k = 0..n_layers``;
- **individual** (``single``): one block removed (and put back), for every block;
- **head keeping** (``keep_layers`` ``0-A`` and ``keep_heads``): rows ``intact``; ``layers 0-B`` (the
  blocks after ``B``, the last layer of a kept head, removed); ``layers 0-A``; ``layers 0-A + HEADS``
  (blocks ``A+1..B`` keep only the listed heads: every other head of theirs is zero-ablated, their MLPs
  stay; later blocks removed); the same *without* each listed head in turn; and, per seed, the same
  number of *random* heads of those layers kept instead.

A removed block passes its input on unchanged (:class:`~gna_interp.interventions.LayerSkip`), heads are
zero-ablated (:class:`~gna_interp.interventions.HeadAblation`), both run by a
:class:`~gna_interp.engine.replay.PlanRunner` of full forwards; the curves are the points of
:func:`~gna_interp.circuits.search.prune.prune_curve` (same columns, same scoring), measured one point at a time
so that a long run is checkpointed point by point.

Tasks (``tasks``): ``kv`` (KV retrieval), ``mc`` (multiple choice scored on the letters, or the
``stated`` form) and ``cloze`` (the same questions scored on the option texts: the knowledge twin).
Each is checked on the intact model first: a task the model cannot tokenize is left out, and so is a
task the intact model does not solve (accuracy within two standard errors, at least 0.05, of chance --
the :class:`~gna_interp.tasks.calibration.ChanceVerdict` every experiment uses), unless ``allow_chance``; the notes give the
numbers. With no task left the run is refused.
"""

from __future__ import annotations

import functools
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pandas as pd

from gna_interp.constants import KEEP_CSV
from gna_interp.circuits.search.prune import COLUMNS as CURVE_COLUMNS
from gna_interp.errors import HeadError, InputError
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.experiments.run import Point, model_of, open_folder, run_points
from gna_interp.interventions.ablation import HeadAblation
from gna_interp.interventions.layers import LayerSkip, check_layers
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import check_counts, options
from gna_interp.store import records
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import ChanceVerdict
from gna_interp.tasks.choice import check_knobs
from gna_interp.tasks.options import TaskOptions
from gna_interp.engine.replay import FORWARDS, PlanRunner
from gna_interp.engine.plan import ScoringPlan, plan_scoring
from gna_interp.viz.html import part

TASKS: tuple[str, ...] = ("kv", "mc", "cloze")
MODES: tuple[str, ...] = ("from_end", "single")
COLUMNS = CURVE_COLUMNS + ["task_kind"]
KEEP_COLUMNS = ["row", "series", "seed", "kept_heads", "skipped", "n_ablated", "task", "task_kind", "accuracy",
                "logit_diff", "chance", "n_samples"]
CHECKPOINT = "prune.ckpt.json"
_METRICS = ("accuracy", "logit_diff", "gold_prob", "chance", "n_samples")
_PALETTE = ("#2c7fb8", "#c0392b", "#27ae60", "#8e44ad", "#e67e22", "#16a085")

__all__ = ["COLUMNS", "KEEP_COLUMNS", "MODES", "TASKS", "PruneConfig", "PruneResult", "build_tasks", "keep_rows", "parse_keep_layers",
           "prune", "prune_figure"]


# ---- tasks -------------------------------------------------------------------------------------------

def build_tasks(model: Model, tasks: Sequence[str] = TASKS,
                options: TaskOptions | None = None) -> tuple[dict[str, tuple[Task, str]], list[str]]:
    """``{name: (task, kind)}`` (kind ``retrieval`` or ``knowledge``) for the requested ``tasks``, built from
    ``options`` (default :class:`~gna_interp.tasks.options.TaskOptions`), and notes on those that cannot be
    built or tokenized for ``model`` (left out)."""
    opts = options if options is not None else TaskOptions()
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise InputError(f"unknown task(s) {unknown or list(tasks)}; choose from {', '.join(TASKS)}")
    if opts.mc_form not in ("letters", "stated"):
        raise InputError(f"mc_form must be 'letters' or 'stated', got {opts.mc_form!r}")
    out: dict[str, tuple[Task, str]] = {}
    notes: list[str] = []
    if "kv" in tasks:
        t = opts.kv(model.kv_words)
        out[t.name] = (t, "retrieval")
    if "mc" in tasks or "cloze" in tasks:
        pool = opts.question_pool()
        for which, fmt, kind in (("mc", opts.mc_form, "retrieval"), ("cloze", "cloze", "knowledge")):
            if which not in tasks:
                continue
            try:
                t = opts.multiple_choice(pool, fmt)
            except InputError as e:
                notes.append(f"{which} ({fmt}) left out: {e}")
                continue
            out[t.name] = (t, kind)
    return out, notes


def chance_note(name: str, metrics: Mapping[str, Any]) -> tuple[bool, str]:
    """Whether the intact ``metrics`` of task ``name`` are near chance
    (:class:`~gna_interp.tasks.calibration.ChanceVerdict`) and a sentence with the numbers."""
    v = ChanceVerdict(name, metrics["accuracy"], metrics["chance"], int(metrics["n_samples"]))
    return v.near_chance, (f"{name}: intact accuracy {v.accuracy:.3f} ({v.n} samples), chance {v.chance:.3f}, margin "
                           f"{v.margin:.3f}" + (" -- NEAR CHANCE" if v.near_chance else ""))


# ---- head keeping ------------------------------------------------------------------------------------

def parse_keep_layers(value: int | str | Sequence[int] | None) -> int | None:
    """``A`` from ``"0-A"``, ``"A"``, ``A`` or ``(0, A)`` (layers ``0..A`` keep every head); None stays None."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InputError(f"keep_layers must be '0-A' or an integer A, got {value!r}")
    if isinstance(value, int):
        last = value
    elif isinstance(value, str):
        text = value.strip()
        first, sep, rest = text.partition("-")
        try:
            start, last = (int(first), int(rest)) if sep else (0, int(first))
        except ValueError:
            raise InputError(f"keep layers {value!r} must be written 0-A (e.g. 0-15: every head of layers 0..15 "
                             f"kept)") from None
        if start != 0:
            raise InputError(f"keep layers {value!r} must start at layer 0 (0-A): the kept layers are 0..A")
    else:
        seq = list(value)
        if len(seq) != 2 or seq[0] != 0:
            raise InputError(f"keep_layers must be (0, A), got {value!r}")
        last = int(seq[1])
    if last < 0:
        raise InputError(f"keep layers 0-{last}: A must be >= 0")
    return last


def _units(model: Model, layers: Sequence[int]) -> list[HeadRef]:
    """Every single unit (head or channel) of ``layers``."""
    return model.heads(layers=layers)


def _overlaps(h: HeadRef, kept: Sequence[HeadRef]) -> bool:
    return any(h.layer == k.layer and h.kind == k.kind and set(h.channels) & set(k.channels) for k in kept)


def keep_rows(model: Model, keep_layers: int | str | Sequence[int] | None,
              keep_heads: Sequence[HeadRef | str] | str | None, seeds: int = 3) -> list[dict[str, Any]]:
    """The rows of the head-keeping table: ``{row, series, seed, kept_heads, skipped, ablated}`` with
    ``skipped`` the removed blocks and ``ablated`` the zero-ablated heads (module doc for the rows)."""
    n = model.n_layers
    a = parse_keep_layers(keep_layers)
    heads = model.check_heads(keep_heads) if keep_heads is not None else []
    if a is None and not heads:
        return []
    if a is not None and a >= n:
        raise InputError(f"keep layers 0-{a}: {model.name} has layers 0..{n - 1}")
    if a is None:
        a = min(h.layer for h in heads) - 1
    early = [h.name for h in heads if h.layer <= a]
    if early:
        raise InputError(f"kept heads {early} lie in layers 0-{a}, which keep every head anyway; list heads of "
                         f"layers after {a}")
    dup = [h.name for h in heads if _overlaps(h, [k for k in heads if k != h])]
    if dup:
        raise HeadError(f"kept heads {dup} overlap one another")
    rows: list[dict[str, Any]] = [{"row": "intact", "series": "intact", "seed": -1, "kept_heads": "", "skipped": [],
                                   "ablated": []}]
    if not heads:
        if a < n - 1:
            rows.append({"row": f"layers 0-{a}", "series": "pruned", "seed": -1, "kept_heads": "",
                         "skipped": list(range(a + 1, n)), "ablated": []})
        return rows
    b = max(h.layer for h in heads)
    whole = f"layers 0-{a}" if a >= 0 else "no whole layer"
    middle = list(range(a + 1, b + 1))
    after = list(range(b + 1, n))
    names = ",".join(h.name for h in heads)
    if after:
        rows.append({"row": f"layers 0-{b}", "series": "pruned", "seed": -1, "kept_heads": "", "skipped": after,
                     "ablated": []})
    rows.append({"row": whole, "series": "pruned", "seed": -1, "kept_heads": "",
                 "skipped": list(range(a + 1, n)), "ablated": []})
    others = [u for u in _units(model, middle) if not _overlaps(u, heads)]
    kept_label = f"{whole} + {names}"
    rows.append({"row": kept_label, "series": "kept", "seed": -1, "kept_heads": names, "skipped": after,
                 "ablated": others})
    for h in heads:
        rest = [k for k in heads if k != h]
        rows.append({"row": f"{kept_label} without {h.name}", "series": "without", "seed": -1,
                     "kept_heads": ",".join(k.name for k in rest), "skipped": after,
                     "ablated": [u for u in _units(model, middle) if not _overlaps(u, rest)]})
    for s in range(seeds):
        rng = random.Random(f"gna-prune-keep-{s}")
        drawn: list[HeadRef] = []
        for h in heads:
            pool = [u for u in model.heads(h.kind, channel_group=h.width, layers=[h.layer])
                    if u.width == h.width and not _overlaps(u, heads) and not _overlaps(u, drawn)]
            if not pool:
                raise InputError(f"layer {h.layer} has no other {h.kind} head to keep at random instead of {h.name}; "
                                 f"use keep_seeds=0")
            drawn.append(rng.choice(pool))
        rows.append({"row": f"{whole} + {len(drawn)} random heads (seed {s})", "series": "random", "seed": s,
                     "kept_heads": ",".join(d.name for d in drawn), "skipped": after,
                     "ablated": [u for u in _units(model, middle) if not _overlaps(u, drawn)]})
    return rows


# ---- result ------------------------------------------------------------------------------------------

@dataclass
class PruneResult(ExperimentResult, format="prune"):
    """What :func:`prune` measured: a folder result (:meth:`save` / :meth:`load`) with a figure (:meth:`figure`,
    :meth:`plot`; :meth:`keep_figure` the head-keeping bars).

    Attributes:
        model: the model's name.
        frame: the pruning curves, columns :data:`COLUMNS` (``mode`` ``from_end`` or ``single``; the intact
            model is ``k = 0`` / ``layer = -1`` of each mode).
        keep: the head-keeping table, columns :data:`KEEP_COLUMNS` (empty when not asked for).
        tasks: per task name: ``kind`` (retrieval / knowledge), ``chance``, ``intact`` accuracy and the task
            itself (``Task.to_dict``).
        n_layers: blocks of the model.
        settings: the options the run used; notes: the task checks and anything left out.
    """

    model: str
    frame: pd.DataFrame
    keep: pd.DataFrame
    tasks: dict[str, dict[str, Any]]
    n_layers: int

    def to_frame(self) -> pd.DataFrame:
        """The pruning curves (columns :data:`COLUMNS`)."""
        return self.frame.copy()

    def curve(self, task: str, mode: str = "from_end") -> pd.Series:
        """Accuracy of ``task`` per point of ``mode`` (indexed by ``k`` for ``from_end``, ``layer`` for ``single``)."""
        df = self.frame[(self.frame["task"] == task) & (self.frame["mode"] == mode)]
        return df.set_index("k" if mode == "from_end" else "layer")["accuracy"]

    @property
    def metrics(self) -> dict[str, Any]:
        """Per task: intact accuracy, chance, and the fewest last blocks whose removal brings it to chance
        (``{task}_blocks_to_chance``; None when it never gets there or ``from_end`` was not run)."""
        out: dict[str, Any] = {}
        for name, t in self.tasks.items():
            out[f"{name}_intact"] = t["intact"]
            out[f"{name}_chance"] = t["chance"]
            c = self.curve(name) if "from_end" in set(self.frame["mode"]) else pd.Series(dtype=float)
            hit = [int(k) for k, v in c.items() if ChanceVerdict(name, v, t["chance"], t["n_samples"]).near_chance]
            out[f"{name}_blocks_to_chance"] = min(hit) if hit else None
        return out

    def summary(self) -> str:
        """A few lines per task and the head-keeping table."""
        lines = [f"pruning {self.model} ({self.n_layers} blocks)"] + [f"  {n}" for n in self.notes]
        m = self.metrics
        for name, t in self.tasks.items():
            lines.append(f"{name} ({t['kind']}): intact {t['intact']:.3f}, chance {t['chance']:.3f}")
            if "from_end" in set(self.frame["mode"]):
                c = self.curve(name)
                pts = ", ".join(f"{int(k)}: {v:.2f}" for k, v in c.items())
                lines.append(f"  last k blocks removed -> accuracy  {pts}")
                k = m[f"{name}_blocks_to_chance"]
                lines.append(f"  at chance from k = {k}" if k is not None else "  never at chance")
            if "single" in set(self.frame["mode"]):
                c = self.curve(name, "single").drop(-1, errors="ignore")
                if len(c):
                    worst = c.nsmallest(3)
                    lines.append("  one block removed, the worst: " + ", ".join(f"layer {int(k)} -> {v:.2f}"
                                                                               for k, v in worst.items()))
        if len(self.keep):
            lines.append("head keeping (accuracy per task):")
            piv = self.keep_table()
            for row, vals in piv.iterrows():
                lines.append(f"  {row}: " + ", ".join(f"{t} {v:.3f}" for t, v in vals.items()))
        return "\n".join(lines)

    def keep_table(self) -> pd.DataFrame:
        """The head-keeping table as rows x tasks of accuracy (rows in their order)."""
        if self.keep.empty:
            return pd.DataFrame()
        order = list(dict.fromkeys(self.keep["row"]))
        return self.keep.pivot_table(index="row", columns="task", values="accuracy", sort=False).reindex(order)

    def figure(self) -> Any:
        """The pruning curves (:func:`prune_figure`)."""
        return prune_figure(self)

    def keep_figure(self) -> Any | None:
        """Grouped bars of the head-keeping table (None when there is none)."""
        if self.keep.empty:
            return None
        import plotly.graph_objects as go

        fig = go.Figure()
        for i, (name, t) in enumerate(self.tasks.items()):
            part = self.keep[self.keep["task"] == name]
            fig.add_trace(go.Bar(x=part["row"], y=part["accuracy"], name=f"{name} ({t['kind']})",
                                 marker_color=_PALETTE[i % len(_PALETTE)], hovertext=part["kept_heads"]))
            fig.add_hline(y=t["chance"], line=dict(color=_PALETTE[i % len(_PALETTE)], dash="dash", width=1))
        fig.update_layout(barmode="group", title=dict(text=f"Head keeping on {self.model} (dashed: chance)"),
                          showlegend=True,
                          yaxis=dict(title="accuracy", range=[0, 1.05]), height=480, template="plotly_white",
                          legend=dict(orientation="h", yanchor="bottom", y=1.0, x=0), margin=dict(b=160))
        return fig

    def to_dict(self) -> dict[str, Any]:
        """The ``prune`` document's body: tasks, settings, notes, metrics, the head-keeping rows and the curves
        (``table``, last)."""
        return {"model": self.model, "n_layers": self.n_layers, "tasks": self.tasks, "settings": self.settings,
                "notes": self.notes, "metrics": self.metrics,
                "keep": self.keep.to_dict(orient="records"), "table": records(self.frame)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PruneResult":
        """The result :meth:`to_dict` described."""
        return cls(d["model"], doc_table(d, COLUMNS), pd.DataFrame(d.get("keep") or [], columns=KEEP_COLUMNS),
                   dict(d["tasks"]), int(d["n_layers"]), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write ``prune.csv`` (curves), ``keep.csv`` (head keeping, when asked), ``prune.json``,
        ``report.html`` and ``figures/*.png`` into the folder ``path`` (or the folder of ``path`` naming its
        ``prune.json``); return the folder. :meth:`load` reads the folder or the file."""
        from gna_interp.store import atomic_write

        folder = self.folder(path)
        figures: dict[str, Any] = {"prune": self.figure}
        sections: list[str] = []
        kf = self.keep_figure()
        if kf is not None:
            figures["keep"] = kf
            piv = self.keep_table().reset_index()
            sections = [part("heading", "Head keeping"), table_html(piv)]
            atomic_write(folder.path / KEEP_CSV, self.keep.to_csv(index=False))
        return folder.write(self.frame, self.to_dict(), title=f"Layer pruning: {self.model}", figures=figures,
                            notes=self.summary().splitlines(), sections=sections, png=png)

    def _repr_html_(self) -> str:  # offline: the summary (``.figure()`` displays the curves)
        return part("pre", self.summary())


def prune_figure(result: PruneResult) -> Any:
    """Plotly: accuracy vs last blocks removed (one line per task, chance dashed in the task's colour) and,
    when measured, accuracy with each single block removed."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    modes = [m for m in MODES if m in set(result.frame["mode"])]
    titles = {"from_end": "last k blocks removed", "single": "one block removed (and put back)"}
    fig = make_subplots(rows=1, cols=len(modes), subplot_titles=[titles[m] for m in modes], horizontal_spacing=0.08)
    for col, mode in enumerate(modes, start=1):
        for i, (name, t) in enumerate(result.tasks.items()):
            color = _PALETTE[i % len(_PALETTE)]
            c = result.curve(name, mode)
            if mode == "single":
                c = c.drop(-1, errors="ignore")
            fig.add_trace(go.Scatter(x=list(c.index), y=list(c.values), mode="lines+markers", line=dict(color=color),
                                     name=f"{name} ({t['kind']})", legendgroup=name, showlegend=col == 1),
                          row=1, col=col)
            fig.add_hline(y=t["chance"], line=dict(color=color, dash="dash", width=1), row=1, col=col)
            if mode == "single":
                fig.add_hline(y=t["intact"], line=dict(color=color, dash="dot", width=1), row=1, col=col)
        fig.update_xaxes(title_text="k (last blocks removed)" if mode == "from_end" else "block removed",
                         dtick=1 if result.n_layers <= 32 else None, row=1, col=col)
        single = result.frame[(result.frame["mode"] == "single") & (result.frame["layer"] >= 0)]
        if mode == "single" and single["skipped_kinds"].nunique() > 1:  # a hybrid: name each block's mixer
            ticks = single.drop_duplicates("layer")
            fig.update_xaxes(tickvals=list(ticks["layer"]),
                             ticktext=[f"{int(r.layer)}<br>{r.skipped_kinds}" for r in ticks.itertuples()],
                             row=1, col=col)
        fig.update_yaxes(title_text="accuracy", range=[0, 1.05], row=1, col=col)
    fig.update_layout(title=dict(text=f"Layer pruning on {result.model}: accuracy per task (dashed: chance"
                                      + ("; dotted: intact" if "single" in modes else "") + ")"),
                      height=460, template="plotly_white", legend=dict(orientation="h", yanchor="bottom", y=-0.35, x=0))
    return fig


# ---- the experiment ------------------------------------------------------------------------------------

def _evaluate(model: Model, plans: Mapping[str, ScoringPlan], skipped: Sequence[int], ablated: Sequence[HeadRef],
              batch_size: int) -> dict[str, dict[str, float]]:
    """Metrics of every task with blocks ``skipped`` and heads ``ablated`` (full forwards, the model restored after
    each)."""
    values = [LayerSkip(tuple(skipped)), HeadAblation(tuple(ablated))]
    out = {}
    for name, plan in plans.items():
        m = PlanRunner(model, plan, batch_size=batch_size, replays=FORWARDS).run_under(values).metrics
        out[name] = {c: m[c] for c in _METRICS}
    return out


def _names(v: Any, what: str) -> list[str]:
    if isinstance(v, str):
        v = [p.strip() for p in v.split(",") if p.strip()]
    out = list(v)
    if not out:
        raise InputError(f"no {what} given")
    return out


@options
class PruneConfig(TaskOptions, RunOptions):
    """How :func:`prune` runs: the task knobs of :class:`~gna_interp.tasks.options.TaskOptions` (``pairs``,
    ``samples``, ``max_value``, ``seed``, ``questions``, ``shots``, ``mc_form``) and

    Attributes:
        tasks: any of ``kv``, ``mc``, ``cloze`` (list or comma-separated).
        modes: ``from_end`` and/or ``single``; ks: the ``from_end`` points (default ``0..n_layers``);
            layers: the ``single`` blocks (default all).
        keep_layers: the head-keeping table's fully kept layers (``"0-15"``); no table when neither it nor
            ``keep_heads`` is given.
        keep_heads: the only heads kept after them (``"L16H0,L17H2"``); keep_seeds: random draws of the table.
        allow_chance: keep tasks the intact model does not solve (left out otherwise).

    and the run options of :class:`~gna_interp.experiments.options.RunOptions` (``batch_size``, ``resume``,
    ``fresh``, ``progress``, ``png``).
    """

    tasks: Sequence[str] | str = TASKS
    modes: Sequence[str] | str = MODES
    ks: Sequence[int] | None = None
    layers: Sequence[int] | None = None
    keep_layers: int | str | Sequence[int] | None = None
    keep_heads: Sequence[HeadRef | str] | str | None = None
    keep_seeds: int = 3
    allow_chance: bool = False

    def validate(self) -> None:
        check_counts(self, {"samples": 1, "pairs": 2, "keep_seeds": 0, "batch_size": 1, "shots": 0})
        tasks = _names(self.tasks, "tasks")
        unknown = [t for t in tasks if t not in TASKS]
        if unknown:
            raise InputError(f"unknown task(s) {unknown}; choose from {', '.join(TASKS)}")
        bad = [m for m in _names(self.modes, "modes") if m not in MODES]
        if bad:
            raise InputError(f"unknown prune mode(s) {bad}; choose from {', '.join(MODES)}")
        check_knobs(self, kv="kv" in tasks, questions="mc" in tasks or "cloze" in tasks)
        parse_keep_layers(self.keep_layers)


def prune(model: Model | str, out: str | os.PathLike | None = None, config: PruneConfig | None = None,
          **overrides: Any) -> PruneResult:
    """Layer pruning curves and head-keeping tables of ``model`` on retrieval and knowledge tasks (module doc).

    Args:
        model: a loaded :class:`Model` or a model spec.
        out: folder for ``prune.csv``, ``keep.csv``, ``prune.json``, ``report.html``, ``figures/``; points
            are checkpointed in ``out/prune.ckpt.json`` as they finish.
        config: a :class:`PruneConfig`; keyword ``overrides`` of its fields (``tasks="kv"``, ``pairs=20``, ...).
    """
    cfg = PruneConfig.build(config, **overrides)
    model = model_of(model)
    modes = _names(cfg.modes, "modes")
    from_end, single, keeps = _plan(model, cfg, modes)
    folder = Path(out) if out is not None else None
    open_folder(folder, CHECKPOINT, cfg)
    built, notes = build_tasks(model, _names(cfg.tasks, "tasks"), cfg.task_options())
    plans: dict[str, ScoringPlan] = {}
    for name, (t, _) in built.items():
        try:
            plans[name] = plan_scoring(model, t.samples)
        except InputError as e:
            notes.append(f"{name} left out: {model.name} cannot score it ({e})")
    if not plans:
        raise InputError(f"no task can be scored on {model.name}: " + "; ".join(notes))
    settings = {"model": model.name, "tasks": {k: built[k][0].to_dict() for k in plans}, "modes": modes,
                "from_end": from_end, "single": single, "allow_chance": cfg.allow_chance, "batch_size": cfg.batch_size,
                "keep": [[r["row"], r["kept_heads"], r["skipped"], len(r["ablated"])] for r in keeps]}
    log = Checkpoint(folder / CHECKPOINT if folder is not None else None, "prune", fingerprint(model, settings))
    started = time.perf_counter()
    run_points(log, [Point("intact", functools.partial(_evaluate, model, plans, [], [], cfg.batch_size))],
               "prune intact", cfg.progress)
    info = _solved(model, built, plans, log["intact"], cfg.allow_chance, notes)
    n = model.n_layers
    points = [(f"from_end:{k}", list(range(n - k, n)), []) for k in from_end]
    points += [(f"single:{layer}", [layer], []) for layer in single]
    points += [(f"keep:{i}", r["skipped"], r["ablated"]) for i, r in enumerate(keeps) if i > 0]
    run_points(log, [Point(key, functools.partial(_evaluate, model, plans, skipped, ablated, cfg.batch_size))
                     for key, skipped, ablated in points], "prune", cfg.progress)
    frame = _curve_frame(model, log, plans, info, modes, from_end, single)
    keep_records = [{"row": r["row"], "series": r["series"], "seed": r["seed"], "kept_heads": r["kept_heads"],
                     "skipped": ",".join(map(str, r["skipped"])), "n_ablated": len(r["ablated"]), "task": name,
                     "task_kind": info[name]["kind"], **{c: log["intact" if i == 0 else f"keep:{i}"][name][c]
                                                         for c in ("accuracy", "logit_diff", "chance", "n_samples")}}
                    for i, r in enumerate(keeps) for name in plans]
    settings_out = {**{k: v for k, v in settings.items() if k not in ("tasks", "keep")}, "pairs": cfg.pairs,
                    "samples": cfg.samples, "max_value": cfg.max_value, "seed": cfg.seed, "questions": cfg.questions,
                    "shots": cfg.shots,
                    "mc_form": cfg.mc_form, "keep_layers": parse_keep_layers(cfg.keep_layers),
                    "keep_heads": [h.name for h in model.check_heads(cfg.keep_heads)] if cfg.keep_heads else [],
                    "keep_seeds": cfg.keep_seeds, "seconds": round(time.perf_counter() - started, 2)}
    result = PruneResult(model.name, frame[COLUMNS], pd.DataFrame(keep_records, columns=KEEP_COLUMNS), info, n,
                         settings=settings_out, notes=notes)
    if folder is not None:
        result.save(folder, png=cfg.png)
    return result


def _plan(model: Model, cfg: PruneConfig, modes: list[str]) -> tuple[list[int], list[int], list[dict[str, Any]]]:
    """The ``from_end`` points, the ``single`` blocks and the head-keeping rows of a run, checked against ``model``."""
    n = model.n_layers
    if cfg.ks is not None and "from_end" not in modes:
        raise InputError("ks are points of the from_end mode, which is not among the modes")
    if cfg.layers is not None and "single" not in modes:
        raise InputError("layers are points of the single mode, which is not among the modes")
    from_end = sorted(set(range(n + 1) if cfg.ks is None else cfg.ks) - {0}) if "from_end" in modes else []
    bad_k = [k for k in from_end if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n]
    if bad_k:
        raise InputError(f"ks must be integers in 0..{n} (blocks of {model.name}), got {bad_k}")
    single = (list(range(n)) if cfg.layers is None else check_layers(model, cfg.layers)) if "single" in modes else []
    return from_end, single, keep_rows(model, cfg.keep_layers, cfg.keep_heads, cfg.keep_seeds)


def _solved(model: Model, built: Mapping[str, tuple[Task, str]], plans: dict[str, ScoringPlan],
            intact: Mapping[str, Any], allow_chance: bool, notes: list[str]) -> dict[str, dict[str, Any]]:
    """The tasks kept (``plans`` loses those the intact model does not solve, unless ``allow_chance``), with their
    kind, chance, intact accuracy, samples and task document; a note per task."""
    info: dict[str, dict[str, Any]] = {}
    for name in list(plans):
        m = intact[name]
        near, line = chance_note(name, m)
        if near and not allow_chance:
            notes.append(line + ": left out (the intact model does not solve it; allow_chance keeps it)")
            del plans[name]
            continue
        notes.append(line)
        t, kind = built[name]
        info[name] = {"kind": kind, "chance": m["chance"], "intact": m["accuracy"], "n_samples": int(m["n_samples"]),
                      "task": t.to_dict()}
    if not plans:
        raise InputError(f"{model.name} solves none of the tasks, so pruning cannot show what it keeps: "
                         + "; ".join(notes) + ". Use easier tasks (fewer --pairs, --mc-form stated) or --allow-chance")
    return info


def _curve_frame(model: Model, done: Checkpoint, plans: Mapping[str, ScoringPlan], info: Mapping[str, Any],
                 modes: list[str], from_end: list[int], single: list[int]) -> pd.DataFrame:
    """The pruning curves' table (one row per mode, point and task) with the drops from intact."""
    n, kinds = model.n_layers, model.layer_kinds()
    records = []
    for mode, keys in (("from_end", [0] + from_end), ("single", [-1] + single)):
        if mode not in modes:
            continue
        for k in keys:
            if mode == "from_end":
                key, skipped, n_removed, layer = ("intact" if k == 0 else f"from_end:{k}"), list(range(n - k, n)), k, -1
            else:
                key, skipped, n_removed, layer = ("intact" if k == -1 else f"single:{k}"), ([] if k == -1 else [k]), \
                    int(k != -1), k
            for name in plans:
                m = done[key][name]
                records.append({"mode": mode, "k": n_removed, "layer": layer, "skipped": ",".join(map(str, skipped)),
                                "skipped_kinds": ",".join(sorted({kinds[i] for i in skipped})), "task": name,
                                **{c: m[c] for c in _METRICS}, "task_kind": info[name]["kind"]})
    frame = pd.DataFrame(records)
    frame["accuracy_drop"] = frame["task"].map({k: v["intact"] for k, v in info.items()}) - frame["accuracy"]
    base_ld = {name: done["intact"][name]["logit_diff"] for name in plans}
    frame["logit_diff_drop"] = frame["task"].map(base_ld) - frame["logit_diff"]
    return frame
