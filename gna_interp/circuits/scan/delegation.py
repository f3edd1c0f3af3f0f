"""Delegation, measured: which G&A role a hybrid's attention heads and its SSM heads take, and what removing
each kind's Aggregate heads costs on retrieval against knowledge (the paper's Zamba2 table).

The paper's third claim: a hybrid hands the Aggregate role to its few attention layers, so removing its
attention aggregate heads collapses retrieval (MMLU letters, KV) while knowledge benchmarks barely move.
:func:`delegation` measures both halves on any hybrid:

1. **roles per kind** -- every head's :func:`~gna_interp.circuits.scan.roles.role_scores` (each read at its
   summary offset: SSM convolutions carry a line a few tokens past its end), grouped by head kind
   (attention vs Mamba-2 heads, ...): heads scored, heads labelled gather / aggregate / other, and the mean
   and max of ``gather``, ``aggregate`` and ``selectivity`` over the kind's heads;
2. **removal** -- for each kind with aggregate heads, all of them removed together (zero ablation unless
   ``method`` says otherwise; :class:`~gna_interp.engine.replay.SetAblation`), against the same number of
   random heads of the same kind that are not aggregate heads (``seeds`` distinct draws, every possible
   draw when there are fewer), scored on the retrieval ``task`` (accuracy, logit difference) and on a
   ``knowledge`` task that needs no in-context retrieval: by default the LM loss on neutral prose of
   :func:`~gna_interp.circuits.scan.specificity.control_task` (nats/token; a word-level zoo vocabulary cannot
   represent it, and the knowledge half is then left out with a note), or any task given -- e.g. the
   cloze form of multiple-choice letters, scored by accuracy.

Tables (:class:`Delegation`): ``to_frame()`` one row per kind, :data:`KIND_COLUMNS`; ``removal`` one row per
measured set, :data:`REMOVAL_COLUMNS` (``series`` ``intact``, ``aggregate`` or ``random``); ``roles`` the
per-head scores. Saved as ``delegation.json`` (format ``delegation``) and ``delegation.csv``.
"""

from __future__ import annotations

import itertools
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.constants import DELEGATION_CSV, DELEGATION_JSON
from gna_interp.engine.replay import SetAblation
from gna_interp.circuits.scan.roles import RoleRule, role_scores
from gna_interp.circuits.scan.specificity import control_task
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, check_model
from gna_interp.options import Options, options
from gna_interp.results import Result, folder_of
from gna_interp.store import atomic_write, make_folder, records
from gna_interp.tasks.base import Task
from gna_interp.engine.plan import CandidateScores
from gna_interp.engine.metrics import ACCURACY, raw
from gna_interp.tasks.text import lm_loss
from gna_interp.templates import part


FORMAT = "delegation"
ROLE_COLUMNS = ["name", "layer", "head", "kind", "offset", "gather", "aggregate", "selectivity", "role"]
KIND_COLUMNS = ["kind", "title", "attention", "heads", "scored", "gather_heads", "aggregate_heads", "other_heads",
                "gather_mean", "gather_max", "aggregate_mean", "aggregate_max", "selectivity_mean", "selectivity_max",
                "removed", "retrieval_intact", "retrieval_removed", "retrieval_random", "knowledge_intact",
                "knowledge_removed", "knowledge_random", "random_draws"]
REMOVAL_COLUMNS = ["kind", "series", "seed", "n_heads", "heads", "accuracy", "logit_diff", "knowledge"]

__all__ = ["Delegation", "DelegationConfig", "KIND_COLUMNS", "REMOVAL_COLUMNS", "delegation", "is_hybrid"]


def is_hybrid(model: Model) -> bool:
    """Whether ``model`` has both attention heads (softmax patterns) and SSM heads (implicit attention)."""
    soft = {h.adapter.normalized_rows for h in model.default_heads()}
    return soft == {True, False}


