"""`scan_heads`: how much a task's metric drops when each head is ablated on its own.

Strategies:

- ``exact`` (fast): one clean forward per batch records every block's input
  (:mod:`gna_interp.engine.replay`); ablating a head of layer ``L`` then re-runs only blocks
  ``L..N-1``, ``stack`` ablations of the same layer share one replay (copies of the batch), and the
  unembedding is applied only where the metric reads. When candidates span several tokens (several
  scoring rows per sample) on an attention-only model, each sample's rows are *packed* into one
  sequence -- the prompt once, the continuations as a tree under a tree-shaped attention mask
  (:func:`~gna_interp.engine.layout.layout_chunks`) -- so a multi-token task costs what a single-token
  one does. Its numbers equal ``naive``'s to float noise.
- ``naive``: one full forward of the task per head with one ablation hook (the reference; full
  rows through :func:`gna_interp.engine.run_plan`, no KV-cached prompt).
- ``attribution``: attribution patching (:mod:`gna_interp.engine.attribution`) -- a first-order
  estimate for all heads from one forward and one backward per batch.
- ``auto``: ``attribution``, then ``exact`` runs until the leading ``certify`` heads are settled: first
  ``verify`` heads exactly (alternately the largest estimated drops and the largest absolute *masses*, the
  estimate's per-token terms summed without cancellation); then, with ``c`` the largest
  ``(exact drop − estimated drop) / mass`` among the exact heads below 1.5 times the ``certify``-th exact drop
  (the bar), every unrun head whose ``estimated drop + c · mass`` could beat the bar is run exactly, the most
  threatening first, and ``c`` recalibrated. The bound is empirical (learnt from the heads run), not a proof
  (``benchmarks/scan.py`` checks auto's top 10 against the exact scan's; docs/discovery.md §5 measures it).
  Scans restored from a checkpoint without masses use the ablation's relative size instead of the mass. With 64
  samples or more (``ScanConfig.screen``) such heads are first *screened* on a quarter of the samples and run on
  all of them only while their screening bound (mean + 3 bootstrap standard deviations) could reach the leading
  heads.

Metrics: ``logit_diff`` (mean over samples of the gold candidate's score minus the best other's;
scores are summed log-probs, see :mod:`gna_interp.engine.plan`) or ``accuracy``. ``drop`` is
``baseline - ablated``; rank 1 is the largest drop. Attribution estimates the logit difference only:
under ``metric="accuracy"`` heads that were not run exactly have ``ablated``/``drop`` NaN and are
ranked, after the exact ones, by their estimated logit-difference drop.

How it reads: :func:`scan_heads` is four stages on one :class:`_Run` -- **plan** (heads, scoring plan, clean
prefixes, the store and the executor), **attribute** (estimates for every head), **verify** (the first exact
heads) and **settle** (``auto``: exact runs until the leading heads cannot change). The pieces live beside it:
the result :class:`~gna_interp.circuits.scan.result.HeadScan` (drops, intervals, the ranked table), the metrics
(:mod:`gna_interp.engine.metrics`), the pure ``auto`` policy (:mod:`gna_interp.circuits.scan.policy`), the
checkpoint (:mod:`gna_interp.circuits.scan.store`), one process or torchrun ranks
(:mod:`gna_interp.circuits.scan.executor`), and the plain reference loop the fast paths are tested against
(:func:`~gna_interp.circuits.scan.reference.reference_scan`).

Checkpoint: with ``checkpoint=PATH`` the per-sample results are written atomically (temporary file
+ ``os.replace``) after every finished group of heads; a later call with the same arguments resumes
from it, skipping finished heads. A checkpoint from a different model, task, method or head list is
refused. Options are a :class:`ScanConfig` (or keyword overrides of its fields).

Sharded (under ``torchrun``, see :mod:`gna_interp.circuits.scan.distributed`): every rank runs the cheap,
sequential parts identically (plan, prefixes, attribution, the ``auto`` decisions; rank 0 broadcasts
the baseline, the estimates, ``stack`` and the replay check), and each exact phase -- the initial heads,
each ``auto`` round, each screening round -- is cut into the replay groups one process would run and
split by whole groups over the ranks; the ranks all-gather the results after the phase. Each rank
checkpoints into its own file; rank 0 writes the merged checkpoint at the end. The numbers are bitwise
those of one process with the same thread count.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from gna_interp.progress import tqdm

from gna_interp.engine.attribution import attribution_estimates
from gna_interp.circuits.scan.distributed import active, check_world
from gna_interp.engine.replay import DEFAULT_PREFIX_BYTES, Replays, SetAblation
from gna_interp.circuits.scan.executor import Executor, Unit
from gna_interp.circuits.scan.policy import DEFAULT_CERTIFY, default_verify, initial_exact, next_to_verify
from gna_interp.circuits.scan.result import COLUMNS, HeadScan
from gna_interp.circuits.scan.store import ScanStore, fingerprint
from gna_interp.errors import InputError, OptionError
from gna_interp.interventions.ablation import METHODS, AblationMethod, Replacement
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_choice, check_int, options
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import METRICS as METRIC_OBJECTS
from gna_interp.engine.metrics import get_metric, results
from gna_interp.engine.layout import whole_samples
from gna_interp.engine.plan import CandidateScores, ScoringPlan, plan_of, plan_scoring

Strategy = Literal["exact", "naive", "attribution", "auto"]
Metric = Literal["logit_diff", "accuracy", "logprob"]
STRATEGIES: tuple[str, ...] = ("exact", "naive", "attribution", "auto")
METRICS: tuple[str, ...] = tuple(METRIC_OBJECTS)

__all__ = ["COLUMNS", "METRICS", "STRATEGIES", "HeadScan", "Metric", "ScanConfig", "Strategy", "default_verify",
           "scan_heads"]


@options
class ScanConfig(Options):
    """How :func:`scan_heads` runs.

    Attributes:
        strategy: ``exact`` / ``naive`` / ``attribution`` / ``auto`` (see :mod:`gna_interp.circuits.scan`).
        method, reference: ablation method (``zero``/``mean``/``resample``) and, for ``mean`` and
            ``resample``, the reference prompts or task whose activations replace a head's output.
        metric: ``logit_diff``, ``accuracy`` or ``logprob`` (gold continuation's log-prob per token: a
            scan of :class:`~gna_interp.tasks.text.NeutralText` measures the LM loss; drop = loss rise).
        batch_size: sequences per forward (a stacked replay holds ``stack * batch_size`` rows).
        checkpoint: JSON file written atomically as heads finish; resumes from it when it exists.
        verify: heads ``auto`` runs exactly before calibrating (default :func:`default_verify`).
        certify: leading heads ``auto`` settles (0: only the ``verify`` heads are run exactly).
        settle_above: ``auto`` also runs exactly every head whose estimated drop plus its calibrated error
            bound exceeds this value (e.g. the LM-loss rise that makes a head generic), so no head above
            it is left as an estimate.
        focus: heads ``auto`` may run exactly (None: all); the others keep their attribution estimates.
            The control scan uses it to settle only the heads that can enter a circuit.
        max_exact: ``auto`` stops running heads exactly after this many (None: until settled); the scan
            then records how many unrun heads could still enter the leading ones (``unsettled``).
        screen: samples of the ``auto`` screening stage (0: none; default: a quarter of the samples when
            there are at least 64, else none): heads the attribution bound cannot rule out are first
            run exactly on these samples only, and run on all samples only if that result's upper bound
            (mean + ``3`` bootstrap standard deviations) could still reach the leading heads.
        stack: ablations per replay (default: on CPU as many as keep a replay within 2,048 tokens; on CUDA as
            many as fit in half the free GPU memory, see :func:`~gna_interp.models.estimate.replay_stack`).
        scoring: candidate scoring method of :func:`~gna_interp.engine.plan.plan_scoring`
            (``auto`` or ``first_token``).
        progress: show a progress bar.
        max_prefix_bytes: keep the clean prefixes of all batches in memory up to this size.
    """

    strategy: Strategy = "exact"
    method: AblationMethod = "zero"
    metric: Metric = "logit_diff"
    batch_size: int = 16
    reference: Any = None
    checkpoint: str | os.PathLike | None = None
    verify: int | None = None
    certify: int = DEFAULT_CERTIFY
    settle_above: float | None = None
    focus: Sequence[HeadRef | str] | None = None
    max_exact: int | None = None
    screen: int | None = None
    stack: int | None = None
    scoring: str = "auto"
    progress: bool = True
    max_prefix_bytes: int = DEFAULT_PREFIX_BYTES

    def validate(self) -> None:
        check_choice("strategy", self.strategy, STRATEGIES)
        check_choice("metric", self.metric, METRICS)
        check_choice("method", self.method, METHODS)
        check_int("batch_size", self.batch_size, 1)
        check_int("stack", self.stack, 1, allow_none=True)
        check_int("verify", self.verify, 0, allow_none=True)
        check_int("certify", self.certify, 0)
        check_int("max_exact", self.max_exact, 1, allow_none=True)
        check_int("screen", self.screen, 0, allow_none=True)
        if self.scoring == "per_candidate":
            raise OptionError("scan_heads scores candidates from shared forwards; use scoring='auto' or 'first_token'")
        check_choice("scoring", self.scoring, ("auto", "first_token"))


@dataclass
class _Run:
    """One scan in progress: what the plan stage fixed, shared by the later stages."""

    model: Model
    cfg: ScanConfig
    runner: SetAblation
    by_head: dict[HeadRef, Replacement]
    scan: HeadScan
    store: ScanStore
    executor: Executor
    focus: set[HeadRef] | None
    bar: Any = None

    @property
    def plan(self) -> ScoringPlan:
        return self.runner.plan

    @property
    def stack(self) -> int:
        return self.runner.stack

    def record_exact(self, scored: dict[HeadRef, CandidateScores]) -> None:
        """Keep finished heads' per-sample results, save the checkpoint, advance the bar."""
        for h, sc in scored.items():
            self.scan.exact[h] = results(sc)
        self.store.save(self.scan)
        if self.bar is not None:
            self.bar.update(len(scored))

    def run_units(self, units: list[Unit], compute: Callable[[Unit], dict[HeadRef, CandidateScores]],
                  record: Callable[[dict[HeadRef, CandidateScores]], None], into: dict,
                  cost: Callable[[Unit], float]) -> None:
        """Run a phase through the executor; under torchrun, save what the ranks gathered."""
        arrived = self.executor.run(units, compute, record, into, cost)
        if self.executor.shard is not None:
            self.store.save(self.scan)
            if self.bar is not None and into is self.scan.exact:
                self.bar.update(arrived)


