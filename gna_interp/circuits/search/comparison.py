"""`compare_circuits`: do two circuits of one model (e.g. KV retrieval and multiple-choice letters) run
through the same heads?

The paper's claim is that MMLU letters and KV retrieval share their G&A heads. Three measurements:

- **overlap** of the two circuits' top ``k`` (and top 10) heads;
- **rank correlation** (Spearman) of the two scans' drops over the heads both ran exactly (all heads
  when fewer than three are shared and both scans measure the logit difference, ranking the others by
  their estimates);
- **cross-removal**: each task's accuracy intact, with circuit A's top ``k`` removed, with circuit B's
  top ``k`` removed, and with ``k`` random heads (in neither top ``k``) removed: the median over
  ``seeds`` draws (the same draws on both tasks; each draw's accuracies are in ``metrics["random_draws"]``). Shared heads show as each circuit hurting the *other* task far more than random heads do.
"""

from __future__ import annotations

import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gna_interp.constants import COMPARE_CSV, COMPARE_JSON, COMPARE_MD
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.curve import random_orders
from gna_interp.errors import InputError
from gna_interp.html_repr import fmt
from gna_interp.options import check_int
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, check_model
from gna_interp.results import Result, folder_of
from gna_interp.store import as_path, atomic_write, make_folder
from gna_interp.engine.replay import FORWARDS, SetAblation

__all__ = ["CircuitComparison", "compare_circuits"]

COLUMNS = ["task", "removed", "accuracy", "drop", "heads"]