@dataclass
class Delegation(Result):
    """Result of :func:`delegation` (see the module docstring for the tables): a folder result (:meth:`save` /
    :meth:`load`); its figure is drawn a layer up (:meth:`plot` names it).

    Attributes:
        model: the model's name; task: the retrieval task (``Task.to_dict``).
        knowledge: ``{"name", "metric", "n_samples"}`` of the knowledge task (``metric``: ``lm_loss`` in
            nats/token, lower is better, or ``accuracy``), None when none was measured.
        chance: the retrieval task's chance accuracy.
        roles, kinds, removal: per-head role scores, the per-kind table, the measured removals.
        settings: the options of the run; notes: sentences about it (what was left out and why).
    """

    model: str
    task: dict[str, Any]
    knowledge: dict[str, Any] | None
    chance: float
    roles: pd.DataFrame
    kinds: pd.DataFrame
    removal: pd.DataFrame
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0

    FORMAT = FORMAT
    FILE = DELEGATION_JSON
    DRAWN_BY = "gna_interp.viz.delegation.delegation_figure(delegation)"

    def to_frame(self) -> pd.DataFrame:
        """The per-kind table, :data:`KIND_COLUMNS`."""
        return self.kinds.copy()

    @property
    def metrics(self) -> dict[str, dict[str, Any]]:
        """Per kind: aggregate heads, and retrieval / knowledge intact, with them removed, with random heads."""
        keys = ("aggregate_heads", "retrieval_intact", "retrieval_removed", "retrieval_random", "knowledge_intact",
                "knowledge_removed", "knowledge_random")
        return {r["kind"]: {k: r[k] for k in keys} for _, r in self.kinds.iterrows()}

    def summary(self) -> str:
        """A few lines: roles per kind, then what removing each kind's aggregate heads costs."""
        metric = self.knowledge["metric"] if self.knowledge else None
        lines = [f"Delegation in {self.model} on {self.task.get('name')} ({self.task.get('n_samples')} samples, chance "
                 f"{self.chance:.3f}):"]
        for _, r in self.kinds.iterrows():
            lines.append(f"  {r['title']} ({int(r['heads'])}, {int(r['scored'])} scored): {int(r['aggregate_heads'])} "
                         f"aggregate, {int(r['gather_heads'])} gather, {int(r['other_heads'])} other; aggregate mean "
                         f"{_f(r['aggregate_mean'])} max {_f(r['aggregate_max'])}, selectivity mean "
                         f"{_f(r['selectivity_mean'])} max {_f(r['selectivity_max'])}, gather mean {_f(r['gather_mean'])} "
                         f"max {_f(r['gather_max'])}")
        for _, r in self.kinds.iterrows():
            if not r["aggregate_heads"]:
                continue
            n = int(r["aggregate_heads"])
            rnd = (f"; {n} random {r['title']}: {_f(r['retrieval_random'])} (median of {int(r['random_draws'])} "
                   f"draw{'s' if r['random_draws'] != 1 else ''})" if r["random_draws"] else "; no other heads of this "
                   "kind to draw random ones from")
            lines.append(f"  removing the {n} aggregate {r['title']} ({r['removed']}): retrieval accuracy "
                         f"{_f(r['retrieval_intact'])} -> {_f(r['retrieval_removed'])}{rnd}")
            if metric:
                krnd = f", random {_f(r['knowledge_random'])}" if r["random_draws"] else ""
                lines.append(f"    knowledge ({self.knowledge['name']}, {metric}): {_f(r['knowledge_intact'])} -> "
                             f"{_f(r['knowledge_removed'])}{krnd}")
        if not self.kinds["aggregate_heads"].any():
            lines.append("  no head of any kind is labelled aggregate: nothing to remove")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def to_dict(self) -> dict[str, Any]:
        """The JSON-able result (``delegation.json``)."""
        return {"model": self.model, "task": self.task, "knowledge": self.knowledge, "chance": self.chance,
                "roles": records(self.roles), "kinds": records(self.kinds), "removal": records(self.removal),
                "settings": self.settings, "notes": list(self.notes), "seconds": round(self.seconds, 2)}

    def save(self, path: str | os.PathLike, run_id: str | None = None) -> Path:
        """Write ``delegation.json`` and ``delegation.csv`` (the per-kind table) into the folder ``path`` (or the
        folder of ``path`` naming its ``delegation.json``); return the folder."""
        d = folder_of(path, DELEGATION_JSON)
        make_folder(d)
        atomic_write(d / DELEGATION_CSV, self.kinds.to_csv(index=False))
        self._write(d, **({"run_id": run_id} if run_id else {}))
        return d

    @classmethod
    def load(cls, path: str | os.PathLike, run_id: str | None = None) -> "Delegation":
        """Read a result written by :meth:`save` (the folder or its ``delegation.json``; given ``run_id``, the
        document must carry it)."""
        return cls._read(path, run_id)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Delegation":
        """The result :meth:`to_dict` described."""

        def frame(key: str, columns: list[str], text: tuple[str, ...]) -> pd.DataFrame:
            df = pd.DataFrame(doc[key], columns=columns)
            for c in columns:  # JSON null -> NaN, also in a column that holds nothing else
                if c not in text:
                    df[c] = pd.to_numeric(df[c]).astype(float) if df[c].isna().any() else pd.to_numeric(df[c])
            return df

        return cls(doc["model"], doc["task"], doc.get("knowledge"), float(doc["chance"]),
                   frame("roles", ROLE_COLUMNS, ("name", "kind", "role")),
                   frame("kinds", KIND_COLUMNS, ("kind", "title", "removed", "attention")),
                   frame("removal", REMOVAL_COLUMNS, ("kind", "series", "heads")), dict(doc.get("settings") or {}),
                   list(doc.get("notes") or []), float(doc.get("seconds") or 0.0))

    def _repr_html_(self) -> str:
        
        cols = ["title", "heads", "aggregate_heads", "gather_heads", "retrieval_intact", "retrieval_removed",
                "retrieval_random", "knowledge_intact", "knowledge_removed"]
        rows = [[_f(r[c]) if isinstance(r[c], float) else str(r[c]) for c in cols] for _, r in self.kinds.iterrows()]
        return part("lead", f"Delegation in {self.model}") + part("table", cols, rows)

    def __repr__(self) -> str:
        parts = [f"{k}: {v['aggregate_heads']} aggregate" for k, v in self.metrics.items()]
        return f"Delegation({self.model!r}, {'; '.join(parts)})"