def scan_heads(model: Model, task: Task | ScoringPlan, heads: Sequence[HeadRef | str] | str | None = None,
               config: ScanConfig | None = None, **overrides: Any) -> HeadScan:
    """Ablate each head of ``heads`` (default: every head of ``model``) on its own and measure the metric.

    ``task`` is a task (or a :class:`~gna_interp.engine.plan.ScoringPlan` made from one); ``config`` a
    :class:`ScanConfig`, or keyword overrides of its fields (``strategy="auto"``, ``method``,
    ``metric``, ``batch_size``, ``checkpoint``, ...); an unknown keyword raises naming the closest one.
    Under ``torchrun`` (``WORLD_SIZE > 1``) the exact ablations are split over the ranks and every rank
    returns the whole scan (:mod:`gna_interp.circuits.scan.distributed`).
    """
    from gna_interp.models.model import check_model
    check_model(model)
    cfg = ScanConfig.build(config, **overrides)
    start = time.perf_counter()
    run = _plan(model, task, heads, cfg)
    if cfg.strategy in ("attribution", "auto") and len(run.scan.estimates) < len(run.scan.heads):
        _attribute(run)
    todo = initial_exact(run.scan, cfg.strategy, cfg.certify, cfg.verify, run.focus)
    with tqdm(total=len(todo), desc=f"scan {cfg.strategy}", unit="head", leave=False,  # the stage line reports its end
              disable=not (cfg.progress and run.executor.lead)) as bar:
        run.bar = bar
        if todo or not run.scan.baseline:
            _verify(run, todo, naive=cfg.strategy == "naive")
        if cfg.strategy == "auto" and (cfg.certify > 0 or cfg.settle_above is not None):
            _settle(run)
    run.scan.seconds = time.perf_counter() - start
    run.store.finish(run.scan)
    return run.scan