@dataclass
class CircuitComparison(Result):
    """Result of :func:`compare_circuits`.

    ``rows`` (:meth:`to_frame`) has one row per (task, removed set): ``task`` (``A`` or ``B`` and its
    name), ``removed`` (``none``, ``A top k``, ``B top k``, ``random k`` = the median draw), ``accuracy``,
    ``drop`` (from intact) and the ``heads`` removed; ``metrics`` the overlap and rank correlation. A folder result
    (:meth:`save`: ``compare.json``, ``.csv``, ``.md``; :meth:`load`); no figure.
    """

    names: tuple[str, str]
    k: int
    metrics: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)

    FORMAT = "comparison"
    FILE = COMPARE_JSON

    @property
    def heads(self) -> list[HeadRef]:
        """The heads in both circuits' top ``k``."""
        return [HeadRef.parse(n) for n in self.metrics["shared_top_k"]]

    def to_frame(self) -> pd.DataFrame:
        """One row per (task, removed set): :data:`COLUMNS`."""
        return pd.DataFrame(self.rows, columns=COLUMNS)

    def to_dict(self) -> dict[str, Any]:
        """The ``comparison`` document's body (``compare.json``)."""
        return {"names": list(self.names), "k": self.k, "metrics": self.metrics, "rows": self.rows}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CircuitComparison":
        """The comparison :meth:`to_dict` described."""
        return cls(tuple(d["names"]), int(d["k"]), dict(d["metrics"]), list(d["rows"]))  # type: ignore[arg-type]

    def _repr_title(self) -> tuple[str, str]:
        return f"Circuits compared: A = {self.names[0]}, B = {self.names[1]}", f"top {self.k} heads"

    def _repr_facts(self) -> list[tuple[str, Any]]:
        m = self.metrics
        shared = ", ".join(m.get("shared_top_k") or []) or "none"
        return [("top-k overlap", f"{m.get('top_k_overlap')}/{self.k} ({shared})"),
                ("Spearman of the drops", f"{fmt(m.get('spearman'))} over {m.get('n_ranked')} heads")]

    def summary(self) -> str:
        """Markdown: the overlap, the correlation and the cross-removal table."""
        m = self.metrics
        lines = [f"# Circuits compared: A = {self.names[0]}, B = {self.names[1]}", "",
                 f"- top-{self.k} overlap: {m['top_k_overlap']}/{self.k} ({', '.join(m['shared_top_k']) or 'none'}); "
                 f"top-10 overlap: {m['top10_overlap']}/10",
                 f"- Spearman rank correlation of the drops: {_fmt(m['spearman'])} over {m['n_ranked']} heads "
                 f"({m['ranked_on']})", "",
                 "| task | removed | accuracy | drop | heads |", "|---|---|---:|---:|---|"]
        lines += [f"| {r['task']} | {r['removed']} | {r['accuracy']:.3f} | {r['drop']:.3f} | {r['heads']} |"
                  for r in self.rows]
        return "\n".join(lines) + "\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write ``compare.json``, ``compare.csv`` and ``compare.md`` into the folder ``path`` (or the folder of
        ``path`` naming its ``compare.json``); return the folder. :meth:`load` reads the folder or the file."""
        d = folder_of(path, COMPARE_JSON)
        make_folder(d)
        atomic_write(d / COMPARE_CSV, self.to_frame().to_csv(index=False))
        atomic_write(d / COMPARE_MD, self.summary())
        self._write(d)
        return d


def _fmt(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.2f}"


def _drops(c: Circuit) -> pd.Series:
    df = c.scan.to_frame().set_index("name")
    return df["drop"].where(df["source"] == "exact", df["est_drop"])


def check_comparable(a: Circuit, b: Circuit, k: int = 5, seeds: int = 6,
                     batch_size: int = 16) -> tuple[list[HeadRef], list[HeadRef], list[HeadRef]]:
    """What two circuits alone decide (:class:`InputError` otherwise, before any model loads): one model, ``k`` heads
    in each, at least ``k`` heads outside both tops for the random draws. Returns both tops and that pool."""
    for name, value in (("k", k), ("seeds", seeds), ("batch_size", batch_size)):
        check_int(name, value, 1)
    if a.model != b.model:
        raise InputError(f"the circuits come from different models ({a.model!r} and {b.model!r}); compare circuits "
                         f"of one model")
    top_a, top_b = a.heads[:k], b.heads[:k]
    if len(top_a) < k or len(top_b) < k:
        raise InputError(f"a circuit has fewer than k={k} heads ({len(top_a)} and {len(top_b)}); pass a smaller k")
    pool = [h for h in a.scan.heads if h in set(b.scan.heads) and h not in set(top_a) | set(top_b)]
    if len(pool) < k:
        raise InputError(f"only {len(pool)} heads lie outside both circuits' top {k}: too few for random draws")
    return list(top_a), list(top_b), pool


def compare_circuits(model: Model, a: Circuit | str | os.PathLike, b: Circuit | str | os.PathLike, k: int = 5,
                     seeds: int = 6, batch_size: int = 16) -> CircuitComparison:
    """Compare circuits ``a`` and ``b`` of ``model`` (see the module docstring): overlap of their top
    ``k``, rank correlation of their scans, and each task's accuracy with either circuit's top ``k``
    or ``k`` random heads removed (zero ablation). ``a`` and ``b`` are :class:`Circuit` objects or the folders they
    were saved to."""
    check_model(model)
    a, b = (c if isinstance(c, Circuit) else Circuit.load(as_path(c, f"circuit {name} (a Circuit or its folder)"))
            for c, name in ((a, "a"), (b, "b")))
    top_a, top_b, pool = check_comparable(a, b, k, seeds, batch_size)
    shared = [h for h in top_a if h in set(top_b)]
    both = [h for h in a.scan.heads if h in a.scan.exact and h in b.scan.exact]
    da, db = _drops(a), _drops(b)
    same_units = a.scan.metric == b.scan.metric == "logit_diff"  # estimates are logit differences
    names = [h.name for h in both] if len(both) >= 3 or not same_units else [n for n in da.index if n in db.index]
    rho = float(da[names].rank().corr(db[names].rank())) if len(names) >= 3 else math.nan
    metrics = {"top_k_overlap": len(shared), "shared_top_k": [h.name for h in shared],
               "top10_overlap": len(set(a.heads[:10]) & set(b.heads[:10])), "spearman": rho, "n_ranked": len(names),
               "ranked_on": "heads run exactly in both scans" if len(both) >= 3 else "all heads (estimates included)"}
    draws = [order[:k] for order in random_orders(pool, seeds)]
    out = CircuitComparison((a.task.get("name", "A"), b.task.get("name", "B")), k, metrics)
    for label, circuit in (("A", a), ("B", b)):
        task = circuit.load_task()
        runner = SetAblation(model, task, batch_size=batch_size, replays=FORWARDS)

        def acc(heads: list[HeadRef]) -> float:
            return runner.run(heads).metrics["accuracy"]

        intact = acc([])
        rnd = [acc(d) for d in draws]
        metrics.setdefault("random_draws", [{"heads": ",".join(h.name for h in d)} for d in draws])
        for entry, value in zip(metrics["random_draws"], rnd):
            entry[label] = value
        for removed, value, heads in (("none", intact, "none"), (f"A top {k}", acc(top_a), _names(top_a)),
                                      (f"B top {k}", acc(top_b), _names(top_b)),
                                      (f"random {k} (median of {seeds})", statistics.median(rnd),
                                       "the draws in compare.json")):
            out.rows.append({"task": f"{label}: {task.name}", "removed": removed, "accuracy": value,
                             "drop": intact - value, "heads": heads})
    return out


def _names(heads: list[HeadRef]) -> str:
    return ",".join(h.name for h in heads)