def _f(v: Any, digits: int = 3) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.{digits}f}"


def _draws(pool: Sequence[HeadRef], k: int, seeds: int, salt: str) -> list[list[HeadRef]]:
    """``seeds`` distinct random ``k``-head subsets of ``pool`` (every subset when there are no more than
    ``seeds``), each sorted by layer and head; seeded by ``salt``."""
    pool = sorted(pool, key=lambda h: (h.layer, h.head))
    if k < 1 or k > len(pool) or seeds < 1:
        return []
    if math.comb(len(pool), k) <= seeds:
        return [list(c) for c in itertools.combinations(pool, k)]
    rng = random.Random(f"gna-delegation-{salt}")
    out: list[list[HeadRef]] = []
    seen: set[tuple[HeadRef, ...]] = set()
    while len(out) < seeds:
        pick = tuple(sorted(rng.sample(pool, k), key=lambda h: (h.layer, h.head)))
        if pick not in seen:
            seen.add(pick)
            out.append(list(pick))
    return out


def _knowledge(model: Model, knowledge: Task | str | None, notes: list[str]) -> Task | None:
    if knowledge is None:
        notes.append("no knowledge task measured (knowledge=None)")
        return None
    if isinstance(knowledge, str):
        if knowledge != "auto":
            raise InputError(f"knowledge must be a Task, 'auto' (the LM loss on neutral prose) or None, got {knowledge!r}")
        task, note = control_task(model)
        notes.append(f"knowledge: {note}" if task is not None else
                     f"no knowledge task: {model.name} cannot score the neutral prose of the default LM-loss control "
                     f"(circuits.scan.specificity.control_task says why); pass knowledge=TASK, e.g. the cloze form of a "
                     f"multiple-choice task, to measure one")
        return task
    if not isinstance(knowledge, Task):
        raise InputError(f"knowledge must be a Task, 'auto' or None, got {type(knowledge).__name__}")
    return knowledge


def _value(scores: CandidateScores, metric: str) -> float:
    return lm_loss(scores) if metric == "lm_loss" else ACCURACY.value(raw(scores))