# ---- the stages -----------------------------------------------------------------------------
def _plan(model: Model, task: Task | ScoringPlan, heads: Sequence[HeadRef | str] | str | None,
          cfg: ScanConfig) -> _Run:
    """Plan: the heads, the scoring plan and its chunks, the replay stack, the clean prefixes, the checkpoint to
    resume from, and this process's place in a torchrun job."""
    head_list = list(dict.fromkeys(model.check_heads(heads) if heads is not None else model.heads()))
    if not head_list:
        raise InputError(f"no heads to scan: {model.name} has no supported heads, or the list given was empty")
    shard = active()
    if shard is not None:
        check_world(shard.world, len(head_list))
    executor = Executor(shard)
    plan, task_name = _as_plan(model, task, cfg.scoring)
    runner = SetAblation(model, plan, cfg.method, cfg.reference, cfg.batch_size,
                         Replays(cfg.strategy != "naive", cfg.stack, max_prefix_bytes=cfg.max_prefix_bytes))
    replaced = runner.replaced(head_list)
    runner.stack = executor.broadcast(runner.stack)  # rank 0's
    path = Path(cfg.checkpoint) if cfg.checkpoint is not None else None
    store = ScanStore(path, fingerprint(model, plan, cfg.method, head_list, cfg.reference), shard)
    state = store.resume()
    scan = HeadScan(model.name, task_name, cfg.method, cfg.metric, cfg.strategy, head_list, {})
    if state is not None:
        scan.restore(state)
    focus = set(model.check_heads(list(cfg.focus))) if cfg.focus is not None else None
    return _Run(model, cfg, runner, {r.site.head: r for r in replaced}, scan, store, executor, focus)


