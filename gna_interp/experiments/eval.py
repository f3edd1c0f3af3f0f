"""`eval_heads`: standard benchmarks (lm-evaluation-harness) with heads removed -- the paper's table.

The paper's evidence that G&A heads are a retrieval bottleneck and not generic machinery: remove a
handful of them and MMLU (letter answers: retrieval of the right option) falls to chance while knowledge
benchmarks barely move; remove as many random heads and nothing happens. :func:`eval_heads` runs that
comparison on any benchmark lm-eval knows (``mmlu``, ``gsm8k``, ``lambada_openai``, ``bbh``, the shipped
offline tasks ``gna_kv_mc`` and ``gna_kv_gen`` of :mod:`~gna_interp.experiments.eval_tasks`, a local YAML
task), one lm-eval run per *condition*, each through :class:`~gna_interp.experiments.harness.GnaLM`:

=============  =====================================================================================
condition      heads ablated in every forward
=============  =====================================================================================
``intact``     none
``removed``    the given heads, or a circuit's ``top_k`` best-ranked heads (``gna scan``); with
               neither, the circuit is discovered first on KV retrieval (``gna scan``'s defaults)
``random``     ``random_k`` heads (default: as many as removed) drawn at random, once per seed, from the
               scanned heads (the model's heads when no circuit is given) other than the removed ones;
               seed ``s`` takes the first ``random_k`` heads of the order the scan's ablation curve uses
               for its random draw ``s``
=============  =====================================================================================

Output (``out=DIR``, :class:`~gna_interp.experiments.output.ResultFolder` ``eval``):

=======================  ========================================================================
``eval.csv``             one row per condition, seed, task and metric: ``condition, seed, task,
                         metric, filter, value, stderr, n_samples, higher_is_better, n_heads, heads``
``eval_summary.csv``     the paper's table, one row per task and metric: ``intact``, ``removed``
                         (each with its lm-eval standard error ``*_stderr``), ``random_mean``,
                         ``random_std`` (spread over seeds), ``random_min``, ``random_max``,
                         ``random_stderr`` (mean of the seeds' standard errors), ``random_seeds``
``eval.json``            settings, heads, both tables (format ``eval``)
``report.html``          the bar chart and the table; ``figures/eval.png`` where export works
``conditions/*.json``    each finished condition's lm-eval metrics, a
                         :class:`~gna_interp.experiments.checkpoint.Checkpoint` fingerprinted by the model
                         and what the condition depends on (its heads, tasks, limit, few-shot, method, ...);
                         kept after the run: a rerun with ``resume=True`` skips the conditions made with
                         the same settings and refuses one made with others, ``fresh=True`` deletes them
``circuit/``             the circuit discovered when neither heads nor a circuit were given
=======================  ========================================================================
"""

from __future__ import annotations

import difflib
import functools
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
from gna_interp.progress import tqdm

from gna_interp.constants import EVAL_SUMMARY_CSV
from gna_interp.errors import InputError
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ExperimentResult, doc_table, table_html
from gna_interp.experiments.run import Discovery, model_of, open_folder, random_draws, resolve_circuit
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import options
from gna_interp.store import atomic_write, make_folder, records
from gna_interp.viz.html import part

__all__ = ["CONDITIONS", "SUMMARY_COLUMNS", "TABLE_COLUMNS", "EvalConfig", "EvalResult", "condition_files", "eval_figure",
           "eval_heads", "metric_rows", "resolve_tasks", "summarize"]

CONDITIONS: tuple[str, ...] = ("intact", "removed", "random")
TABLE_COLUMNS = ["condition", "seed", "task", "metric", "filter", "value", "stderr", "n_samples", "higher_is_better",
                 "n_heads", "heads"]
SUMMARY_COLUMNS = ["task", "metric", "filter", "intact", "intact_stderr", "removed", "removed_stderr", "random_mean",
                   "random_std", "random_min", "random_max", "random_stderr", "random_seeds"]
