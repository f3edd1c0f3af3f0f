"""`discover(model, task)`: the G&A circuit of a model on a task, found in stages.

Each stage is a small function of one :class:`_Discovery` (the model, the task and its one
:class:`~gna_interp.engine.replay.SetAblation` -- one scoring plan and one set of clean prefixes -- the
control task and its runner, the circuit so far, the notes and the stage timings), run in this order:

==============  ========================================================================================
stage           what it adds
==============  ========================================================================================
``check``       the intact model's accuracy against chance (a task the model fails is refused); after the scan
                when calibration found the task's form solved (its clean pass is then the scan's attribution pass)
``scan``        every head's drop (:func:`~gna_interp.circuits.scan.scan_heads`)
``formats``     the same heads on other retrieval formats (when given; :mod:`~gna_interp.circuits.search.formats`)
``roles``       gather / aggregate scores of the best-ranked heads (:func:`~gna_interp.circuits.scan.roles.role_scores`)
``control``     every head's LM-loss rise on neutral prose; generic heads (:mod:`~gna_interp.circuits.scan.specificity`)
``curve``       the top k removed together against k random heads (:func:`~gna_interp.circuits.search.curve.ablation_curve`)
``paths``       the edge table among the top ``paths`` heads and their causal roles (:mod:`~gna_interp.circuits.edges.causal`)
``twin``        the knowledge twin with the curve's heads removed (when given)
``delegation``  on a hybrid, which head kind takes which role (:mod:`~gna_interp.circuits.scan.delegation`)
``views``       the card heads' and every head's patterns for the report (:func:`~gna_interp.circuits.search.views.card_views`)
==============  ========================================================================================
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from gna_interp.engine.profile import Cost, Meter
from gna_interp.constants import CONTROL_SUFFIX, format_scan
from gna_interp.circuits.edges.causal import measure_edges
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.curve import CURVE_COLUMNS, ablation_curve, curve_k
from gna_interp.circuits.scan.delegation import delegation, is_hybrid
from gna_interp.circuits.search.formats import cross_format
from gna_interp.engine.replay import SetAblation, shared_prefixes
from gna_interp.circuits.scan.roles import RoleRule, role_scores
from gna_interp.circuits.scan import ScanConfig, scan_heads
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.circuits.scan.specificity import DEFAULT_GENERIC_FRACTION, control_task
from gna_interp.circuits.search.views import card_views
from gna_interp.errors import InputError, OptionError, UnsupportedArchitectureError
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_choice, check_int, check_names, options
from gna_interp.tasks.base import Task
from gna_interp.tasks.calibration import chance_margin
from gna_interp.tasks.choice import ChosenTask, TaskChoice, choose_task
from gna_interp.tasks.evaluation import evaluate
from gna_interp.tasks.text import lm_loss

CONTROL_VERIFY = 8  # control heads run exactly before the error bound of the estimates is calibrated

__all__ = ["CONTROL_VERIFY", "STAGES", "DiscoverConfig", "check_solvable", "discover", "twin_check"]


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
        control: measure every head's LM-loss rise on neutral text (:mod:`gna_interp.circuits.scan.specificity`).
        generic_fraction: a head whose removal raises the LM loss by at least this fraction of the intact
            model's loss is ``generic``; ``keep_generic`` keeps such heads in the circuit.
        allow_chance: discover even when the intact model is near chance on the task (refused otherwise:
            nothing can be found in a task the model fails).
        twin: the task's knowledge twin (a :class:`~gna_interp.tasks.base.Task` needing the same knowledge
            without retrieval, e.g. ``MultipleChoice(questions, format="cloze")`` next to letters), evaluated
            with the curve's heads removed (:func:`twin_check`); None: no twin.
        delegation: on a hybrid (attention and SSM heads), measure which kind takes which role and what
            removing each kind's aggregate heads costs on the task and on the knowledge twin (else the
            neutral-text control) against random heads (:func:`~gna_interp.circuits.scan.delegation.delegation`,
            ``seeds`` draws); nothing runs on a model of one kind.
        formats: other retrieval formats of the task (tasks, e.g. the other KV template or stated multiple
            choice), each scanned like the task; the circuit then ranks heads by their consistent effect, the
            smallest relative drop over all formats (:mod:`gna_interp.circuits.search.formats`). A format the
            intact model does not solve is skipped with a note.
        paths: the circuit's best-ranked heads whose edges are measured by path patching (every earlier -> later
            pair along keys and values at the lines' tokens and the query at the decision position, and each
            head's direct path to the logits; :mod:`gna_interp.circuits.edges.causal`); 0: no edge table. The cost grows
            with the square of it: 5 heads are at most 35 patched sets (the time it takes: docs/discovery.md, "Cost").
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
    paths: int = 5

    def validate(self) -> None:
        check_int("k", self.k, 0)
        check_int("paths", self.paths, 0)
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
class _Discovery:
    """One discovery in progress, shared by the stages."""

    model: Model
    task: Task
    heads: Sequence[HeadRef | str] | str | None
    cfg: DiscoverConfig
    runner: SetAblation  # the task's one scoring plan and clean prefixes: the check, the curve, delegation
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    scan: HeadScan | None = None
    formats: dict[str, HeadScan] = field(default_factory=dict)
    format_tasks: dict[str, dict[str, Any]] = field(default_factory=dict)
    roles: pd.DataFrame | None = None
    circuit: Circuit | None = None
    control_task: Task | None = None
    control_runner: SetAblation | None = None  # the control's clean pass: its base loss and the curve's points
    members: list[HeadRef] = field(default_factory=list)  # the circuit as ranked before the control is settled
    late_check: bool = False  # calibration found the form solved: check after the scan, from its clean pass

    @property
    def kk(self) -> int:
        """How many heads the curve removes (:func:`~gna_interp.circuits.search.curve.curve_k`)."""
        assert self.scan is not None
        return curve_k(len(self.scan.heads), self.cfg.k)


def _check(d: _Discovery) -> bool:
    if d.late_check:
        return False
    sc = d.cfg.scan
    d.notes.append(check_solvable(d.model, d.task, sc.batch_size, d.cfg.allow_chance,
                                  accuracy=d.runner.clean().metrics["accuracy"]))
    return True


def _late_check(d: _Discovery) -> bool:
    """The check of a task calibration found solved, after the scan: the prefixes its attribution pass recorded give
    the intact scores without another clean forward."""
    if not d.late_check:
        return False
    d.late_check = False
    return _check(d)


def _scan(d: _Discovery) -> bool:
    d.scan = scan_heads(d.model, d.task, heads=d.heads, config=d.cfg.scan)
    return True


def _formats(d: _Discovery) -> bool:
    assert d.scan is not None
    d.formats, d.format_tasks = _format_scans(d.model, d.task, d.scan, d.cfg, d.notes)
    return bool(d.formats)


def _roles(d: _Discovery) -> bool:
    assert d.scan is not None
    cfg = d.cfg
    ranked = d.scan.top(len(d.scan.heads))
    d.roles = role_scores(d.model, d.task, heads=ranked[:cfg.role_heads], n_samples=cfg.role_samples,
                          batch_size=min(cfg.scan.batch_size, 8), form=cfg.form, rule=cfg.rule)
    d.circuit = Circuit(d.model.name, d.task.to_dict(), d.scan, d.roles, {}, pd.DataFrame(columns=CURVE_COLUMNS),
                        cfg.rule, generic_fraction=cfg.generic_fraction, keep_generic=cfg.keep_generic, notes=d.notes,
                        timings=d.timings, formats=d.formats, format_tasks=d.format_tasks)
    return True


def _control(d: _Discovery) -> bool:
    assert d.circuit is not None and d.scan is not None
    if d.cfg.control:
        d.control_task, note = control_task(d.model)
        d.notes.append(note)
        if d.control_task is not None:
            sc = d.cfg.scan
            d.control_runner = SetAblation(d.model, d.control_task, sc.method, sc.reference, _control_batch(sc))
            d.circuit.control = _control_scan(d.model, d.control_task, d.control_runner, d.scan, d.cfg)
    d.members = d.circuit.heads
    if d.circuit.control is not None:
        _settle_control(d.model, d.control_task, d.circuit, d.members[:d.kk], d.cfg)
    return True


def _curve(d: _Discovery) -> bool:
    assert d.circuit is not None and d.scan is not None
    cfg, sc, kk = d.cfg, d.cfg.scan, d.kk
    if kk < cfg.k:
        d.notes.append(f"the curve removes k = {kk} heads, not {cfg.k}: {len(d.scan.heads)} heads in all, and k "
                       f"random heads must stay a small draw (at most a quarter) that cannot contain the circuit")
    members = d.members
    d.circuit.curve = ablation_curve(d.model, d.runner, members, d.scan.heads, control=d.control_runner,
                                     generic=d.circuit.generic, k=min(kk, len(members)), seeds=cfg.seeds,
                                     method=sc.method, reference=sc.reference, batch_size=sc.batch_size)
    base_row = d.circuit.curve.iloc[0]
    d.circuit.baseline = {"accuracy": float(base_row["accuracy"]), "logit_diff": float(base_row["logit_diff"]),
                          "gold_prob": float(base_row["gold_prob"]), "chance": d.task.chance, "n_samples": len(d.task),
                          **({"lm_loss": float(base_row["lm_loss"])} if d.control_task is not None else {})}
    return True


def _paths(d: _Discovery) -> bool:
    assert d.circuit is not None and d.scan is not None
    heads = d.members[:d.cfg.paths]
    if len(heads) < 1:
        return False
    sc = d.cfg.scan
    try:
        d.circuit.edges = measure_edges(d.model, d.task, heads,
                                        metric=d.scan.metric if d.scan.metric != "accuracy" else "logit_diff",
                                        method=sc.method if sc.method != "resample" else "mean",
                                        reference=sc.reference, batch_size=sc.batch_size)
    except (UnsupportedArchitectureError, InputError) as e:  # a family or a task the paths cannot be patched on
        d.notes.append(f"no edge table: {e}")
        return False
    return True


def _twin(d: _Discovery) -> bool:
    assert d.circuit is not None
    if d.cfg.twin is None:
        return False
    d.circuit.twin = twin_check(d.model, d.cfg.twin, d.circuit.curve, d.cfg.scan.batch_size)
    return True


def _delegation(d: _Discovery) -> bool:
    assert d.circuit is not None
    cfg, sc = d.cfg, d.cfg.scan
    if not (cfg.delegation and is_hybrid(d.model)):
        return False
    knowledge = cfg.twin if cfg.twin is not None else d.control_task if d.control_task is not None else \
        "auto" if cfg.control else None
    d.circuit.delegation = delegation(d.model, d.task, knowledge, roles=d.roles, runner=d.runner, seeds=cfg.seeds,
                                      n_samples=cfg.role_samples, rule=cfg.rule, form=cfg.form, method=sc.method,
                                      reference=sc.reference, batch_size=sc.batch_size)
    return True


def _views(d: _Discovery) -> bool:
    assert d.circuit is not None
    if not d.cfg.n_cards:
        return False
    d.circuit.views = card_views(d.model, d.task, d.members, d.circuit.to_frame(), d.circuit.pair(),
                                 n_cards=d.cfg.n_cards, form=d.cfg.form)
    return True


# The stages in order: each returns whether it ran (its time is then recorded under its name).
STAGES: tuple[tuple[str, Callable[[_Discovery], bool]], ...] = (
    ("check", _check), ("scan", _scan), ("check", _late_check), ("formats", _formats), ("roles", _roles), ("control", _control),
    ("curve", _curve), ("paths", _paths), ("twin", _twin), ("delegation", _delegation), ("views", _views))


def discover(model: Model, task: Task | TaskChoice | ChosenTask | None = None,
             heads: Sequence[HeadRef | str] | str | None = None, config: DiscoverConfig | None = None,
             **overrides: Any) -> Circuit:
    """Find the G&A circuit of ``model`` on ``task`` by running :data:`STAGES` in order: check that the model
    solves the task, scan every head (:func:`scan_heads`), score the roles of the best-ranked ``role_heads``
    heads on ``role_samples`` samples (:func:`role_scores`), measure every head's control effect, the ablation
    curve of the top ``k`` heads against ``seeds`` random draws of ``k`` heads, the edge table of the top
    ``paths`` heads, the twin and delegation where they apply, and keep the patterns the report draws.

    ``task`` is a :class:`~gna_interp.tasks.base.Task`, or -- as ``gna scan`` does -- None (the task form the model
    solves, chosen by :func:`~gna_interp.tasks.choice.choose_task` with its defaults), a
    :class:`~gna_interp.tasks.choice.TaskChoice` (how to choose it) or a :class:`~gna_interp.tasks.choice.ChosenTask`;
    a chosen task brings its knowledge twin, its other formats and its calibration (kept in the circuit) unless
    ``twin`` / ``formats`` are given. ``config`` is a :class:`DiscoverConfig`; keyword overrides may name its
    fields or the scan's (``strategy``, ``method``, ``checkpoint``, ...); an unknown keyword raises naming the
    closest one.
    """
    from gna_interp.models.model import check_model
    check_model(model)
    cfg = DiscoverConfig.build(config, **overrides)
    chosen: ChosenTask | None = None
    profile: dict[str, Cost] = {}
    if task is None or isinstance(task, TaskChoice):
        with Meter(model) as meter, meter.stage() as profile["calibrate"]:
            chosen = choose_task(model, task if task is not None else TaskChoice(batch_size=cfg.scan.batch_size))
    elif isinstance(task, ChosenTask):
        chosen = task
    elif not isinstance(task, Task):
        raise InputError(f"discover needs a Task (e.g. KVRetrieval(...)), a TaskChoice or None (the form the model "
                         f"solves, as gna scan chooses it), got {type(task).__name__}")
    if chosen is not None:
        task = chosen.task
        cfg = cfg.replace(twin=cfg.twin if cfg.twin is not None else chosen.twin,
                          formats=tuple(cfg.formats) or chosen.formats)
    assert isinstance(task, Task)
    start = time.perf_counter()
    sc = cfg.scan
    with shared_prefixes():  # one clean pass per task, whichever stages replay it
        d = _Discovery(model, task, heads, cfg, SetAblation(model, task, sc.method, sc.reference, sc.batch_size))
        cal = chosen.calibration if chosen is not None else None
        d.late_check = cal is not None and cal.rows[cal.chosen].solved
        clock = start
        with Meter(model) as meter:
            for name, stage in STAGES:
                with meter.stage() as cost:
                    ran = stage(d)
                if ran:
                    now = time.perf_counter()
                    d.timings[name] = d.timings.get(name, 0.0) + now - clock
                    clock = now
                    profile[name] = profile[name] + cost if name in profile else cost
    assert d.circuit is not None
    d.circuit.profile = profile
    d.circuit.seconds = time.perf_counter() - start
    if chosen is not None:
        d.circuit.notes.extend(chosen.notes)
        if chosen.calibration is not None:
            d.circuit.calibration = chosen.calibration
            d.circuit.timings = {"calibrate": chosen.calibration.seconds, **d.circuit.timings}
            d.circuit.seconds += chosen.calibration.seconds
    return d.circuit


def _format_scans(model: Model, task: Task, scan: HeadScan, cfg: DiscoverConfig, notes: list[str],
                  ) -> tuple[dict[str, HeadScan], dict[str, dict[str, Any]]]:
    """Scan each of ``cfg.formats`` the intact model solves (a note for each one skipped), then make the
    scans comparable (:func:`~gna_interp.circuits.search.formats.cross_format`)."""
    if not cfg.formats:
        return {}, {}
    sc = cfg.scan
    scans, tasks = {task.name: scan}, {task.name: task}
    for i, t in enumerate(cfg.formats):
        name = t.name if t.name not in tasks else f"{t.name}-{i + 2}"
        from gna_interp.tasks.calibration import ChanceVerdict

        verdict = ChanceVerdict.measure(model, t, sc.batch_size)
        line = verdict.line()
        if verdict.near_chance:
            notes.append(f"format {name} not scanned: {line} (at chance)")
            continue
        ckpt = Path(sc.checkpoint).with_suffix("." + format_scan(i)) if sc.checkpoint is not None else None
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
    (:class:`InputError`) when it is near chance (:class:`~gna_interp.tasks.calibration.ChanceVerdict`): a task
    the model fails cannot reveal a circuit. Returns the verdict's sentence; ``allow_chance`` turns the refusal
    into that sentence, marked NEAR CHANCE."""
    from gna_interp.tasks.calibration import ChanceVerdict

    verdict = ChanceVerdict.measure(model, task, batch_size) if accuracy is None else ChanceVerdict.of(task, accuracy)
    if verdict.near_chance and not allow_chance:
        raise InputError(f"{model.name} is at chance on {task.name}: {verdict.line()}. Nothing can be discovered from "
                         f"a task the model fails; make it easier (KV: fewer pairs, another template; multiple choice: "
                         f"more shots, or the 'stated' form, gna scan --mc-form stated) or pass allow_chance=True "
                         f"(gna scan --allow-chance)")
    return verdict.line(near="the circuit below is not evidence of retrieval")


def _control_batch(sc: ScanConfig) -> int:
    """Sequences per forward of the control text (its paragraphs are long)."""
    return min(sc.batch_size, 8)


def _control_scan(model: Model, ctask: Task, runner: SetAblation, scan: HeadScan, cfg: DiscoverConfig) -> HeadScan:
    """The LM-loss control of every scanned head: attribution estimates for all of them, and exact runs for
    the heads that can enter the circuit (the scan's best-ranked ``2 * max(certify, k)``) whose rise could
    reach the generic threshold. ``runner`` holds ``ctask``'s clean pass (the base loss is read from it)."""
    sc = cfg.scan
    base_loss = lm_loss(runner.clean())
    ckpt = Path(sc.checkpoint).with_suffix(CONTROL_SUFFIX) if sc.checkpoint is not None else None
    focus = scan.top(min(len(scan.heads), 2 * max(sc.certify, cfg.k)))
    return scan_heads(model, ctask, heads=scan.heads, strategy="auto", metric="logprob", method=sc.method,
                      reference=sc.reference, batch_size=_control_batch(sc), checkpoint=ckpt, certify=0,
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
                           reference=sc.reference, batch_size=_control_batch(sc), progress=False)
        control.exact.update(extra.exact)