@options
class DelegationConfig(Options):
    """How :func:`delegation` measures.

    Attributes:
        seeds: random draws per kind.
        n_samples: samples the role scores are measured on (when computed here; also ``rule``, ``form``).
        rule: the role rule.
        form: SSM implicit-attention form of the role scores.
        method: the ablation (:class:`~gna_interp.engine.replay.SetAblation`); ``reference``: the mean /
            resample ablation's reference task.
        batch_size: prompts per forward.
    """

    seeds: int = 5
    n_samples: int = 8
    rule: RoleRule = field(default_factory=RoleRule)
    form: str = "exact"
    method: AblationMethod = "zero"
    reference: Any = None
    batch_size: int = 16

    def validate(self) -> None:
        for name, lo in (("seeds", 0), ("n_samples", 1), ("batch_size", 1)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise InputError(f"{name} must be an integer >= {lo}, got {v!r}")


def delegation(model: Model, task: Task | None = None, knowledge: Task | str | None = "auto", *,
               roles: pd.DataFrame | None = None, runner: SetAblation | None = None,
               config: DelegationConfig | None = None, **overrides: Any) -> Delegation:
    """Which role each head kind of hybrid ``model`` takes on retrieval ``task``, and what removing each kind's
    aggregate heads costs on ``task`` and on ``knowledge`` against random heads of the kind (module doc).

    Args:
        model: a model with attention and SSM heads (:func:`is_hybrid`).
        task: the retrieval task (a task with segments, e.g. ``KVRetrieval``).
        knowledge: a task needing no in-context retrieval (accuracy; a task whose samples have one
            candidate each, like :class:`~gna_interp.tasks.text.NeutralText`, by LM loss), ``"auto"`` (the
            neutral-prose LM loss when the model can represent it) or None.
        roles: role scores to use (:func:`~gna_interp.circuits.scan.roles.role_scores`' frame, e.g. a circuit's
            ``roles``; recomputed when they lack summary offsets).
        runner: a :class:`~gna_interp.engine.replay.SetAblation` made for ``task`` with that method, to reuse
            its clean prefixes.
        config: a :class:`DelegationConfig`, or keyword overrides of its fields (``seeds=3``, ``rule=...``).
    """
    check_model(model)
    cfg = DelegationConfig.build(config, **overrides)
    start = time.perf_counter()
    task = _check_inputs(model, task)
    notes: list[str] = []
    roles = _roles(model, task, roles, cfg, notes)
    ktask = _knowledge(model, knowledge, notes)
    metric = None
    if ktask is not None:
        metric = "lm_loss" if all(len(s.candidates) == 1 for s in ktask.samples) else "accuracy"
    measure = _Removals(SetAblation.of(model, runner if runner is not None else task, cfg.method, cfg.reference,
                                       cfg.batch_size),
                        SetAblation(model, ktask, cfg.method, cfg.reference, cfg.batch_size) if ktask is not None
                        else None, metric)
    intact = measure("", "intact", -1, [])
    by_kind: dict[str, list[HeadRef]] = {}  # attention kinds first
    for h in model.default_heads():
        by_kind.setdefault(h.kind, []).append(h)
    table = [_kind_row(model, kind, members, roles, intact, measure, cfg.seeds, notes)
             for kind, members in sorted(by_kind.items(), key=lambda kv: not kv[1][0].adapter.normalized_rows)]
    removal = pd.DataFrame(measure.rows, columns=REMOVAL_COLUMNS)
    settings = {"seeds": cfg.seeds, "method": cfg.method, "n_samples": cfg.n_samples, "form": cfg.form,
                "rule": cfg.rule.to_dict(), "batch_size": cfg.batch_size}
    return Delegation(model.name, task.to_dict(), {"name": ktask.name, "metric": metric, "n_samples": len(ktask)}
                      if ktask is not None else None, task.chance, roles, pd.DataFrame(table, columns=KIND_COLUMNS),
                      removal, settings, notes, time.perf_counter() - start)


def _check_inputs(model: Model, task: Task | None) -> Task:
    """``task``, after refusing what delegation cannot measure: no loaded model, no retrieval task, a model that is
    not a hybrid."""
    if not isinstance(model, Model):
        raise InputError(f"delegation needs a loaded Model, got {type(model).__name__}")
    if task is None:
        raise InputError("delegation needs a retrieval task (e.g. KVRetrieval(10, 24); a circuit's: "
                         "circuit.load_task())")
    if not isinstance(task, Task):
        raise InputError(f"delegation needs a Task with segments (e.g. KVRetrieval), got {type(task).__name__}")
    if not is_hybrid(model):
        kinds = sorted({h.kind for h in model.default_heads()})
        raise InputError(f"delegation compares the attention and SSM heads of a hybrid; {model.name} has only "
                         f"{'/'.join(kinds)} heads (use role_scores or discover for it)")
    return task


def _roles(model: Model, task: Task, roles: pd.DataFrame | None, cfg: DelegationConfig,
           notes: list[str]) -> pd.DataFrame:
    """The role scores to use: ``roles`` when they carry summary offsets, else measured here."""
    if roles is not None and "offset" not in roles:
        notes.append("the given role scores were computed without summary offsets; recomputed here")
        roles = None
    if roles is None:
        roles = role_scores(model, task, heads=model.default_heads(), n_samples=cfg.n_samples,
                            batch_size=min(cfg.batch_size, 8), form=cfg.form, rule=cfg.rule)
    missing = [c for c in ROLE_COLUMNS if c not in roles]
    if missing:
        raise InputError(f"role scores lack the columns {missing}; pass the frame role_scores returns")
    return roles[ROLE_COLUMNS].reset_index(drop=True)


@dataclass
class _Removals:
    """Measures a head set removed on the retrieval task (``runner``) and on the knowledge task (``knowledge``,
    by ``metric``); keeps every measured row."""

    runner: SetAblation
    knowledge: SetAblation | None
    metric: str | None
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, kind: str, series: str, seed: int, hs: Sequence[HeadRef]) -> dict[str, Any]:
        m = self.runner.run(hs).metrics
        row = {"kind": kind, "series": series, "seed": seed, "n_heads": len(hs), "heads": ",".join(h.name for h in hs),
               "accuracy": float(m["accuracy"]), "logit_diff": float(m["logit_diff"]),
               "knowledge": _value(self.knowledge.run(hs), self.metric)
               if self.knowledge is not None and self.metric else math.nan}
        self.rows.append(row)
        return row