CONDITIONS_DIR = "conditions"
CIRCUIT_DIR = "circuit"
SCAN_CKPT = f"{CIRCUIT_DIR}/scan.ckpt.json"  # the discovery's checkpoint, when neither heads nor a circuit are given


@dataclass
class EvalResult(ExperimentResult, format="eval"):
    """Result of :func:`eval_heads`: a folder result (:meth:`save` / :meth:`load`) with a figure (:meth:`figure`,
    :meth:`plot`).

    Attributes:
        model: the model's name; ``tasks`` the benchmark names asked for.
        table: one row per condition, seed, task (subtasks of a group included) and metric
            (:data:`TABLE_COLUMNS`).
        heads: the removed heads; ``random_heads[s]`` the heads of random draw ``s``.
        settings: what the runs depended on (limit, few-shot, method, lm-eval version, ...).
        notes: sentences about how the heads were chosen.
        seconds: wall time of each condition (``intact``, ``removed``, ``random-0``, ...; 0 when resumed).
    """

    model: str
    tasks: list[str]
    table: pd.DataFrame
    heads: list[str]
    random_heads: list[list[str]]
    seconds: dict[str, float] = field(default_factory=dict)

    def to_frame(self) -> pd.DataFrame:
        """The long table (:data:`TABLE_COLUMNS`)."""
        return self.table

    @property
    def summary(self) -> pd.DataFrame:
        """The paper's table (:data:`SUMMARY_COLUMNS`) for the tasks asked for (groups, not their subtasks)."""
        return summarize(self.table, self.tasks)

    @property
    def metrics(self) -> dict[str, float]:
        """``{"TASK/METRIC/CONDITION": value}`` of the summary (``random``: the mean over seeds)."""
        out = {}
        for _, r in self.summary.iterrows():
            key = f"{r['task']}/{r['metric']}" + (f",{r['filter']}" if r["filter"] != "none" else "")
            out.update({f"{key}/intact": r["intact"], f"{key}/removed": r["removed"],
                        f"{key}/random": r["random_mean"]})
        return out

    def format_table(self, digits: int = 3) -> str:
        """The summary as aligned text: value ± standard error per condition; random: mean [min, max] over seeds."""
        s = self.summary
        n_rand = int(s["random_seeds"].max()) if len(s) and s["random_seeds"].notna().any() else 0
        k = len(self.heads)
        rk = len(self.random_heads[0]) if self.random_heads else 0
        head = ["task", "metric", "intact", f"{k} heads removed"]
        if n_rand:
            head.append(f"{rk} random removed ({n_rand} seed{'s' * (n_rand > 1)})")

        def pm(v: float, se: float) -> str:
            if v is None or (isinstance(v, float) and math.isnan(v)):
                return "-"
            return f"{v:.{digits}f}" + ("" if se is None or math.isnan(se) else f" ± {se:.{digits}f}")

        rows = [head]
        for _, r in s.iterrows():
            metric = r["metric"] + ("" if r["filter"] == "none" else f" ({r['filter']})")
            row = [r["task"], metric, pm(r["intact"], r["intact_stderr"]), pm(r["removed"], r["removed_stderr"])]
            if n_rand:
                spread = "" if r["random_seeds"] < 2 else f" [{r['random_min']:.{digits}f}, {r['random_max']:.{digits}f}]"
                row.append(f"{r['random_mean']:.{digits}f}{spread}" if not math.isnan(r["random_mean"]) else "-")
            rows.append(row)
        width = [max(len(x[c]) for x in rows) for c in range(len(head))]
        lines = ["  ".join(x[c].ljust(width[c]) for c in range(len(head))) for x in rows]
        lines.insert(1, "  ".join("-" * w for w in width))
        lines.append(f"removed: {', '.join(self.heads)}")
        for s_, hs in enumerate(self.random_heads):
            lines.append(f"random seed {s_}: {', '.join(hs)}")
        return "\n".join(lines)

    def figure(self) -> Any:
        """The bar chart (:func:`eval_figure`)."""
        return eval_figure(self)

    def to_dict(self) -> dict[str, Any]:
        """The ``eval`` document's body: settings, heads, draws, the summary and the long table (last)."""
        return {"model": self.model, "tasks": self.tasks, "heads": self.heads, "random_heads": self.random_heads,
                "settings": self.settings, "notes": self.notes, "seconds": self.seconds,
                "summary": records(self.summary), "table": records(self.table)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "EvalResult":
        """The result :meth:`to_dict` described."""
        return cls(d["model"], list(d["tasks"]), doc_table(d, TABLE_COLUMNS), list(d["heads"]),
                   [list(h) for h in d.get("random_heads") or []], dict(d.get("seconds") or {}), **cls.run_fields(d))

    def save(self, path: str | os.PathLike, png: bool = True) -> Path:
        """Write the result folder (see the module docstring) into ``path`` (or the folder of ``path`` naming its
        ``eval.json``); return the folder. :meth:`load` reads the folder or the file."""
        folder = self.folder(path)
        summary = self.summary
        make_folder(folder.path)
        atomic_write(folder.path / EVAL_SUMMARY_CSV, summary.to_csv(index=False))
        notes = [f"{self.model}: {', '.join(self.tasks)} through lm-evaluation-harness {self.settings.get('lm_eval')}; "
                 f"{self.settings.get('method')} ablation of {len(self.heads)} heads ({', '.join(self.heads)})"
                 + (f" against {len(self.random_heads)} random draws of {len(self.random_heads[0])} heads"
                    if self.random_heads else "") + "."] + list(self.notes)
        if self.settings.get("limit") is not None:
            notes.append(f"limit {self.settings['limit']}: only the first documents of each task were evaluated.")
        sections = [part("heading", "Summary"), table_html(summary)]
        return folder.write(self.table, self.to_dict(), title=f"{self.model}: benchmarks with heads removed",
                            figures={"eval": self.figure}, notes=notes, sections=sections, png=png)


def resolve_tasks(tasks: str | Sequence[str], include_path: str | Path | Sequence[str | Path] | None = None) -> tuple[list[str], Any]:
    """Task names (``"mmlu,gsm8k"`` or a list) checked against lm-eval's index, and the ``TaskManager``
    that knows them. Local YAML tasks -- the shipped example tasks (``gna_kv_mc``, ``gna_kv_gen``:
    :mod:`gna_interp.experiments.eval_tasks`) and those under ``include_path`` -- are looked up first
    (without indexing lm-eval's ~15,000 built-in tasks when they are all local); an unknown name raises
    :class:`InputError` listing the closest names."""
    from gna_interp.experiments.eval_tasks import task_paths
    from gna_interp.experiments.harness import require_lm_eval

    require_lm_eval()
    from lm_eval.tasks import TaskManager

    names = [t.strip() for t in (tasks.split(",") if isinstance(tasks, str) else tasks) if t and t.strip()]
    if not names:
        raise InputError("no task given: name lm-eval tasks, e.g. --tasks mmlu,gsm8k, or local ones with --include-path")
    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    for p in paths:
        if not Path(p).is_dir():
            raise InputError(f"--include-path {str(p)!r} is not a folder; point it at a folder of lm-eval task YAML files")
    search = task_paths(paths)
    local = TaskManager(include_path=search, include_defaults=False)
    if all(n in local.all_tasks for n in names):
        return names, local
    manager = _full_manager(tuple(search))
    known = set(manager.all_tasks)
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, manager.all_tasks, n=6, cutoff=0.6)
            hint = f"; close: {', '.join(close)}" if close else ""
            where = f" or under --include-path {', '.join(map(str, paths))}" if paths else \
                " nor among the shipped example tasks (gna_kv_mc, gna_kv_gen); local YAML tasks: pass their " \
                "folder with --include-path"
            raise InputError(f"unknown task {n!r}: lm-eval has no task, group or tag of that name{where}{hint}")
    return names, manager