def _attribute(run: _Run) -> None:
    """Attribute: every head's estimate (and the baseline, if missing) from one forward + backward per chunk."""
    scan, plan, chunks, prefixes = run.scan, run.plan, run.runner.chunks, run.runner.store
    assert prefixes is not None  # (a naive scan attributes nothing)
    estimand = get_metric(scan.estimand)
    weights = None
    if not estimand.needs_clean:
        weights = estimand.target_weights(plan, None)
    elif not whole_samples(chunks):  # a sample's rows span several chunks: weights from a clean pass first
        weights = estimand.target_weights(plan, prefixes.clean(plan))
    replaced = list(run.by_head.values())
    with tqdm(total=len(chunks), desc="attribution", unit="batch", disable=not (run.cfg.progress and run.executor.lead),
              leave=False) as bar:
        att = attribution_estimates(run.model, plan, prefixes, replaced, weights, bar.update)  # records them
    if not scan.baseline:
        scan.baseline = results(att.clean)
    base = estimand.value(scan.baseline)
    scan.estimates = {r.site.head: base + float(e) for r, e in zip(replaced, att.delta)}
    scan.sizes = {r.site.head: float(z) for r, z in zip(replaced, att.size)}
    scan.masses = {r.site.head: float(a) for r, a in zip(replaced, att.mass)}
    run.executor.agree(scan)
    run.store.save(scan)


def _verify(run: _Run, todo: list[HeadRef], naive: bool = False) -> None:
    """Verify: run ``todo`` exactly (fast replay of the chunks' last blocks; one full forward per head when
    ``naive`` or when replays do not reproduce the model), recording each finished group."""
    model, plan, scan = run.model, run.plan, run.scan
    if not naive and (problem := run.executor.replay_problem(run.runner)) is not None:
        warnings.warn(f"{problem}; falling back to one full forward per head", RuntimeWarning, stacklevel=3)
        naive = True
    full = run.runner.on(plan, replay=False, pack=False) if naive else None  # plain rows, never a cached prefix
    if not scan.baseline:
        scan.baseline = results(full.run([]) if full is not None else run.runner.clean())
        run.executor.agree(scan)
    run.store.save(scan)
    units = [run.by_head[h] for h in todo]
    if full is not None:  # one plain forward per batch and head
        run.run_units([[r] for r in units], lambda u: {u[0].site.head: full.run([u[0].site.head])},
                      run.record_exact, scan.exact, lambda u: 1.0)
    else:
        run.run_units(_groups(units, run.stack), lambda g: _exact_group(run.runner, g),
                      run.record_exact, scan.exact, _replay_cost(model))


