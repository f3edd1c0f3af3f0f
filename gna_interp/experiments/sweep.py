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

``k`` follows the ablation curve's rule (:func:`~gna_interp.circuits.circuit.curve_k`): at most a
quarter of the scanned heads, so that ``k`` random heads are a small draw that cannot hold the circuit.

**Heads** come from a saved circuit (``circuit=DIR``, a ``gna scan`` folder) or are discovered first with
``gna scan``'s defaults (:data:`DISCOVERY`: KV, 10 pairs, 24 prompts, values 0-9, the auto scan), on
prompts built with ``seed + 1`` so the heads are never scored on the prompts they were found on. With
``out=DIR`` the discovered circuit is saved in ``DIR/circuit`` (a ``gna scan`` folder: ``gna report
DIR/circuit`` draws it).

**Output** (``out=DIR``, :class:`~gna_interp.experiments.output.ResultFolder` ``sweep``): ``sweep.csv``
(one row per point, columns :data:`COLUMNS`), ``sweep.json`` (settings, heads, random draws, the
per-size summary), ``report.html`` with the figure (accuracy vs dictionary size, one line per condition,
random as the median of the draws with their min-max band) and ``figures/sweep.png``. Every point is
appended to ``DIR/sweep.ckpt.json`` as it finishes; ``resume=True`` continues from it (``fresh=True``
deletes it and the discovered circuit); a checkpoint is never overwritten silently.
"""

from __future__ import annotations

import html
import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import pandas as pd

from gna_interp.circuits.circuit import FILES as CIRCUIT_FILES
from gna_interp.circuits.circuit import Circuit
from gna_interp.circuits.curve import curve_k, random_orders
from gna_interp.circuits.discovery import discover
from gna_interp.circuits.replay import SetAblation
from gna_interp.errors import InputError
from gna_interp.experiments.checkpoint import Checkpoint, fingerprint, stale_files
from gna_interp.experiments.options import RunOptions
from gna_interp.experiments.output import ResultFolder, table_html
from gna_interp.models import load_model
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import options
from gna_interp.tasks import KVRetrieval
from gna_interp.tasks.kv import PAPER_SIZES, TEMPLATES
from gna_interp.tasks.options import TaskOptions

__all__ = ["COLUMNS", "CONDITIONS", "DISCOVERY", "Sweep", "SweepConfig", "discovery_task", "resolve_circuit", "sweep"]

COLUMNS = ["pairs", "condition", "seed", "k", "accuracy", "logit_diff", "gold_prob", "chance", "n_samples", "heads"]
CONDITIONS: tuple[str, ...] = ("intact", "top1", "topk", "random")
DISCOVERY: dict[str, Any] = {"n_pairs": 10, "n_samples": 24, "max_value": 9, "seed_offset": 1}
NAME = "sweep"
CKPT = "sweep.ckpt.json"
CIRCUIT_DIR = "circuit"
_COLOURS = {"intact": "#222222", "top1": "#e67e22", "topk": "#c0392b", "random": "#7f8c8d"}


# ---- helpers shared with families.py ------------------------------------------------------------------
def model_of(model: Model | str, device: str | None = None, dtype: str = "float32") -> Model:
    """``model`` itself, or the model a spec names (loaded on ``device`` in ``dtype``), checked runnable."""
    m = load_model(model, device=device, dtype=dtype) if isinstance(model, (str, os.PathLike)) else model
    if not isinstance(m, Model):
        raise InputError(f"model must be a Model or a model spec, got {type(model).__name__}")
    m.check_runnable()
    return m


def discovery_task(model: Model, seed: int) -> KVRetrieval:
    """The task heads are discovered on when no circuit is given: ``gna scan``'s default (:data:`DISCOVERY`),
    built with ``seed + 1`` (held out from the measured prompts)."""
    return KVRetrieval(DISCOVERY["n_pairs"], DISCOVERY["n_samples"], seed=seed + DISCOVERY["seed_offset"],
                       max_value=DISCOVERY["max_value"], words=model.kv_words)


def resolve_circuit(model: Model, circuit: Circuit | str | os.PathLike | None, seed: int, folder: Path | None = None,
                    k: int = 5, batch_size: int = 16, progress: bool = True, task: KVRetrieval | None = None
                    ) -> tuple[Circuit, str]:
    """The circuit whose heads an experiment removes, and where it came from (a sentence).

    ``circuit`` is a :class:`Circuit`, a ``gna scan`` folder, or None: then the circuit is discovered on
    ``task`` (default :func:`discovery_task`, ``gna scan``'s defaults) with ``gna scan``'s default
    discovery and, with ``folder``, saved there; a circuit already saved in ``folder`` (an earlier,
    interrupted run) is loaded instead, and an interrupted discovery resumes from ``folder/scan.ckpt.json``.
    """
    if isinstance(circuit, Circuit):
        src = f"the given circuit (found on {circuit.model}, task {circuit.task.get('name')})"
    elif circuit is not None:
        path = Path(circuit)
        circuit = Circuit.load(path)
        src = f"the circuit in {path} (found on {circuit.model}, task {circuit.task.get('name')})"
    elif folder is not None and (folder / "circuit.json").exists():
        circuit = Circuit.load(folder)
        src = f"the circuit discovered earlier in {folder} (task {circuit.task.get('name')})"
    else:
        task = task if task is not None else discovery_task(model, seed)
        ckpt = folder / "scan.ckpt.json" if folder is not None else None
        circuit = discover(model, task, k=k, batch_size=batch_size, checkpoint=ckpt, progress=progress)
        if folder is not None:
            circuit.save(folder)
        where = f", saved in {folder}" if folder is not None else ""
        src = (f"discovered on {task.name} ({len(task)} prompts, values 0-{task.max_value}, seed {task.seed}; "
               f"gna scan's default discovery){where}")
    if not circuit.heads:
        raise InputError(f"{src} has no circuit heads (every scanned head is generic); rerun gna scan with "
                         f"--keep-generic or pick another circuit")
    model.check_heads([h.name for h in circuit.scan.heads])
    if circuit.model != model.name:
        src += f"; applied to {model.name}"
    return circuit, src


def clear_circuit(folder: Path) -> None:
    """Delete what :func:`resolve_circuit` saved in ``folder`` (the circuit files and the scan's checkpoints)."""
    for name in (*CIRCUIT_FILES, "scan.ckpt.json", "scan.ckpt.control.json", "report.html"):
        (folder / name).unlink(missing_ok=True)


def slug(name: str) -> str:
    """A folder name for a model name (``zoo:transformer-kv`` -> ``zoo_transformer-kv``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "model"


def random_draws(pool: Sequence[HeadRef], exclude: Sequence[HeadRef], k: int, seeds: int, salt: str
                 ) -> list[list[HeadRef]]:
    """``seeds`` random orders of the heads of ``pool`` not in ``exclude`` (seeded by ``salt`` and the seed
    number, the same on every machine), each cut to its first ``k``."""
    others = [h for h in pool if h not in set(exclude)]
    if k > len(others):
        raise InputError(f"cannot draw {k} random heads: only {len(others)} scanned heads are outside the top {k}")
    return [order[:k] for order in random_orders(others, seeds, salt)]


def _bar(total: int, initial: int, desc: str, progress: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit="point", disable=not progress)


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


# ---- the result ----------------------------------------------------------------------------------------
@dataclass
class Sweep:
    """Result of :func:`sweep`.

    Attributes:
        model: the model's name (its spec when loaded by spec).
        pairs: the dictionary sizes, ascending.
        heads: the circuit's ``k`` best-ranked heads (``heads[:1]`` is the ``top1`` condition).
        random: the random draws, one list of ``k`` heads per seed.
        table: one row per point, columns :data:`COLUMNS`.
        settings: samples, seed, max_value, template, k, seeds, batch_size.
        source: where the heads came from (a sentence).
        notes: sentences about the run.
        seconds: wall time of the measured points (this run's, not a resumed run's earlier part).
    """

    model: str
    pairs: list[int]
    heads: list[HeadRef]
    random: list[list[HeadRef]]
    table: pd.DataFrame
    settings: dict[str, Any]
    source: str = ""
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def k(self) -> int:
        """Heads removed together in the ``topk`` and ``random`` conditions."""
        return len(self.heads)

    def to_frame(self) -> pd.DataFrame:
        """The points (columns :data:`COLUMNS`)."""
        return self.table.copy()

    def by_pairs(self) -> pd.DataFrame:
        """One row per dictionary size: ``pairs, chance, intact, top1, topk, random_median, random_min,
        random_max`` (accuracies) and the drops from intact ``drop_top1, drop_topk, drop_random`` (the last
        from the random median)."""
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
            rows.append({"pairs": n, "chance": float(at["chance"].iloc[0]) if len(at) else 1 / n, "intact": intact,
                         "top1": acc("top1"), "topk": acc("topk"), "random_median": med,
                         "random_min": float(rnd.min()) if len(rnd) else math.nan,
                         "random_max": float(rnd.max()) if len(rnd) else math.nan,
                         "drop_top1": intact - acc("top1"), "drop_topk": intact - acc("topk"),
                         "drop_random": intact - med})
        return pd.DataFrame(rows)

    @property
    def metrics(self) -> dict[str, Any]:
        """Mean drops over the sizes (``drop_top1``, ``drop_topk``, ``drop_random``), the top-k drop's range
        (``drop_topk_min``, ``drop_topk_max``) and its least-squares slope per 10 pairs
        (``drop_topk_slope_per_10``: near 0 for the paper's constant drop), ``k``, ``sizes``."""
        b = self.by_pairs()
        slope = math.nan
        if len(b) >= 2 and b["drop_topk"].notna().all():
            x = b["pairs"].astype(float)
            slope = float(((x - x.mean()) * (b["drop_topk"] - b["drop_topk"].mean())).sum() /
                          ((x - x.mean()) ** 2).sum()) * 10
        return {"k": self.k, "sizes": len(self.pairs), "drop_top1": float(b["drop_top1"].mean()),
                "drop_topk": float(b["drop_topk"].mean()), "drop_random": float(b["drop_random"].mean()),
                "drop_topk_min": float(b["drop_topk"].min()), "drop_topk_max": float(b["drop_topk"].max()),
                "drop_topk_slope_per_10": slope}

    def summary(self) -> str:
        """A few lines: the heads, one line per size and the drop statistics."""
        names = ", ".join(h.name for h in self.heads)
        lines = [f"dictionary sweep of {self.model}: {self.settings.get('samples')} prompts per size, values "
                 f"0-{self.settings.get('max_value')}; top {self.k} heads {names} ({self.source})",
                 "pairs  intact   top1  top-k  random (median, min-max)"]
        for _, r in self.by_pairs().iterrows():
            lines.append(f"{int(r['pairs']):5d}  {r['intact']:.3f}  {r['top1']:.3f}  {r['topk']:.3f}  "
                         f"{r['random_median']:.3f} ({r['random_min']:.3f}-{r['random_max']:.3f})")
        lines.append(self._drop_line())
        return "\n".join(lines + [f"note: {n}" for n in self.notes])

    def _drop_line(self) -> str:
        m = self.metrics
        return (f"drop from intact, mean over sizes: top-1 {m['drop_top1']:.3f}, top-{self.k} {m['drop_topk']:.3f} "
                f"(range {m['drop_topk_min']:.3f}-{m['drop_topk_max']:.3f}, slope {m['drop_topk_slope_per_10']:+.3f} "
                f"per 10 pairs), {self.k} random {m['drop_random']:.3f} (median of the draws)")

    def figure(self, title: str | None = None) -> Any:
        """Accuracy vs dictionary size: intact, top-1 removed, top-k removed, and the random draws' median
        with their min-max band (each seed faint); chance ``1/n`` dotted."""
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
        for cond, label in (("intact", "intact"), ("top1", f"top-1 removed ({self.heads[0].name})"),
                            ("topk", f"top-{self.k} removed ({top})")):
            if cond == "topk" and self.k == 1:
                continue
            fig.add_trace(go.Scatter(x=b["pairs"], y=b[cond], mode="lines+markers", name=label,
                                     line=dict(color=_COLOURS[cond], width=3 if cond != "top1" else 2)))
        fig.add_trace(go.Scatter(x=b["pairs"], y=b["chance"], mode="lines", name="chance (1/n)",
                                 line=dict(color="#aaaaaa", dash="dot", width=1)))
        fig.update_layout(title=title or f"KV retrieval vs dictionary size: {self.model}", template="plotly_white",
                          height=480, xaxis_title="dictionary size (key:value lines)", yaxis_title="accuracy",
                          yaxis_range=[-0.02, 1.02], legend=dict(orientation="h", yanchor="top", y=-0.18, x=0))
        fig.update_xaxes(tickvals=self.pairs)
        return fig

    def to_dict(self) -> dict[str, Any]:
        """The JSON document's body (without the table, which :meth:`save` adds)."""
        return {"model": self.model, "pairs": self.pairs, "heads": [h.name for h in self.heads],
                "random": [[h.name for h in d] for d in self.random], "settings": self.settings,
                "source": self.source, "notes": self.notes, "seconds": round(self.seconds, 2),
                "metrics": self.metrics, "by_pairs": self.by_pairs().to_dict(orient="records")}

    def save(self, out: str | os.PathLike, png: bool = True) -> Path:
        """Write ``sweep.csv``, ``sweep.json``, ``report.html`` and ``figures/sweep.png`` into ``out``."""
        b = self.by_pairs()
        st, top = self.settings, ", ".join(h.name for h in self.heads)
        notes = [f"Heads: {self.source}.", f"Conditions: intact; top-1 ({self.heads[0].name}) removed; top-{self.k} "
                 f"({top}) removed; {self.k} random heads removed ({len(self.random)} draws, the same heads at every "
                 f"size). Zero ablation; {st.get('samples')} prompts per size, values 0-{st.get('max_value')}, seed "
                 f"{st.get('seed')}.",
                 self._drop_line()] + self.notes
        section = ["<h2>Accuracy by dictionary size</h2>", table_html(b)]
        return ResultFolder(out, NAME).write(self.table, self.to_dict(), title=f"Dictionary sweep: {self.model}",
                                             figures={"sweep": self.figure()}, notes=notes, sections=section, png=png)

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Sweep":
        """Read a sweep written by :meth:`save` (the folder or its ``sweep.json``)."""
        doc = ResultFolder(path, NAME).load()
        table = doc["frame"].reindex(columns=COLUMNS)
        return cls(doc["model"], [int(n) for n in doc["pairs"]], [HeadRef.parse(h) for h in doc["heads"]],
                   [[HeadRef.parse(h) for h in d] for d in doc["random"]], table, dict(doc["settings"]),
                   doc.get("source", ""), list(doc.get("notes") or []), float(doc.get("seconds") or 0.0))

    def _repr_html_(self) -> str:
        return (f"<p><b>Dictionary sweep of {html.escape(self.model)}</b>: top {self.k} heads "
                f"{html.escape(', '.join(h.name for h in self.heads))}</p>" + table_html(self.by_pairs()))

    def __repr__(self) -> str:
        m = self.metrics
        return (f"Sweep({self.model!r}, pairs {self.pairs}, top {self.k} {[h.name for h in self.heads]}, "
                f"mean drop top-k {m['drop_topk']:.3f} vs random {m['drop_random']:.3f})")


# ---- the experiment --------------------------------------------------------------------------------------
@options
class SweepConfig(TaskOptions, RunOptions):
    """How :func:`sweep` runs (the task knobs of :class:`~gna_interp.tasks.options.TaskOptions`; ``pairs``
    here are the dictionary sizes, comma-separated text or a list).

    Attributes:
        k: heads removed together; seeds: random ``k``-head draws.
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
    device: str | None = None
    dtype: str = "float32"
    on_point: Callable[[dict[str, Any]], None] | None = None


def sweep(model: Model | str, pairs: int | str | Iterable[int] | None = None,
          circuit: Circuit | str | os.PathLike | None = None, out: str | os.PathLike | None = None,
          config: SweepConfig | None = None, **overrides: Any) -> Sweep:
    """KV accuracy at each dictionary size of ``pairs`` (default the paper's 10, 15, ..., 50): intact, with
    the circuit's top-1 and top-``k`` heads removed, and with ``k`` random heads removed (``seeds`` draws).

    ``model`` is a :class:`Model` or a spec (loaded with ``device``, ``dtype``); ``circuit`` a
    :class:`Circuit` or a ``gna scan`` folder (None: discovered first, see the module docstring). With
    ``out`` the folder is written (and points are checkpointed as they finish; ``resume``/``fresh`` as in
    ``gna scan``). ``config`` (:class:`SweepConfig`) and keyword ``overrides`` of its fields: the same
    options as ``gna sweep``.
    """
    cfg = SweepConfig.build(config, **overrides, **({} if pairs is None else {"pairs": pairs}))
    sizes = parse_pairs(cfg.pairs)
    for name, v, lo in (("k", cfg.k, 1), ("seeds", cfg.seeds, 1), ("samples", cfg.samples, 1),
                        ("batch_size", cfg.batch_size, 1), ("max_value", cfg.max_value, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise InputError(f"{name} must be an integer >= {lo}, got {v!r}")
    if cfg.template not in TEMPLATES:
        raise InputError(f"unknown template {cfg.template!r}; choose one of {TEMPLATES}")
    if max(sizes) > cfg.max_value + 1:
        raise InputError(f"pairs up to {max(sizes)} need {max(sizes)} distinct values, but max_value {cfg.max_value} "
                         f"gives {cfg.max_value + 1}; raise max_value (99 is the paper's range) or drop the larger sizes")
    folder = Path(out) if out is not None else None
    cfolder = folder / CIRCUIT_DIR if folder is not None else None
    if folder is not None:
        stale = stale_files(folder, CKPT, cfg.resume, cfg.fresh,
                            also=[cfolder / "scan.ckpt.json", cfolder / "circuit.json"])
        if cfg.fresh:
            for p in stale:
                p.unlink(missing_ok=True)
            clear_circuit(cfolder)
    m = model_of(model, cfg.device, cfg.dtype)
    tasks = {n: cfg.replace(pairs=n).kv(m.kv_words)
             for n in sizes}  # built before any work: a size the word list cannot fill fails here
    circ, source = resolve_circuit(m, circuit, cfg.seed, cfolder, k=cfg.k, batch_size=cfg.batch_size,
                                   progress=cfg.progress)
    kk = min(curve_k(len(circ.scan.heads), cfg.k), len(circ.heads))
    notes = []
    if kk < cfg.k:
        notes.append(f"removes k = {kk} heads, not {cfg.k}: {len(circ.scan.heads)} scanned heads ({len(circ.heads)} in "
                     f"the circuit), and k random heads must stay a small draw (at most a quarter of them)")
    top = circ.heads[:kk]
    draws = random_draws(circ.scan.heads, top, kk, cfg.seeds, "gna-sweep-random")
    settings = {"samples": cfg.samples, "seed": cfg.seed, "max_value": cfg.max_value, "template": cfg.template, "k": kk,
                "k_requested": cfg.k, "seeds": cfg.seeds, "batch_size": cfg.batch_size, "method": "zero"}
    fp = fingerprint(m, {**settings, "pairs": sizes, "heads": [h.name for h in top],
                         "random": [[h.name for h in d] for d in draws]})
    log = Checkpoint(folder / CKPT if folder is not None else None, NAME, fp)
    log.save()
    conditions: list[tuple[str, int, list[HeadRef]]] = [("intact", 0, []), ("top1", 0, top[:1]), ("topk", 0, top)]
    conditions += [("random", s, d) for s, d in enumerate(draws)]
    start = time.perf_counter()
    rows: list[dict[str, Any]] = []
    done = sum(f"{n}/{c}/{s}" in log for n in sizes for c, s, _ in conditions)
    with _bar(len(sizes) * len(conditions), done, f"sweep {m.name}", cfg.progress) as bar:
        for n in sizes:
            runner = None
            for cond, s, heads in conditions:
                key = f"{n}/{cond}/{s}"
                if key not in log:
                    runner = runner or SetAblation(m, tasks[n], batch_size=cfg.batch_size)
                    met = runner.run(heads).metrics
                    log.put(key, {"pairs": n, "condition": cond, "seed": s, "k": len(heads),
                                  "accuracy": met["accuracy"], "logit_diff": met["logit_diff"],
                                  "gold_prob": met["gold_prob"], "chance": met["chance"],
                                  "n_samples": met["n_samples"], "heads": ",".join(h.name for h in heads)})
                    bar.update(1)
                    if cfg.on_point is not None:
                        cfg.on_point(log[key])
                rows.append(log[key])
    result = Sweep(m.name, sizes, top, draws, pd.DataFrame(rows, columns=COLUMNS), settings, source, notes,
                   time.perf_counter() - start)
    if folder is not None:
        result.save(folder, png=cfg.png)
    return result