@functools.lru_cache(maxsize=4)
def _full_manager(paths: tuple[str, ...]) -> Any:
    """lm-eval's task index with its built-in tasks (and ``paths``): built once per process (it parses ~15,000
    YAML files, tens of seconds on a small machine)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(paths) or None)


def metric_rows(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per task and metric of an lm-eval ``simple_evaluate`` result: ``task, metric, filter, value,
    stderr, n_samples, higher_is_better`` (a standard error lm-eval does not give is NaN)."""
    rows = []
    for task, res in (results.get("results") or {}).items():
        n = (results.get("n-samples") or {}).get(task, {})
        better = (results.get("higher_is_better") or {}).get(task, {})
        for key, value in res.items():
            if "," not in key or not isinstance(value, (int, float)) or isinstance(value, bool):
                continue
            metric, filt = key.split(",", 1)
            if metric.endswith("_stderr"):
                continue
            se = res.get(f"{metric}_stderr,{filt}")
            rows.append({"task": task, "metric": metric, "filter": filt, "value": float(value),
                         "stderr": float(se) if isinstance(se, (int, float)) else math.nan,
                         "n_samples": n.get("effective", n.get("original")) if isinstance(n, dict) else None,
                         "higher_is_better": better.get(metric)})
    return rows


def summarize(table: pd.DataFrame, tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """The paper's table from the long table: per task and metric the intact and removed values with
    their standard errors, and the random draws' mean, spread (std over seeds), min, max and mean standard
    error (:data:`SUMMARY_COLUMNS`). ``tasks``: keep these tasks when the table has them (a group's
    row, not its subtasks')."""
    if table.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    df = table
    if tasks:
        keep = df["task"].isin(list(tasks))
        df = df[keep] if keep.any() else df
    out = []
    order = list(dict.fromkeys(zip(df["task"], df["metric"], df["filter"])))
    for task, metric, filt in order:
        part = df[(df["task"] == task) & (df["metric"] == metric) & (df["filter"] == filt)]

        def one(cond: str) -> tuple[float, float]:
            r = part[part["condition"] == cond]
            return (float(r["value"].iloc[0]), float(r["stderr"].iloc[0])) if len(r) else (math.nan, math.nan)

        rnd = part[part["condition"] == "random"]
        vals = rnd["value"].astype(float)
        (iv, ise), (rv, rse) = one("intact"), one("removed")
        out.append({"task": task, "metric": metric, "filter": filt, "intact": iv, "intact_stderr": ise,
                    "removed": rv, "removed_stderr": rse,
                    "random_mean": float(vals.mean()) if len(vals) else math.nan,
                    "random_std": float(vals.std(ddof=1)) if len(vals) > 1 else math.nan,
                    "random_min": float(vals.min()) if len(vals) else math.nan,
                    "random_max": float(vals.max()) if len(vals) else math.nan,
                    "random_stderr": float(rnd["stderr"].astype(float).mean()) if len(vals) else math.nan,
                    "random_seeds": int(len(vals))})
    return pd.DataFrame(out, columns=SUMMARY_COLUMNS)


def eval_figure(result: EvalResult | pd.DataFrame, title: str | None = None) -> Any:
    """Plotly grouped bars, one group per task and metric: intact and removed with their standard errors,
    random removed at its mean over seeds with the min-max range of the seeds as the error bar (each seed
    a dot). Takes an :class:`EvalResult` or a summary/long table."""
    import plotly.graph_objects as go

    if isinstance(result, EvalResult):
        summary, table = result.summary, result.table
        k, rk = len(result.heads), len(result.random_heads[0]) if result.random_heads else 0
        named = f" ({', '.join(result.heads)})" if 0 < k <= 6 else ""
        title = title or f"{result.model}: benchmarks with heads removed"
    else:
        table = result if "condition" in result else None
        summary = summarize(result) if "condition" in result else result
        k = rk = None
        named = ""
    if summary.empty:
        raise InputError("nothing to plot: the evaluation has no metric rows")
    x = [f"{r.task}<br>{r.metric}" + ("" if r.filter == "none" else f" ({r.filter})") for r in summary.itertuples()]
    fig = go.Figure()
    fig.add_bar(name="intact", x=x, y=summary["intact"], marker_color="#2c7fb8", offsetgroup="intact",
                error_y=dict(type="data", array=summary["intact_stderr"].fillna(0), visible=True))
    fig.add_bar(name=f"{k} heads removed{named}" if k else "heads removed", x=x, y=summary["removed"], marker_color="#c0392b",
                offsetgroup="removed",
                error_y=dict(type="data", array=summary["removed_stderr"].fillna(0), visible=True))
    if summary["random_seeds"].fillna(0).max() > 0:
        mean = summary["random_mean"]
        fig.add_bar(name=f"{rk} random heads removed (mean of {int(summary['random_seeds'].max())} seeds)" if rk
                    else "random heads removed", x=x, y=mean, marker_color="#95a5a6", offsetgroup="random",
                    error_y=dict(type="data", symmetric=False, array=(summary["random_max"] - mean).fillna(0),
                                 arrayminus=(mean - summary["random_min"]).fillna(0), visible=True),
                    customdata=summary[["random_std", "random_seeds"]].to_numpy(),
                    hovertemplate="%{x}<br>mean %{y:.3f}, std %{customdata[0]:.3f} over %{customdata[1]} seeds"
                                  "<extra>random</extra>")
        if table is not None:
            rnd = table[table["condition"] == "random"]
            keys = {(r.task, r.metric, r.filter): xi for r, xi in zip(summary.itertuples(), x)}
            pts = [(keys[(r.task, r.metric, r.filter)], r.value, r.seed) for r in rnd.itertuples()
                   if (r.task, r.metric, r.filter) in keys]
            if pts:
                fig.add_scatter(x=[p[0] for p in pts], y=[p[1] for p in pts], mode="markers", name="random seeds",
                                marker=dict(color="#555", size=6, symbol="circle-open"), offsetgroup="random",
                                text=[f"seed {int(p[2])}" for p in pts], hovertemplate="%{text}: %{y:.3f}<extra></extra>")
    fig.update_layout(barmode="group", scattermode="group", title=title or "benchmarks with heads removed", yaxis_title="metric value",
                      template="plotly_white", legend=dict(orientation="h", y=-0.2), height=460)
    return fig


def _choose_heads(model: Model, heads: Any, circuit: Any, top_k: int, out: Path | None, resume: bool,
                  batch_size: int, progress: bool) -> tuple[list[HeadRef], list[HeadRef], list[str]]:
    """The removed heads, the pool random heads are drawn from, and notes on where they came from."""
    from gna_interp.experiments.harness import parse_heads_arg
    from gna_interp.tasks.choice import TaskChoice

    if heads is not None and circuit is not None:
        raise InputError("pass heads (--ablate) or a circuit (--circuit), not both")
    if heads is not None:
        named = model.check_heads(parse_heads_arg(heads))
        if not named:
            raise InputError("no heads given to remove: name them, e.g. --ablate L16H0,L18H6")
        removed = list(dict.fromkeys(named))
        return removed, model.default_heads(), [f"removed heads given: {', '.join(h.name for h in removed)}."]
    if top_k < 1:
        raise InputError(f"top_k must be >= 1, got {top_k}")
    if isinstance(circuit, (str, os.PathLike)) and not Path(circuit).exists():
        raise InputError(f"--circuit {str(circuit)!r} does not exist; pass a `gna scan` output folder")
    how = Discovery(task=TaskChoice(batch_size=batch_size), k=top_k, batch_size=batch_size, progress=progress,
                    reuse=resume, say="no heads or circuit given: discovering the circuit as gna scan does (the KV "
                                      "form the model solves, by calibration) ...")
    c, note = resolve_circuit(model, circuit, out / CIRCUIT_DIR if out is not None else None, how)
    removed = model.check_heads(c.heads[:top_k])
    pool = [h for h in model.check_heads(list(c.scan.heads))]
    return removed, pool, [f"{note}: its top {len(removed)} heads removed ({', '.join(h.name for h in removed)})."]


@options
class EvalConfig(RunOptions):
    """How :func:`eval_heads` runs.

    Attributes:
        top_k: the circuit's best-ranked heads removed; random_k: random heads removed per seed (None: as
            many as removed; 0: no random condition); seeds: random draws.
        limit: documents a task (or a fraction below 1), as lm-eval's ``--limit``.
        method: ``zero`` or ``mean`` ablation.
        include_path: folder(s) of local task YAML files (the shipped example tasks are always found);
            num_fewshot: few-shot examples (None: the task's).
        max_gen_toks: new tokens of a generation when the task sets none.
        bootstrap_iters: lm-eval's bootstrap iterations for standard errors.

    and the run options of :class:`~gna_interp.experiments.options.RunOptions` (``batch_size``, ``progress``,
    ``png``; ``resume`` reuses the finished conditions of an earlier run with the same settings, ``fresh``
    deletes them).
    """

    top_k: int = 5
    random_k: int | None = None
    seeds: int = 3
    limit: int | float | None = None
    method: str = "zero"
    include_path: str | Path | Sequence[str | Path] | None = None
    num_fewshot: int | None = None
    max_gen_toks: int = 256
    bootstrap_iters: int = 100000

    def validate(self) -> None:
        from gna_interp.experiments.harness import ABLATION_METHODS

        if self.method not in ABLATION_METHODS:
            raise InputError(f"unknown ablation method {self.method!r}; choose one of {ABLATION_METHODS}")
        if self.seeds < 0 or (self.random_k is not None and self.random_k < 0):
            raise InputError(f"seeds and random_k must be >= 0, got seeds={self.seeds}, random_k={self.random_k}")
        limit = self.limit
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                                  or not math.isfinite(limit) or limit <= 0 or (limit >= 1 and limit != int(limit))):
            raise InputError(f"limit must be a whole number of documents >= 1 or a fraction in (0, 1), got {limit}")