def _kind_row(model: Model, kind: str, members: list[HeadRef], roles: pd.DataFrame, intact: dict[str, Any],
              measure: _Removals, seeds: int, notes: list[str]) -> dict[str, Any]:
    """One head kind's row of :data:`KIND_COLUMNS`: its role counts and scores, and what removing its aggregate
    heads costs against ``seeds`` random draws of as many other heads of the kind."""
    adapter = members[0].adapter
    mine = roles[roles["kind"] == kind]
    agg = [HeadRef.parse(n) for n in mine.loc[mine["role"] == "aggregate", "name"]]
    agg = model.check_heads(agg) if agg else []
    row: dict[str, Any] = {
        "kind": kind, "title": adapter.title, "attention": bool(adapter.normalized_rows), "heads": len(members),
        "scored": len(mine), "gather_heads": int((mine["role"] == "gather").sum()), "aggregate_heads": len(agg),
        "other_heads": int((~mine["role"].isin(["gather", "aggregate"])).sum()),
        **{f"{c}_{s}": float(getattr(mine[c], s)()) if len(mine) else math.nan
           for c in ("gather", "aggregate", "selectivity") for s in ("mean", "max")},
        "removed": ",".join(h.name for h in agg), "retrieval_intact": intact["accuracy"],
        "knowledge_intact": intact["knowledge"], "retrieval_removed": math.nan, "knowledge_removed": math.nan,
        "retrieval_random": math.nan, "knowledge_random": math.nan, "random_draws": 0}
    if len(mine) < len(members):
        notes.append(f"{len(members) - len(mine)} of the {len(members)} {adapter.title} have no role scores (not "
                     f"among the scored heads); they count as non-aggregate")
    if not agg:
        return row
    removed = measure(kind, "aggregate", -1, agg)
    row["retrieval_removed"], row["knowledge_removed"] = removed["accuracy"], removed["knowledge"]
    taken = set(agg)
    draws = _draws([h for h in members if h not in taken], len(agg), seeds, kind)
    if seeds and not draws:
        notes.append(f"{adapter.title}: {len(agg)} aggregate heads of {len(members)}, too few others to draw "
                     f"{len(agg)} random ones from")
    elif len(draws) < seeds:
        notes.append(f"{adapter.title}: only {len(draws)} distinct random draw{'s' if len(draws) > 1 else ''} "
                     f"of {len(agg)} heads exist{'s' if len(draws) == 1 else ''} (asked for {seeds})")
    got = [measure(kind, "random", s, d) for s, d in enumerate(draws)]
    if got:
        row["retrieval_random"] = float(pd.Series([g["accuracy"] for g in got]).median())
        row["knowledge_random"] = float(pd.Series([g["knowledge"] for g in got]).median())
    row["random_draws"] = len(got)
    return row
