"""Pairwise interactions between heads: does removing two heads together cost more or less than the sum of
removing each alone?

For heads ``h_1..h_k`` and a task metric ``m`` (:mod:`gna_interp.engine.metrics`), with ``m(S)`` the metric when
the heads of ``S`` are removed together (``m(∅)``: the intact model)::

    drop(i)        = m(∅) - m({h_i})
    drop(i, j)     = m(∅) - m({h_i, h_j})
    interaction_ij = drop(i, j) - drop(i) - drop(j)        (i != j; the diagonal holds drop(i))

- ``interaction > 0``, **super-additive**: the pair costs more than its singles. Heads that back each other up
  (each covers for the other, so alone each costs little), or a head whose effect grows once the other is gone.
- ``interaction < 0``, **sub-additive**: the pair costs less than its singles; their damage overlaps. Heads in
  series on one path (a gather head and the aggregate head reading it: removing either breaks the path, removing
  the second adds little), or a metric near its floor (the first removal already took it to chance).
- a pair is called **additive** when the paired bootstrap interval of its interaction contains 0.

Every number comes from ONE :class:`~gna_interp.engine.replay.SetAblation` (the clean prefixes captured once,
each set replaying only the blocks from its earliest head on, the ``k + k(k-1)/2`` sets stacked in one replay
by :meth:`~gna_interp.engine.replay.SetAblation.run_many`), so pair drops equal ``ablate(model, [h_i, h_j])`` +
:func:`~gna_interp.engine.forward.run_plan` to float noise. The per-sample results of every set are kept, so the
same measurement reads out under any metric (``logit_diff``, ``accuracy``, ``logprob``).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.engine.replay import SetAblation
from gna_interp.circuits.scan.result import results_from_json, results_to_json
from gna_interp.bootstrap import N_BOOTSTRAP, interval, paired_bootstrap
from gna_interp.constants import INTERACTIONS_JSON
from gna_interp.errors import InputError
from gna_interp.html_repr import fmt
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, check_model
from gna_interp.options import Options, check_int, check_level, check_n_boot, options
from gna_interp.results import Result
from gna_interp.store import FORMAT_VERSIONS, clean_json
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import Results, get_metric, results
from gna_interp.engine.plan import ScoringPlan

FORMAT = "interactions"
FORMAT_VERSION = FORMAT_VERSIONS[FORMAT]
ZERO_TOL = 1e-9
KINDS = ("super-additive", "sub-additive", "additive")
PAIR_COLUMNS = ["head_i", "head_j", "drop_i", "drop_j", "drop_ij", "interaction", "low", "high", "kind"]

__all__ = ["KINDS", "PAIR_COLUMNS", "InteractionOptions", "Interactions", "head_interactions", "interactions"]


@dataclass
class Interactions(Result):
    """Result of :func:`interactions`: per-sample results of the intact model, of each head removed alone and of
    each pair removed together. Saves to one ``interactions`` JSON file (:meth:`save` / :meth:`load`, a folder's
    ``interactions.json``), tabulates its pairs (:meth:`to_frame`) and displays itself (:class:`Result`).

    Attributes:
        model, task: names of the model and the task measured.
        metric: the default metric read out (``logit_diff``, ``accuracy`` or ``logprob``); every method takes a
            ``metric`` to read another one off the same per-sample results.
        method: the ablation (``zero``, ``mean``, ``resample``).
        heads: ``h_1..h_k``, in the order given (matrix rows and columns).
        baseline: per-sample results of the intact model.
        singles: ``singles[i]``: per-sample results with ``heads[i]`` removed.
        pairs: ``pairs[(i, j)]`` (``i < j``): per-sample results with ``heads[i]`` and ``heads[j]`` removed together.
        level: the bootstrap intervals' coverage; ``n_boot``: their resamples (over samples, fixed seed 0).
    """

    model: str
    task: str
    metric: str
    method: str
    heads: list[HeadRef]
    baseline: Results
    singles: list[Results]
    pairs: dict[tuple[int, int], Results]
    level: float = 0.95
    n_boot: int = N_BOOTSTRAP
    seconds: float = 0.0
    _boot: dict[str, tuple[Tensor, list[Tensor], dict[tuple[int, int], Tensor]]] = field(default_factory=dict,
                                                                                          repr=False, compare=False)

    FORMAT = FORMAT
    FILE = INTERACTIONS_JSON
    DRAWN_BY = "gna_interp.viz.interaction_heatmap(interactions)"

    def __post_init__(self) -> None:
        self.n_boot = check_n_boot(self.n_boot)  # read back from a file, or set by hand: a bounded resample count
        self.level = check_level(self.level)

    # ---- point values ---------------------------------------------------------------------------
    @property
    def k(self) -> int:
        return len(self.heads)

    @property
    def n_samples(self) -> int:
        return len(next(iter(self.baseline.values())))

    def _m(self, metric: str | None) -> Any:
        return get_metric(metric or self.metric)

    def baseline_value(self, metric: str | None = None) -> float:
        """The metric of the intact model."""
        return self._m(metric).value(self.baseline)

    def drop(self, i: int, j: int | None = None, metric: str | None = None) -> float:
        """``drop(i) = m(∅) - m({h_i})``, or with ``j`` (``!= i``) ``drop(i, j) = m(∅) - m({h_i, h_j})``."""
        m = self._m(metric)
        per = self.singles[i] if j is None or j == i else self.pairs[(min(i, j), max(i, j))]
        return m.value(self.baseline) - m.value(per)

    def matrix(self, metric: str | None = None) -> Float[Tensor, "k k"]:
        """``[k, k]``, symmetric: ``interaction[i, j] = drop(i, j) - drop(i) - drop(j)`` off the diagonal,
        ``drop(i)`` on it."""
        single = [self.drop(i, metric=metric) for i in range(self.k)]
        out = torch.diag(torch.tensor(single, dtype=torch.float64))
        for i, j in self.pairs:
            out[i, j] = out[j, i] = self.drop(i, j, metric) - single[i] - single[j]
        return out

    # ---- bootstrap --------------------------------------------------------------------------------
    def _resampled(self, metric: str | None) -> tuple[Tensor, list[Tensor], dict[tuple[int, int], Tensor]]:
        """The metric of the intact model, of each single and of each pair on the same ``n_boot`` resamples."""
        name = metric or self.metric
        if name not in self._boot:
            m = get_metric(name)
            idx = paired_bootstrap(self.n_samples, self.n_boot)
            self._boot[name] = (m.resampled(self.baseline, idx).double(),
                                [m.resampled(s, idx).double() for s in self.singles],
                                {p: m.resampled(r, idx).double() for p, r in self.pairs.items()})
        return self._boot[name]

    def intervals(self, metric: str | None = None) -> dict[tuple[int, int], tuple[float, float]]:
        """Paired bootstrap interval of each pair's interaction at :attr:`level`: ``{(i, j): (low, high)}``; on each
        resample ``b`` of the samples, ``interaction_b = m_b({h_i}) + m_b({h_j}) - m_b(∅) - m_b({h_i, h_j})``."""
        base, single, pair = self._resampled(metric)
        return {(i, j): interval(single[i] + single[j] - base - v, self.level) for (i, j), v in pair.items()}

    @staticmethod
    def kind(low: float, high: float) -> str:
        """``super-additive`` when the interval ``(low, high)`` lies above 0, ``sub-additive`` below, else ``additive``
        (a bound within :data:`ZERO_TOL` of 0 counts as 0: accuracy quantiles carry rounding noise like ``-3e-17``)."""
        return KINDS[0] if low > ZERO_TOL else KINDS[1] if high < -ZERO_TOL else KINDS[2]

    # ---- summary ---------------------------------------------------------------------------------
    def redundancy(self, metric: str | None = None) -> float:
        """How much the pairs' damage overlaps, one number over all pairs::

            R = Σ_{i<j} (drop(i) + drop(j) - drop(i, j)) / Σ_{i<j} (drop(i) + drop(j))
              = 1 - Σ_{i<j} drop(i, j) / ((k - 1) Σ_i drop(i))

        ``R = 0``: additive on the whole; ``R > 0``: sub-additive (``R = 0.5`` when every pair costs as much as one
        of two equal singles, ``R = 1`` when pairs cost nothing); ``R < 0``: super-additive (backups: ``R = -1``
        when pairs cost twice their singles' sum). NaN when the singles' drops sum to ``<= 0`` (no head matters).
        A ratio of sums, not a mean of per-pair ratios, so pairs of near-zero singles do not dominate it."""
        if not self.pairs:
            return math.nan
        single = [self.drop(i, metric=metric) for i in range(self.k)]
        denom = sum(single[i] + single[j] for i, j in self.pairs)
        if not denom > 0:
            return math.nan
        return 1.0 - sum(self.drop(i, j, metric) for i, j in self.pairs) / denom

    def redundancy_interval(self, metric: str | None = None) -> tuple[float, float]:
        """Paired bootstrap interval of :meth:`redundancy` at :attr:`level` (resamples whose singles sum to
        ``<= 0`` are left out)."""
        base, single, pair = self._resampled(metric)
        if not pair:
            return (math.nan, math.nan)
        num = sum(single[i] + single[j] - base - v for (i, j), v in pair.items())
        den = sum(2 * base - single[i] - single[j] for (i, j) in pair)
        ok = den > 0
        if not bool(ok.any()):
            return (math.nan, math.nan)
        return interval(-num[ok] / den[ok], self.level)  # R = -Σ interaction / Σ (drop_i + drop_j)

    def counts(self, metric: str | None = None) -> dict[str, int]:
        """How many pairs are super-additive, sub-additive and additive (by their intervals)."""
        kinds = [self.kind(lo, hi) for lo, hi in self.intervals(metric).values()]
        return {k: kinds.count(k) for k in KINDS}

    @property
    def metrics(self) -> dict[str, Any]:
        """``baseline``, ``redundancy`` (with ``redundancy_low`` / ``_high``), ``mean_interaction``, the counts of
        each kind of pair, ``metric``, ``n_heads``, ``n_pairs``, ``n_samples``, ``seconds``."""
        mat = self.matrix()
        inter = [float(mat[i, j]) for i, j in self.pairs]
        lo, hi = self.redundancy_interval()
        return {"metric": self.metric, "baseline": self.baseline_value(), "redundancy": self.redundancy(),
                "redundancy_low": lo, "redundancy_high": hi,
                "mean_interaction": sum(inter) / len(inter) if inter else math.nan, **self.counts(),
                "n_heads": self.k, "n_pairs": len(self.pairs), "n_samples": self.n_samples, "seconds": self.seconds}

    def to_frame(self, metric: str | None = None) -> pd.DataFrame:
        """One row per pair ``i < j``: columns :data:`PAIR_COLUMNS` (``low`` / ``high``: the interaction's paired
        bootstrap interval; ``kind``: super-additive / sub-additive / additive by whether it excludes 0)."""
        ci = self.intervals(metric)
        single = [self.drop(i, metric=metric) for i in range(self.k)]
        rows = []
        for (i, j) in sorted(self.pairs):
            dij = self.drop(i, j, metric)
            lo, hi = ci[(i, j)]
            rows.append({"head_i": self.heads[i].name, "head_j": self.heads[j].name, "drop_i": single[i],
                         "drop_j": single[j], "drop_ij": dij, "interaction": dij - single[i] - single[j],
                         "low": lo, "high": hi, "kind": self.kind(lo, hi)})
        return pd.DataFrame(rows, columns=PAIR_COLUMNS)

    # ---- persistence -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything measured as strict-JSON data (non-finite numbers as null); :meth:`from_dict` reads it back."""
        return clean_json({"format": FORMAT, "format_version": FORMAT_VERSION, "model": self.model, "task": self.task,
                           "metric": self.metric, "method": self.method, "heads": [h.name for h in self.heads],
                           "level": self.level, "n_boot": self.n_boot, "seconds": self.seconds,
                           "baseline": results_to_json(self.baseline), "singles": [results_to_json(s) for s in self.singles],
                           "pairs": [{"i": i, "j": j, "results": results_to_json(r)} for (i, j), r in sorted(self.pairs.items())]})

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Interactions":
        """The result :meth:`to_dict` described; :class:`InputError` for another format, version or a malformed body."""
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InputError(f"not an {FORMAT} document (format {d.get('format') if isinstance(d, dict) else None!r})")
        if d.get("format_version") != FORMAT_VERSION:
            raise InputError(f"{FORMAT} format version {d.get('format_version')!r}; this gna_interp reads {FORMAT_VERSION}")
        try:
            heads = [HeadRef.parse(n) for n in d["heads"]]
            singles = [results_from_json(s) for s in d["singles"]]
            pairs = {(int(p["i"]), int(p["j"])): results_from_json(p["results"]) for p in d["pairs"]}
            out = cls(str(d["model"]), str(d["task"]), str(d["metric"]), str(d["method"]), heads,
                      results_from_json(d["baseline"]), singles, pairs, float(d.get("level", 0.95)),
                      int(d.get("n_boot", N_BOOTSTRAP)), float(d.get("seconds") or 0.0))
        except (KeyError, TypeError, ValueError) as e:  # HeadError, OptionError are ValueErrors
            raise InputError(f"not an {FORMAT} document ({type(e).__name__}: {str(e)[:120]})") from None
        if len(singles) != len(heads) or any(not 0 <= i < j < len(heads) for i, j in pairs):
            raise InputError(f"{FORMAT}: {len(singles)} singles and pairs {sorted(pairs)} do not fit {len(heads)} heads")
        if len(set(heads)) < len(heads) or len(pairs) < len(d["pairs"]):
            raise InputError(f"{FORMAT}: a head or a pair is listed twice (heads {[h.name for h in heads]})")
        n = len(next(iter(out.baseline.values()), []))
        if not n or any(len(v) != n for r in [out.baseline, *singles, *pairs.values()] for v in r.values()):
            raise InputError(f"{FORMAT}: per-sample lists differ in length from the baseline's {n}")
        return out

    # ---- display -----------------------------------------------------------------------------------
    def summary(self) -> str:
        """A few lines: the metric, the redundancy and how many pairs are of each kind."""
        m = self.metrics
        return (f"interactions of {self.k} heads in {self.model} on {self.task} ({m['n_samples']} samples, "
                f"{self.method} ablation), {self.metric} {m['baseline']:.3f} intact\n"
                f"redundancy {m['redundancy']:.3f} [{m['redundancy_low']:.3f}, {m['redundancy_high']:.3f}], mean "
                f"interaction {m['mean_interaction']:.3f}; pairs: {m['super-additive']} super-additive, "
                f"{m['sub-additive']} sub-additive, {m['additive']} additive")

    def _repr_title(self) -> tuple[str, str]:  # the pair table follows (viz.interaction_heatmap draws the matrix)
        return (f"Interactions of {self.k} heads in {self.model} on {self.task}",
                f"{self.n_samples} samples, {self.method} ablation, {self.level:.0%} paired bootstrap intervals")

    def _repr_facts(self) -> list[tuple[str, Any]]:
        return [(k, fmt(v)) for k, v in self.metrics.items()]

    def __repr__(self) -> str:
        return (f"Interactions({self.model!r}, {self.k} heads, {len(self.pairs)} pairs, {self.metric}, "
                f"redundancy {self.redundancy():.3f})")


@options
class InteractionOptions(Options):
    """How :func:`interactions` measures.

    Attributes:
        metric: the metric the drops are read in; batch_size: prompts a forward.
        method, reference: the ablation's (:func:`~gna_interp.interventions.ablation.ablate`).
        level, n_boot: the bootstrap intervals' confidence level and resamples.
    """

    metric: str = "logit_diff"
    batch_size: int = 16
    method: AblationMethod = "zero"
    reference: Any = None
    level: float = 0.95
    n_boot: int = N_BOOTSTRAP

    def validate(self) -> None:
        check_int("batch_size", self.batch_size, 1)
        check_n_boot(self.n_boot)
        check_level(self.level)


def interactions(model: Model, task: Task | ScoringPlan, heads: Sequence[HeadRef | str] | str,
                 config: InteractionOptions | None = None, *, runner: SetAblation | None = None,
                 **overrides: Any) -> Interactions:
    """Remove each of ``heads`` alone and every pair of them together; see the module docstring for the numbers.

    ``config`` (:class:`InteractionOptions`) or keyword ``overrides`` of its fields: ``metric``, ``batch_size``,
    ``method``, ``reference``, ``level``, ``n_boot``. ``k`` heads cost ``1 + k + k(k-1)/2`` set ablations, all
    through one :class:`SetAblation`, the sets stacked in its replays (:meth:`SetAblation.run_many`; pass
    ``runner``, one made for ``task`` with ``method``, to reuse its clean prefixes). Example::

        res = interactions(model, KVRetrieval(10, 24, template="completion", max_value=99),
                           ["L16H0", "L18H6", "L16H2", "L19H8", "L17H8"])
        res.matrix(); res.to_frame(); res.redundancy()
    """
    check_model(model)
    cfg = InteractionOptions.build(config, **overrides)
    metric, batch_size, method, reference, level, n_boot = (cfg.metric, cfg.batch_size, cfg.method, cfg.reference,
                                                            cfg.level, cfg.n_boot)
    get_metric(metric)
    if not 0 < level < 1:
        raise InputError(f"level must lie strictly between 0 and 1, got {level!r}")
    parsed = model.check_heads(heads)
    if len(parsed) < 2:
        raise InputError(f"interactions need at least 2 heads, got {len(parsed)}")
    start = time.perf_counter()
    runner = SetAblation.of(model, runner if runner is not None else task, method, reference, batch_size)
    baseline = results(runner.clean())
    combos = list(itertools.combinations(range(len(parsed)), 2))
    scored = [results(s) for s in runner.run_many([[h] for h in parsed] + [[parsed[i], parsed[j]] for i, j in combos])]
    singles, pairs = scored[:len(parsed)], dict(zip(combos, scored[len(parsed):]))
    name = task.name if isinstance(task, Task) else "samples"
    return Interactions(model.name, name, metric, runner.method, parsed, baseline, singles, pairs, level, n_boot,
                        time.perf_counter() - start)


head_interactions = interactions  # the name the circuits package exports (``circuits.scan.interactions`` is this module)