def eval_heads(model: Model | str, tasks: str | Sequence[str], heads: str | Sequence[str | HeadRef] | None = None,
               circuit: Any = None, out: str | Path | None = None, config: EvalConfig | None = None,
               **overrides: Any) -> EvalResult:
    """Run lm-eval ``tasks`` on ``model`` intact, with ``heads`` (or ``circuit``'s ``top_k``) removed, and with
    ``random_k`` random heads removed (``seeds`` draws; ``random_k=0`` skips them); see the module docstring.

    ``model``: a loaded :class:`Model` or a spec. ``out``: write the result folder there (each condition's
    metrics as it finishes; ``resume=True`` reuses the finished conditions of an earlier run with the same
    settings). ``config`` (:class:`EvalConfig`) and keyword ``overrides`` of its fields: ``limit``,
    ``method``, ``include_path``, ... (as ``gna eval``'s options).
    """
    cfg = EvalConfig.build(config, **overrides)
    from gna_interp.experiments.harness import LM_EVAL_VERSION, GnaLM

    names, manager = resolve_tasks(tasks, cfg.include_path)
    out_path = Path(out) if out is not None else None
    if out_path is not None:  # without a folder nothing is refused (open_folder would refuse resume with fresh)
        open_folder(out_path, SCAN_CKPT, cfg, also=condition_files(out_path))
    model = model_of(model)
    removed, pool, notes = _choose_heads(model, heads, circuit, cfg.top_k, out_path, cfg.resume, cfg.batch_size,
                                         cfg.progress)
    rk = len(removed) if cfg.random_k is None else cfg.random_k
    draws = random_draws(pool, removed, rk, cfg.seeds, option="--random-k") if rk and cfg.seeds else []
    limit = int(cfg.limit) if cfg.limit is not None and cfg.limit >= 1 else cfg.limit
    settings = {"model": model.name, "tasks": names, "limit": limit, "num_fewshot": cfg.num_fewshot,
                "method": cfg.method, "max_gen_toks": cfg.max_gen_toks, "bootstrap_iters": cfg.bootstrap_iters,
                "lm_eval": LM_EVAL_VERSION, "dtype": str(model.dtype).replace("torch.", ""), "batch_size": cfg.batch_size,
                "include_path": [str(p) for p in ([cfg.include_path] if isinstance(cfg.include_path, (str, Path))
                                                  else cfg.include_path or [])]}
    settings["task_yaml"] = _task_yaml_hashes(manager, names)
    plan: list[tuple[str, str, int | None, list[HeadRef]]] = [("intact", "intact", None, []),
                                                               ("removed", "removed", None, removed)]
    plan += [(f"random-{s}", "random", s, d) for s, d in enumerate(draws)]
    rows: list[dict[str, Any]] = []
    seconds: dict[str, float] = {}
    bar = tqdm(plan, desc="gna eval conditions", unit="condition", disable=not cfg.progress)
    for label, cond, seed, hs in bar:
        bar.set_postfix_str(label)
        names_h = [h.name for h in hs]
        key = {k: v for k, v in settings.items() if k not in ("batch_size", "include_path")} | {"heads": names_h}
        done = Checkpoint(out_path / CONDITIONS_DIR / f"{label}.json" if out_path is not None else None, "eval",
                          fingerprint(model, key))
        seconds[label] = 0.0
        if "rows" not in done:
            start = time.perf_counter()
            lm = GnaLM(model, heads=hs or None, method=cfg.method, batch_size=cfg.batch_size,
                       max_gen_toks=cfg.max_gen_toks, progress=cfg.progress)
            got = metric_rows(_simple_evaluate(lm, names, manager, limit, cfg.num_fewshot, cfg.bootstrap_iters))
            seconds[label] = time.perf_counter() - start
            done.extra.update(condition=label, seconds=seconds[label])
            done.put("rows", got)
        for r in done["rows"]:
            rows.append({"condition": cond, "seed": seed, **r, "n_heads": len(hs), "heads": ",".join(names_h)})
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    result = EvalResult(model.name, names, table, [h.name for h in removed], [[h.name for h in d] for d in draws],
                        seconds, settings=settings, notes=notes)
    if out_path is not None:
        result.save(out_path, png=cfg.png)
    return result