def _settle(run: _Run) -> None:
    """Settle (``auto``): while some unrun head could still enter the leading ``certify`` heads (or exceed
    ``settle_above``), screen it on a subset of the samples or run it exactly (see the module docstring)."""
    cfg, scan = run.cfg, run.scan
    n = len(scan.heads)
    screen = _Screen.make(run)
    while more := next_to_verify(scan, min(cfg.certify, n), n if screen else run.stack, cfg.settle_above, run.focus):
        capped = cfg.max_exact is not None and len(scan.exact) >= cfg.max_exact
        if screen and not capped and (fresh := [h for h in more if h not in scan.screened]):
            screen.run(run, [run.by_head[h] for h in fresh])
            continue
        more = more[:run.stack]
        if capped:
            scan.unsettled = len(next_to_verify(scan, min(cfg.certify, n), n, cfg.settle_above, run.focus))
            warnings.warn(f"auto scan stopped at max_exact={cfg.max_exact} exact heads; {scan.unsettled} unrun "
                          f"heads could still enter the top {cfg.certify}", RuntimeWarning, stacklevel=3)
            break
        more = more[:cfg.max_exact - len(scan.exact)] if cfg.max_exact is not None else more
        run.bar.total += len(more)
        run.bar.refresh()
        _verify(run, more)


class _Screen:
    """The screening stage of ``auto``: exact runs on a spread subset of the samples (see ``ScanConfig.screen``)."""

    def __init__(self, runner: SetAblation) -> None:
        self.runner = runner

    @classmethod
    def make(cls, run: _Run) -> "_Screen | None":
        model, plan, scan, cfg = run.model, run.plan, run.scan, run.cfg
        n = len(plan.samples)
        m = (n // 4 if n >= 64 else 0) if cfg.screen is None else min(cfg.screen, n)
        if m < 2 or m >= n or cfg.method == "resample":
            return None
        scan.screen_index = scan.screen_index or [int(i) for i in torch.linspace(0, n - 1, m).round().long()]
        sub = plan_scoring(model, [plan.samples[i] for i in scan.screen_index], plan.method)  # type: ignore[arg-type]
        runner = run.runner.on(sub)
        if run.executor.replay_problem(runner) is not None:  # no fast replay: screening costs what exact runs do
            return None
        return cls(runner)

    def run(self, run: _Run, todo: list[Replacement]) -> None:
        """Run ``todo`` on the screening samples, recording each finished group."""
        scan = run.scan

        def record(scored: dict[HeadRef, CandidateScores]) -> None:
            for h, sc in scored.items():
                scan.screened[h] = results(sc)
            run.store.save(scan)
            if run.bar is not None:
                run.bar.set_postfix_str(f"screened {len(scan.screened)} on {len(self.runner.plan.samples)} samples")

        run.run_units(_groups(todo, run.stack), lambda g: _exact_group(self.runner, g), record,
                      scan.screened, _replay_cost(run.model))


# ---- engines ------------------------------------------------------------------------------
def _exact_group(runner: SetAblation, group: list[Replacement]) -> dict[HeadRef, CandidateScores]:
    """Scores with each of ``group``'s heads (all in one layer) ablated, stacked in one replay per chunk."""
    heads = [r.site.head for r in group]
    return dict(zip(heads, runner.run_many([[h] for h in heads])))


def _groups(replaced: list[Replacement], stack: int) -> list[list[Replacement]]:
    by_layer: dict[int, list[Replacement]] = {}
    for r in replaced:
        by_layer.setdefault(r.site.head.layer, []).append(r)
    return [rs[k:k + stack] for _, rs in sorted(by_layer.items()) for k in range(0, len(rs), stack)]


def _as_plan(model: Model, task: Task | ScoringPlan, scoring: Any) -> tuple[ScoringPlan, str]:
    return plan_of(model, task, scoring, "scan_heads"), "samples" if isinstance(task, ScoringPlan) else task.name


def _replay_cost(model: Model) -> Callable[[Unit], float]:
    """The relative cost of a replay group: its heads times the blocks it re-runs."""
    return lambda g: float(len(g) * (model.n_layers - g[0].site.head.layer))
