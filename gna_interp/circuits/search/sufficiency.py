"""Faithfulness: whether a circuit of heads *suffices* for a task -- every head outside it ablated, how much of the
intact model's metric survives.

**Definition** (Wang et al. 2023; node form). For a circuit ``C`` (a set of heads), ``m(C)`` is the task metric
with every head of the model *outside* ``C`` ablated together (zero or mean ablation; MLPs, embeddings and the
unembedding are kept), ``m(M)`` the intact model's and ``m(∅)`` the metric with every head ablated::

    faithfulness(C) = (m(C) - m(∅)) / (m(M) - m(∅))

1 means the circuit alone carries the task as well as the whole model, 0 that it does no better than no head at
all. The fraction is reported for the logit difference and for the accuracy, with a paired bootstrap interval over
samples (the same resampled samples in ``m(C)``, ``m(M)`` and ``m(∅)``).

**The curve** (MIB, Mueller et al. 2025, over nodes): ``faithfulness(ranked[:k])`` as ``k`` grows through a grid of
sizes, beside circuits of the same sizes drawn at random; its **CPR** (area under the curve over the circuit's
share ``k / N`` of the ``N`` heads, higher is better) and **CMD** (area between the curve and 1, lower is better),
both by the trapezoid rule. The **smallest circuit** keeping a threshold fraction is found on the ranked order
(the grid, then bisection between the two sizes that bracket it) and its **minimality** is each member's own
contribution ``m(C) - m(C \\ {v})``.

Every point is one :class:`~gna_interp.engine.replay.SetAblation` run (the heads outside the circuit removed
together); the complements of a growing circuit are nested, so a series costs one nested replay.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Sequence

import pandas as pd
import torch

from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.engine.replay import SetAblation
from gna_interp.bootstrap import N_BOOTSTRAP, interval, paired_bootstrap
from gna_interp.constants import FAITHFULNESS, FAITHFULNESS_JSON
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.graph import Edge
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_int, check_level, check_n_boot, check_share, options
from gna_interp.results import Result
from gna_interp.store import as_path, atomic_write, file_in, read_json, write_json
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import Results, get_metric, results

__all__ = ["FAITHFULNESS_COLUMNS", "Faithfulness", "FaithfulnessConfig", "edge_faithfulness", "faithfulness", "shuffled",
           "size_grid"]

FAITHFULNESS_COLUMNS = ["size", "series", "seed", "logit_diff", "fraction", "low", "high", "accuracy",
                        "accuracy_fraction", "heads"]


@options
class FaithfulnessConfig(Options):
    """How :func:`faithfulness` measures.

    Attributes:
        method: what replaces the heads outside the circuit (``zero`` or ``mean``).
        reference: the prompts (or a Task) whose mean activations ``mean`` ablation uses (None: the task's own).
        sizes: circuit sizes of the curve (None: :func:`size_grid`).
        seeds: random circuits drawn at every size (random orders of all heads).
        random_least: the share of the model's heads below which no random circuit is drawn (default 1/64: on
            SmolLM2's 270 heads, random circuits of 1-4 heads kept -0.009 to 0.008 of the logit difference, what
            the empty circuit keeps, at a forward each; 0: every size of the curve).
        threshold: the fraction of the intact logit difference the smallest circuit must keep.
        n_boot: bootstrap resamples of the intervals; level: their coverage.
        minimality: the smallest circuit's heads (first in the ranking) whose own contribution is measured, one run
            each (None: all of them).
        batch_size: prompts per forward.
        precision: the bisection for the smallest circuit stops once its bracket is within this share of its size
            (0: exact; an edge curve over hundreds of thousands of edges may take 0.02, a circuit at most 2 % larger
            than the smallest of the ranked order).
    """

    method: AblationMethod = "mean"
    reference: Any = None
    sizes: Sequence[int] | None = None
    seeds: int = 3
    random_least: float = 1 / 64
    threshold: float = 0.8
    n_boot: int = N_BOOTSTRAP
    level: float = 0.95
    minimality: int | None = 30
    batch_size: int = 16
    precision: float = 0.0

    def validate(self) -> None:
        if self.method not in ("zero", "mean"):
            raise InputError(f"faithfulness ablates with method 'zero' or 'mean', got {self.method!r}")
        check_int("seeds", self.seeds, 0)
        check_n_boot(self.n_boot)
        check_int("batch_size", self.batch_size, 1)
        if isinstance(self.threshold, bool) or not (0 < float(self.threshold) <= 1):
            raise InputError(f"threshold must be a fraction in (0, 1], got {self.threshold!r}")
        check_level(self.level)
        check_share(self.random_least, "random_least")
        check_int("minimality", self.minimality, 0, allow_none=True)
        check_share(self.precision, "precision")
        if self.sizes is not None:
            for k in self.sizes:
                check_int("each of sizes", k, 0)


def size_grid(n: int) -> list[int]:
    """Circuit sizes from 0 to ``n``: every size up to 4, then doubling, then ``n`` (a random circuit's point costs
    about one forward of the task once it holds more than a few heads)."""
    out, k = list(range(min(n, 4) + 1)), 4
    while k < n:
        k *= 2
        out.append(min(k, n))
    return sorted(set(out))


def edge_grid(n: int) -> list[int]:
    """Edge-circuit sizes from 0 to ``n``: the powers of 4 from a ten-thousandth of the graph on (a pass each; smaller
    circuits of a large graph keep next to nothing: docs/measurements.md, SmolLM2's first 1, 4 and 16 edges), then
    ``n``."""
    least = n / 10_000
    return [0] + [4 ** i for i in range(n.bit_length()) if least <= 4 ** i < n] + [n]


@dataclass
class Faithfulness(Result):
    """A faithfulness curve: per point, the heads kept (all others ablated) and the per-sample results. Saves to
    one JSON file of its own format (:meth:`save` / :meth:`load`, a folder's ``faithfulness.json``); its figure is
    drawn a layer up (:meth:`plot` names it).

    Attributes:
        metric: ``logit_diff`` (the fraction) -- accuracy fractions are reported beside it.
        method: the ablation of the heads (edges) outside each circuit.
        n_heads: the heads (edges, for an edge circuit) of the model the circuits are drawn from (``N``).
        intact, empty: per-sample results of the whole model and of every head (edge) ablated.
        points: ``(series, seed, kept heads or edges, results)``; series ``ranked``, ``random`` or ``smallest``.
        threshold: the fraction the smallest circuit keeps; smallest: its heads or edges (None when no ranked
            circuit does).
        minimality: each member of the smallest circuit: ``m(C) - m(C without it)`` on the logit difference.
        unit: ``heads`` (:func:`faithfulness`) or ``edges`` (:func:`edge_faithfulness`, members
            :class:`~gna_interp.models.graph.Edge`).
        order: for edges, the ranked order (the saved file lists it once; the points are rebuilt from it).
    """

    metric: str
    method: str
    n_heads: int
    intact: Results
    empty: Results
    points: list[tuple[str, int, list[HeadRef], Results]]
    threshold: float = 0.8
    smallest: list[HeadRef] | None = None
    minimality: dict[HeadRef, float] = field(default_factory=dict)
    n_boot: int = N_BOOTSTRAP
    level: float = 0.95
    unit: str = "heads"
    order: list[Any] | None = None  # edges: the ranked order the points are prefixes (or seeded shuffles) of
    scores: dict[Any, float] | None = field(default=None, repr=False)  # edges: each one's screen score (not saved)

    FILE = FAITHFULNESS_JSON
    DRAWN_BY = "gna_interp.viz.faithfulness.faithfulness_curve(fx)"

    # ---- numbers --------------------------------------------------------------------------
    def _fraction(self, kept: Results, name: str) -> float:
        m = get_metric(name)
        full, none = m.value(self.intact), m.value(self.empty)
        return (m.value(kept) - none) / (full - none) if full != none else math.nan

    def fraction(self, kept: Results, metric: str = "logit_diff") -> float:
        """``(m(C) - m(∅)) / (m(M) - m(∅))`` of the results ``kept`` (``metric``: logit_diff or accuracy)."""
        return self._fraction(kept, metric)

    def interval(self, kept: Results) -> tuple[float, float]:
        """Paired bootstrap interval (fixed seed) of the logit-difference fraction at :attr:`level`."""
        m = get_metric("logit_diff")
        n = len(next(iter(self.intact.values())))
        idx = paired_bootstrap(n, self.n_boot)
        full, none = m.resampled(self.intact, idx).double(), m.resampled(self.empty, idx).double()
        frac = (m.resampled(kept, idx).double() - none) / (full - none)
        frac = frac[torch.isfinite(frac)]
        if not len(frac):
            return math.nan, math.nan
        return interval(frac, self.level)

    def to_frame(self) -> pd.DataFrame:
        """One row per point: columns :data:`FAITHFULNESS_COLUMNS` (``logit_diff`` / ``accuracy``: the metric with
        the circuit alone; ``fraction`` with its interval ``low``-``high``; ``accuracy_fraction``)."""
        rows = []
        acc, ld = get_metric("accuracy"), get_metric("logit_diff")
        for series, seed, heads, res in self.points:
            lo, hi = self.interval(res)
            rows.append({"size": len(heads), "series": series, "seed": seed, "logit_diff": ld.value(res),
                         "fraction": self.fraction(res), "low": lo, "high": hi, "accuracy": acc.value(res),
                         "accuracy_fraction": self.fraction(res, "accuracy"),
                         "heads": _listing(heads)})
        frame = pd.DataFrame(rows, columns=FAITHFULNESS_COLUMNS)
        return frame if self.unit == "heads" else frame.rename(columns={"heads": self.unit})

    def curve(self, series: str = "ranked") -> pd.DataFrame:
        """The points of one series (random: the median fraction over seeds at each size, from the empty circuit to
        the whole model, the ends every series shares; none where none was drawn), by size."""
        df = self.to_frame()
        own = df[df.series == series]
        if series == "random" and len(own):  # none drawn: no curve, as before
            ends = df[(df.series == "ranked") & df["size"].isin([0, self.n_heads]) & ~df["size"].isin(own["size"])]
            own = pd.concat([own, ends])
        return own.groupby("size", as_index=False)[["fraction", "accuracy_fraction"]].median().sort_values("size")

    def areas(self, series: str = "ranked") -> dict[str, float]:
        """``cpr``: area under the fraction curve over the circuit's share ``k / N``; ``cmd``: area between the
        curve and 1 (trapezoid rule over the measured sizes)."""
        c = self.curve(series)
        x = torch.tensor(c["size"].to_numpy(dtype=float)) / max(self.n_heads, 1)
        y = torch.tensor(c["fraction"].to_numpy(dtype=float))
        if len(x) < 2:
            return {"cpr": math.nan, "cmd": math.nan}
        return {"cpr": float(torch.trapezoid(y, x)), "cmd": float(torch.trapezoid((1 - y).abs(), x))}

    def summary(self) -> dict[str, Any]:
        """The headline numbers: intact and empty metrics, the smallest circuit (size, heads, fraction, interval,
        accuracy fraction), the areas of the ranked and random curves."""
        ld, acc = get_metric("logit_diff"), get_metric("accuracy")
        out: dict[str, Any] = {"method": self.method, "n_heads": self.n_heads, "threshold": self.threshold,
                               "intact": {"logit_diff": ld.value(self.intact), "accuracy": acc.value(self.intact)},
                               "empty": {"logit_diff": ld.value(self.empty), "accuracy": acc.value(self.empty)},
                               "ranked": self.areas("ranked"), "random": self.areas("random")}
        if self.smallest is not None:
            res = next(r for s, _, h, r in self.points if s == "smallest")
            out["smallest"] = {"size": len(self.smallest), self.unit: [h.name for h in self.smallest],
                               "fraction": self.fraction(res), "interval": list(self.interval(res)),
                               "accuracy_fraction": self.fraction(res, "accuracy"),
                               "minimality": {h.name: v for h, v in self.minimality.items()}}
        return out

    def report(self) -> str:
        """A Markdown summary: the intact and empty metrics, the smallest circuit with its interval and minimality,
        the areas of the ranked and random curves."""
        sm = self.summary()
        u, one = self.unit, self.unit[:-1]
        lines = [f"# Faithfulness ({self.method} ablation of every {one} outside the circuit, {self.n_heads} {u})", "",
                 f"- intact model: logit difference {sm['intact']['logit_diff']:.3f}, accuracy "
                 f"{sm['intact']['accuracy']:.3f}; every {one} ablated: {sm['empty']['logit_diff']:.3f}, "
                 f"{sm['empty']['accuracy']:.3f}"]
        if "smallest" in sm:
            s = sm["smallest"]
            lo, hi = s["interval"]
            lines.append(f"- smallest ranked circuit keeping {self.threshold:.0%} of the logit difference: "
                         f"{s['size']} {u} ({_listing(self.smallest, ', ')}), fraction {s['fraction']:.3f} "
                         f"[{lo:.3f}, {hi:.3f}], accuracy fraction {s['accuracy_fraction']:.3f}")
            if s["minimality"]:
                lines.append(f"- each {one}'s own contribution (logit difference lost when it alone leaves the circuit"
                             + (f"; the first {len(s['minimality'])} of the {s['size']}"
                                if len(s["minimality"]) < s["size"] else "") + "): "
                             + ", ".join(f"{h} {v:+.3f}" for h, v in s["minimality"].items()))
            else:
                lines.append(f"- each {one}'s own contribution: not measured (minimality 0)")
        else:
            lines.append(f"- no ranked circuit measured keeps {self.threshold:.0%} of the logit difference")
        for name in ("ranked", "random"):
            a = sm[name]
            if name == "random" and not any(p[0] == "random" for p in self.points):
                lines.append("- random circuits: none drawn (seeds 0, or no size of the curve reaches random_least)")
                continue
            lines.append(f"- {name} circuits: CPR {a['cpr']:.3f} (area under the curve, higher is better), CMD "
                         f"{a['cmd']:.3f} (area between the curve and 1, lower is better)")
        frame = self.to_frame()
        lines += ["", "| size | series | seed | fraction | interval | accuracy fraction |", "|---|---|---|---|---|---|"]
        for r in frame.itertuples():
            lines.append(f"| {r.size} | {r.series} | {r.seed} | {r.fraction:.3f} | [{r.low:.3f}, {r.high:.3f}] | "
                         f"{r.accuracy_fraction:.3f} |")
        return "\n".join(lines) + "\n"

    def write(self, folder: str | Path, stem: str = FAITHFULNESS) -> list[Path]:
        """``{stem}.json`` (:meth:`save`), ``{stem}.csv`` (:meth:`to_frame`) and ``{stem}.md`` (:meth:`report`) in
        ``folder``, each written atomically and never through a link."""
        out = [self.save(folder, stem)]
        csv, md = as_path(folder) / f"{stem}.csv", as_path(folder) / f"{stem}.md"
        atomic_write(csv, self.to_frame().to_csv(index=False))
        atomic_write(md, self.report())
        return out + [csv, md]

    # ---- storage --------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, stem: str = FAITHFULNESS) -> Path:
        """Write ``{stem}.json`` (everything needed to rebuild this object, :meth:`to_dict`) into the folder ``path``,
        or to ``path`` itself when it names a ``.json`` file; return the file. Strict JSON (a non-finite value is
        written as null), atomic, never through a link."""
        p = as_path(path)
        out = p if p.suffix == ".json" and not p.is_dir() else p / f"{stem}.json"
        return write_json(out, "faithfulness", self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """The document's body: settings, per-sample results of every point, the smallest circuit, its minimality
        and :meth:`summary` (:meth:`save` writes a non-finite value as null, read back as NaN)."""

        def enc(res: Results) -> dict[str, list]:
            return {k: v.tolist() for k, v in res.items()}

        return {"metric": self.metric, "method": self.method, "n_heads": self.n_heads,
                "threshold": self.threshold, "n_boot": self.n_boot, "level": self.level,
                "intact": enc(self.intact), "empty": enc(self.empty),
                "unit": self.unit, "order": [w.name for w in self.order] if self.order is not None else None,
                "points": [{"series": s, "seed": seed, "size": len(hs), "results": enc(r),
                            **({"heads": [h.name for h in hs]} if self.unit == "heads" else {})}
                           for s, seed, hs, r in self.points],
                "smallest": [h.name for h in self.smallest] if self.smallest is not None else None,
                "minimality": {h.name: v for h, v in self.minimality.items()}, "summary": self.summary()}

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Faithfulness":
        """Read what :meth:`save` wrote (a folder: its ``faithfulness.json``, or the json file itself); an
        :class:`InputError` naming the file and what is wrong for a missing, truncated or malformed one."""
        p = file_in(path, cls.FILE)
        doc = read_json(p, "faithfulness")  # checked against its schema (gna_interp.schemas)
        try:
            return cls.from_dict(doc)
        except (KeyError, TypeError, ValueError, IndexError, RuntimeError) as e:
            raise InputError(f"{str(p)!r} is not a valid faithfulness file: {e}; it was edited or comes from another "
                             f"program: rewrite it (rerun gna circuit)") from None

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Faithfulness":
        """The curve :meth:`to_dict` described."""
        from gna_interp.engine.metrics import RESULT_DTYPES

        def dec(d: dict[str, list]) -> Results:
            out = {k: torch.tensor([math.nan if x is None else x for x in v], dtype=RESULT_DTYPES[k])
                   for k, v in d.items()}
            if len({len(v) for v in out.values()}) > 1:
                raise ValueError("the per-sample lists of one point differ in length")
            return out

        unit = doc.get("unit", "heads")
        small = doc["smallest"]
        if unit == "heads":
            parse: Any = HeadRef.parse
            order = None

            def members(pt: dict[str, Any]) -> list[Any]:
                return [HeadRef.parse(h) for h in pt["heads"]]
        else:
            parse = Edge.parse
            order = [Edge.parse(n) for n in doc["order"]]

            def members(pt: dict[str, Any]) -> list[Any]:
                k = int(pt["size"])
                return (shuffled(order, int(pt["seed"])) if pt["series"] == "random" else order)[:k]
        fx = cls(doc["metric"], doc["method"], int(doc["n_heads"]), dec(doc["intact"]), dec(doc["empty"]),
                 [(pt["series"], int(pt["seed"]), members(pt), dec(pt["results"])) for pt in doc["points"]],
                 float(doc["threshold"]), [parse(h) for h in small] if small is not None else None,
                 {parse(k): float(v) for k, v in doc["minimality"].items()}, int(doc["n_boot"]),
                 float(doc["level"]), unit, order)
        _check_curve(fx, [int(pt["size"]) for pt in doc["points"]])
        return fx


def _check_curve(fx: Faithfulness, sizes: list[int]) -> None:
    """Refuse (:class:`InputError`) a curve read back that contradicts itself: points of other samples than the
    intact model's, a point whose size is not its members' count or whose members repeat or exceed the pool of
    ``n_heads``, an edge order that is not the pool's, a smallest circuit without its point (or the other way round)
    or not the point's members, a member's minimality outside the smallest circuit."""
    check_n_boot(fx.n_boot)
    check_level(fx.level)
    n = {len(v) for res in (fx.intact, fx.empty, *(p[3] for p in fx.points)) for v in res.values()}
    if len(n) != 1 or 0 in n:
        raise InputError(f"the points' per-sample lists hold other samples than the intact model's ({sorted(n)})")
    if fx.order is not None and (len(fx.order) != fx.n_heads or len(set(fx.order)) < len(fx.order)):
        raise InputError(f"the edge order lists {len(set(fx.order))} different edges, not the {fx.n_heads} of the pool")
    for i, ((series, _, members, _), size) in enumerate(zip(fx.points, sizes)):
        if size != len(members) or len(set(members)) < size or size > fx.n_heads:
            raise InputError(f"point {i} ({series}) has size {size} but {len(set(members))} different members of a "
                             f"pool of {fx.n_heads}")
    smallest = [p[2] for p in fx.points if p[0] == "smallest"]
    if (fx.smallest is None) != (not smallest) or (smallest and list(smallest[0]) != list(fx.smallest or [])):
        raise InputError("the smallest circuit and the 'smallest' point disagree")
    if not set(fx.minimality) <= set(fx.smallest or []):
        raise InputError("minimality names members outside the smallest circuit")


def _listing(members: Sequence[Any], sep: str = ",", most: int = 60) -> str:
    """Members' names joined by ``sep``; past ``most`` of them, the first ``most`` and how many more."""
    names = [m.name for m in members[:most]]
    more = len(members) - len(names)
    return sep.join(names) + (f"{sep}... ({more} more)" if more > 0 else "")


def shuffled(order: Sequence[Any], seed: int) -> list[Any]:
    """``order`` in the random order of seed ``seed`` (the random circuits of a faithfulness curve)."""
    perm = list(order)
    random.Random(f"gna-faithfulness-{seed}").shuffle(perm)
    return perm


def faithfulness(model: Model, task: Task | SetAblation, ranked: Sequence[HeadRef | str] | GraphScores,
                 config: FaithfulnessConfig | None = None, **overrides: Any) -> Faithfulness:
    """The faithfulness curve of circuits made of the first ``k`` heads of ``ranked`` (every other head of the
    model ablated), ``k`` over ``sizes``, beside ``seeds`` random circuits of each size; the smallest ranked circuit
    keeping ``threshold`` of the intact logit difference and each of its heads' own contribution.

    ``ranked`` orders some or all of the model's heads (a scan's ranking), or is a discovery algorithm's node scores
    (:class:`~gna_interp.circuits.algorithms.GraphScores`, its heads by ``|score|``); heads it leaves out join the
    circuit last, in the model's order, so the curve ends at the whole model. ``config``: a
    :class:`FaithfulnessConfig` or keyword overrides of its fields."""
    from gna_interp.models.model import check_model
    check_model(model)
    cfg = FaithfulnessConfig.build(config, **overrides)
    if isinstance(ranked, GraphScores):
        ranked = ranked.heads()
    every = model.heads()
    order = list(dict.fromkeys(model.check_heads(list(ranked)))) if ranked else []
    listed = set(order)
    order += [h for h in every if h not in listed]
    n = len(every)
    sizes = sorted(set(size_grid(n) if cfg.sizes is None else [int(k) for k in cfg.sizes]) | {0, n})
    if sizes[-1] > n:
        raise InputError(f"a circuit of {sizes[-1]} heads cannot be drawn from the {n} heads of {model.name}")
    reference = cfg.reference
    if cfg.method == "mean" and reference is None and isinstance(task, Task):
        reference = task  # the task's own mean activations
    runner = SetAblation.of(model, task, cfg.method, reference, cfg.batch_size)  # a runner handed in keeps its method

    def series(heads: Sequence[HeadRef], ks: Sequence[int]) -> list[Results]:
        """The circuits ``heads[:k]`` (everything else ablated), ``k`` in ``ks``: their complements are nested,
        largest circuit (smallest complement) first."""
        ks = sorted(set(ks), reverse=True)
        complements = [_outside(every, heads[:k]) for k in ks]
        got = dict(zip(ks, (results(s) for s in runner.run_nested(complements))))
        return [got[k] for k in sorted(set(ks))]

    passes = _Passes()

    def kept(circuit: Sequence[HeadRef]) -> Results:
        """One circuit, its replay kept (:meth:`SetAblation.run_trail`) and started on the smallest kept circuit
        containing it, from the earliest layer of the heads it ablates beyond that one."""
        trail = runner.run_trail(_outside(every, circuit), passes.around(circuit))
        passes.add(circuit, trail)
        return results(trail.scores)

    def each_left_out(circuit: Sequence[HeadRef], members: Sequence[HeadRef]) -> list[Results]:
        """``circuit`` with each of ``members`` left out: one more head ablated each, replayed from its layer on the
        circuit's kept replay."""
        return [results(r) for r in runner.run_added(_outside(every, circuit), members, passes.of(circuit))[1:]]

    return _measure(runner.method, "heads", order, every, sizes, cfg, series, kept, each_left_out,
                    least=float(cfg.random_least))


def edge_faithfulness(model: Model, task: Task, ranked: "pd.DataFrame | Sequence[Edge] | GraphScores | Any",
                      config: FaithfulnessConfig | None = None, senders: str = "heads",
                      first: Collection[str] | None = None, empty: Results | None = None,
                      **overrides: Any) -> Faithfulness:
    """The faithfulness curve of edge circuits: the first ``k`` edges of ``ranked`` kept, every other edge of the
    model's whole graph ablated (:class:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit`), ``k`` over ``sizes``
    (default: :func:`edge_grid`), beside ``seeds`` random edge circuits of each size; the smallest ranked edge circuit
    keeping ``threshold`` of the intact logit difference and each of its edges' own contribution.

    ``ranked``: an :class:`~gna_interp.circuits.edges.edge_screen.EdgeScreen` (or its table) or a discovery algorithm's
    edge scores (:class:`~gna_interp.circuits.algorithms.GraphScores`), ordered by ``|score|`` (the edges of a shared
    KV group's rows add up; edges out of senders a circuit always keeps are left out), or wires in order; edges it
    leaves out join last. ``senders``: which edges a circuit may leave out
    (:class:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit`; default the edges out of heads, the embeddings' and MLPs'
    always kept). ``first``: senders whose edges come before every other edge, each part in its own order -- e.g. the
    heads of the smallest node circuit (:func:`faithfulness`), so that the search for the smallest edge circuit starts
    inside it (every edge out of a node circuit's heads is that node circuit). ``empty``: the task's results with
    every head ablated the same way where already measured (a node curve's size 0, :func:`faithfulness`): with
    ``senders="heads"`` that is the edge curve's size 0 (every edge out of a head ablated), read instead of a pass."""
    from gna_interp.circuits.edges.edge_circuit import EdgeCircuit

    cfg = FaithfulnessConfig.build(config, **overrides)
    ec = EdgeCircuit(model, task, cfg.method, cfg.reference, cfg.batch_size, senders)
    every = ec.wires()
    table = ranked.edge_rows() if isinstance(ranked, GraphScores) else getattr(ranked, "table", ranked)
    if isinstance(table, pd.DataFrame):
        order = list(ec.from_screen(table)["wire"])
    else:
        order = [ec.check(w) for w in ranked]
    order = list(dict.fromkeys(order))
    listed = set(order)
    order += [w for w in every if w not in listed]
    if first:
        lead = {str(getattr(h, "name", h)) for h in first}
        order = [w for w in order if w.sender in lead] + [w for w in order if w.sender not in lead]
    n = len(every)
    grid = edge_grid(n)
    sizes = sorted(set(grid if cfg.sizes is None else [int(k) for k in cfg.sizes]) | {0, n})
    if sizes[-1] > n:
        raise InputError(f"a circuit of {sizes[-1]} edges cannot be drawn from the {n} edges of {model.name}")
    intact = results(ec.clean())

    known = {n: intact, **({0: empty} if empty is not None and senders == "heads" else {})}
    passes = _Passes()

    def kept(circuit: Sequence[Any]) -> Results:
        """One edge circuit, its pass recorded (:meth:`EdgeCircuit.run_recorded`) for its members' contributions."""
        scores, records = ec.run_recorded(circuit)
        passes.add(circuit, records)
        return results(scores)

    def series(wires: Sequence[Any], ks: Sequence[int]) -> list[Results]:
        todo = [k for k in ks if k not in known]
        got = {**known, **dict(zip(todo, (results(r) for r in ec.run([wires[:k] for k in todo]))))}
        return [got[k] for k in ks]

    fx = _measure(cfg.method, "edges", order, every, sizes, cfg, series, kept,
                  lambda circuit, members: [results(r) for r in ec.run_left_out(circuit, members, passes.of(circuit))])
    if isinstance(table, pd.DataFrame):
        ranked_frame = ec.from_screen(table)
        fx.scores = dict(zip(ranked_frame["wire"], ranked_frame["score"]))
    return fx


def _measure(method: str, unit: str, order: list[Any], pool: list[Any], sizes: list[int], cfg: FaithfulnessConfig,
             series: Callable[[Sequence[Any], Sequence[int]], list[Results]],
             kept: Callable[[Sequence[Any]], Results],
             left_out: Callable[[Sequence[Any], Sequence[Any]], list[Results]] | None = None,
             least: float = 0.0) -> Faithfulness:
    """The curve over ``sizes`` of the prefixes of ``order`` and of ``cfg.seeds`` random orders of ``pool`` (those at
    the sizes holding at least ``least`` of the pool), the smallest ranked circuit and its minimality.
    ``series(order, ks)``: the results of ``order[:k]`` kept, everything else ablated; ``kept(members)``: of one
    circuit; ``left_out(circuit, members)``: of ``circuit`` with each of ``members`` left out, where the unit has a
    quicker way than one ``kept`` each."""
    n = len(pool)
    by_size = dict(zip(sizes, series(order, sizes)))
    fx = Faithfulness("logit_diff", method, n, by_size[n], by_size[0], [], float(cfg.threshold), n_boot=cfg.n_boot,
                      level=float(cfg.level), unit=unit, order=order if unit != "heads" else None)
    fx.points += [("ranked", 0, order[:k], by_size[k]) for k in sizes]
    drawn = [k for k in sizes if 0 < k < n and k >= least * n]
    for seed in range(cfg.seeds):
        perm = shuffled(pool, seed)
        for k, res in zip(drawn, series(perm, drawn)):
            fx.points.append(("random", seed, perm[:k], res))
    _smallest(fx, kept, order, by_size, cfg.minimality, float(cfg.precision), left_out)
    return fx


class _Passes:
    """What a search for the smallest circuit keeps of the circuits it runs (a head set's
    :class:`~gna_interp.engine.replay.Trail`, an edge circuit's recorded passes): the latest circuit's and the
    smallest kept one containing it. A bisection's next candidate lies inside its bracket's upper end, which is one
    of the two, and the smallest circuit's members are left out on its own; no other pass serves either."""

    def __init__(self) -> None:
        self.kept: dict[frozenset[Any], Any] = {}

    def around(self, circuit: Collection[Any]) -> Any:
        """The pass of the smallest kept circuit that contains ``circuit`` (None: none)."""
        c = frozenset(circuit)
        inside = [k for k in self.kept if c <= k]
        return self.kept[min(inside, key=len)] if inside else None

    def of(self, circuit: Collection[Any]) -> Any:
        """The pass of ``circuit`` itself, where kept (else None)."""
        return self.kept.get(frozenset(circuit))

    def add(self, circuit: Collection[Any], run: Any) -> None:
        """Keep ``run``, the pass of ``circuit``, and drop every other pass but the smallest kept one containing it."""
        c = frozenset(circuit)
        inside = [k for k in self.kept if c < k]
        keep = {c: run} if run is not None else {}
        if inside:
            k = min(inside, key=len)
            keep[k] = self.kept[k]
        self.kept = keep


def _outside(every: list[HeadRef], circuit: Sequence[HeadRef]) -> list[HeadRef]:
    """The heads of ``every`` outside ``circuit`` (those a faithfulness run ablates), in model order."""
    kept = set(circuit)
    return [h for h in every if h not in kept]


def _smallest(fx: Faithfulness, run: Callable[[Sequence[Any]], Results], order: list[Any],
              by_size: dict[int, Results], minimality: int | None, precision: float = 0.0,
              left_out: Callable[[Sequence[Any], Sequence[Any]], list[Results]] | None = None) -> None:
    """The smallest ``k`` whose ranked circuit keeps the threshold (grid, then bisection between the bracketing
    sizes, assuming the fraction grows with ``k`` between them, until the bracket is within ``precision`` of its
    upper end), and the minimality of its first ``minimality`` members."""

    def kept(k: int) -> Results:
        if k not in by_size:
            by_size[k] = run(order[:k])
        return by_size[k]

    ok = [k for k in sorted(by_size) if fx.fraction(by_size[k]) >= fx.threshold]
    if not ok:
        return
    hi = ok[0]
    lo = max((k for k in by_size if k < hi), default=hi)
    while hi - lo > max(1, int(precision * hi)):
        mid = (lo + hi) // 2
        if fx.fraction(kept(mid)) >= fx.threshold:
            hi = mid
        else:
            lo = mid
    circuit = order[:hi]
    fx.smallest = circuit
    res = kept(hi)
    fx.points.append(("smallest", 0, circuit, res))
    ld = get_metric("logit_diff")
    members = circuit[:minimality]
    withouts = (left_out(circuit, members) if left_out is not None and members
                else [run([x for x in circuit if x != h]) for h in members])
    for h, without in zip(members, withouts):
        fx.minimality[h] = ld.value(res) - ld.value(without)