def _simple_evaluate(lm: Any, names: list[str], manager: Any, limit: int | float | None, num_fewshot: int | None,
                     bootstrap_iters: int) -> dict[str, Any]:
    import lm_eval

    res = lm_eval.simple_evaluate(model=lm, tasks=names, task_manager=manager, limit=limit, num_fewshot=num_fewshot,
                                  bootstrap_iters=bootstrap_iters, log_samples=False)
    if not res or not res.get("results"):
        raise InputError(f"lm-eval returned no results for {names}")
    return res


def _task_yaml_hashes(manager: Any, names: Sequence[str]) -> dict[str, str | None]:
    """SHA-256 (first 16 hex digits) of each task's YAML file, so that resuming after a task was edited
    reruns it (data files behind an unchanged YAML are not hashed: use ``--fresh`` after changing them)."""
    import hashlib

    index = getattr(manager, "task_index", None) or {}
    out: dict[str, str | None] = {}
    for n in names:
        path = getattr(index.get(n), "yaml_path", None) if hasattr(index, "get") else None
        try:
            out[n] = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16] if path else None
        except OSError:
            out[n] = None
    return out


def condition_files(out: Path) -> list[Path]:
    """The finished conditions an eval run left in ``out`` (``conditions/*.json``, the checkpoints a rerun with
    ``resume`` reuses)."""
    folder = out / CONDITIONS_DIR
    return sorted(folder.glob("*.json")) if folder.is_dir() else []
