"""`scan_heads`: how much a task's metric drops when each head is ablated on its own.

Strategies:

- ``exact`` (fast): one clean forward per batch records every block's input
  (:mod:`gna_interp.circuits.replay`); ablating a head of layer ``L`` then re-runs only blocks
  ``L..N-1``, ``stack`` ablations of the same layer share one replay (copies of the batch), and the
  unembedding is applied only where the metric reads. When candidates span several tokens (several
  scoring rows per sample) on an attention-only model, each sample's rows are *packed* into one
  sequence -- the prompt once, the continuations as a tree under a tree-shaped attention mask
  (:func:`~gna_interp.tasks.scoring.layout_chunks`) -- so a multi-token task costs what a single-token
  one does. Its numbers equal ``naive``'s to float noise.
- ``naive``: one full forward of the task per head with one ablation hook (the reference; full
  rows through :func:`gna_interp.tasks.run_plan`, no KV-cached prompt).
- ``attribution``: attribution patching (:mod:`gna_interp.circuits.attribution`) -- a first-order
  estimate for all heads from one forward and one backward per batch.
- ``auto``: ``attribution``, then ``exact`` runs until the leading ``certify`` heads are settled. It
  first runs ``verify`` heads exactly, taken alternately from the largest estimated drops and the
  largest absolute *masses* (the estimate's per-token terms summed without cancellation: a head whose
  terms cancel can hide a large effect, see :mod:`gna_interp.circuits.attribution`). It then calibrates
  how far an estimate can be off: ``c`` = the largest ``(exact drop − estimated drop) / mass`` among the
  exact heads whose drop is below 1.5 times the ``certify``-th exact drop (the bar; heads far above it are
  left out of the calibration, as their large, saturating effects are underestimated in proportion to
  their size, which says nothing about heads near the bar). While some unrun head could still beat the
  bar -- ``estimated drop + c · mass`` above it -- the most threatening such heads are run exactly and
  ``c`` is recalibrated. The bound is empirical (``c`` is learnt from the heads run), not a proof;
  ``benchmarks/scan.py`` checks auto's top 10 against the exact scan's. (Scans restored from a
  checkpoint without masses use the ablation's relative size instead of the mass.) With 64 samples or
  more (``ScanConfig.screen``), heads the bound cannot rule out are first *screened*: run exactly on a
  quarter of the samples, and run on all of them only while their screening bound (mean + 3 bootstrap
  standard deviations of the drop on those samples) could still reach the leading heads.

  Measured on SmolLM2-135M, KV completion template, values 0-99, 10 pairs, 24 samples (seed 0): the
  exact top 10 are the estimate's ranks 0-9 except L16H0 (estimated -0.06, rank 214, exact drop 1.61, the
  largest: its terms cancel; its mass ranks 5th). Calibrated on sizes and on every exact head, the bound
  ran 249 of 270 heads; on masses, below 1.5 times the bar, 24 (seed 1: 22), with the same top 10 as
  the exact scan (docs/discovery.md §5).

Metrics: ``logit_diff`` (mean over samples of the gold candidate's score minus the best other's;
scores are summed log-probs, see :mod:`gna_interp.tasks.scoring`) or ``accuracy``. ``drop`` is
``baseline - ablated``; rank 1 is the largest drop. Attribution estimates the logit difference only:
under ``metric="accuracy"`` heads that were not run exactly have ``ablated``/``drop`` NaN and are
ranked, after the exact ones, by their estimated logit-difference drop.

Checkpoint: with ``checkpoint=PATH`` the per-sample results are written atomically (temporary file
+ ``os.replace``) after every finished group of heads; a later call with the same arguments resumes
from it, skipping finished heads. A checkpoint from a different model, task, method or head list is
refused. Options are a :class:`ScanConfig` (or keyword overrides of its fields).

Sharded (under ``torchrun``, see :mod:`gna_interp.circuits.distributed`): every rank runs the cheap,
sequential parts identically (plan, prefixes, attribution, the ``auto`` decisions; rank 0 broadcasts
the baseline, the estimates, ``stack`` and the replay check), and each exact phase -- the initial heads,
each ``auto`` round, each screening round -- is cut into the replay groups one process would run and
split by whole groups over the ranks; the ranks all-gather the results after the phase. Each rank
checkpoints into its own file; rank 0 writes the merged checkpoint at the end. The numbers are bitwise
those of one process with the same thread count.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import pandas as pd
import torch
from torch import Tensor
from tqdm.auto import tqdm

from gna_interp.circuits.attribution import attribution_estimates, logprob_weights, metric_weights
from gna_interp.circuits.distributed import Shard, active, assign, check_world, rank_files, rank_path
from gna_interp.circuits.replay import DEFAULT_PREFIX_BYTES, Prefixes, ReplayMismatch, replay_scores
from gna_interp.errors import InputError, OptionError
from gna_interp.interventions.ablation import METHODS, AblationMethod, Replacement, ablation_hooks, replacements
from gna_interp.models.estimate import replay_stack
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_choice, check_int, options
from gna_interp.store import read_json, write_json
from gna_interp.tasks.base import Task
from gna_interp.tasks.scoring import (CandidateScores, Chunk, ScoringPlan, layout_chunks, plan_scoring, run_plan,
                                      whole_samples)

Strategy = Literal["exact", "naive", "attribution", "auto"]
Metric = Literal["logit_diff", "accuracy", "logprob"]
STRATEGIES: tuple[str, ...] = ("exact", "naive", "attribution", "auto")
METRICS: tuple[str, ...] = ("logit_diff", "accuracy", "logprob")
COLUMNS = ["layer", "head", "kind", "name", "baseline", "ablated", "drop", "rank", "source", "est_drop", "est_mass",
           "drop_lo", "drop_hi", "screen_drop"]
N_BOOTSTRAP = 1000

__all__ = ["COLUMNS", "METRICS", "STRATEGIES", "HeadScan", "Metric", "ScanConfig", "Strategy", "default_verify",
           "scan_heads"]
DEFAULT_CERTIFY = 10
SCREEN_Z = 3.0
CALIBRATION_CEILING = 1.5  # auto calibrates its error bound on exact heads whose drop is below this x the bar


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
        stack: ablations per replay (default: on CPU as many as keep a replay within 64 rows; on CUDA as
            many as fit in half the free GPU memory, see :func:`~gna_interp.models.estimate.replay_stack`).
        scoring: candidate scoring method of :func:`~gna_interp.tasks.scoring.plan_scoring`
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
class HeadScan:
    """Result of :func:`scan_heads`.

    ``baseline`` / ``exact[head]`` hold per-sample ``logit_diff`` and ``correct`` tensors (clean run /
    that head ablated); ``estimates[head]`` is the attribution estimate of the ablated mean logit
    difference, ``sizes[head]`` the relative size of its ablation and ``masses[head]`` the estimate's
    absolute mass, its per-token terms summed without cancellation (see
    :mod:`gna_interp.circuits.attribution`).
    :meth:`to_frame` has one row per head with columns :data:`COLUMNS`.
    """

    model: str
    task: str
    method: str
    metric: str
    strategy: str
    heads: list[HeadRef]
    baseline: dict[str, Tensor]
    exact: dict[HeadRef, dict[str, Tensor]] = field(default_factory=dict)
    estimates: dict[HeadRef, float] = field(default_factory=dict)
    sizes: dict[HeadRef, float] = field(default_factory=dict)
    masses: dict[HeadRef, float] = field(default_factory=dict)
    seconds: float = 0.0
    unsettled: int = 0
    screened: dict[HeadRef, dict[str, Tensor]] = field(default_factory=dict)
    screen_index: list[int] = field(default_factory=list)

    @property
    def estimand(self) -> str:
        """What attribution estimates for this scan: ``logprob`` for a ``logprob`` scan, else ``logit_diff``."""
        return "logprob" if self.metric == "logprob" else "logit_diff"

    def _value(self, per_sample: dict[str, Tensor], metric: str | None = None) -> float:
        n = len(next(iter(per_sample.values())))
        return float(self._resampled(per_sample, torch.arange(n)[None], metric)[0])

    @property
    def baseline_value(self) -> float:
        return self._value(self.baseline)

    def ablated(self, head: HeadRef | str, metric: str | None = None) -> float:
        """Metric with ``head`` ablated: exact when it was run exactly, else the attribution estimate
        (logit difference only; NaN for accuracy)."""
        h = HeadRef.parse(head)
        if h in self.exact:
            return self._value(self.exact[h], metric)
        if h in self.estimates and (metric or self.metric) == self.estimand:
            return self.estimates[h]
        return math.nan

    def screen_bound(self, head: HeadRef, z: float | None = None, n_boot: int = 400) -> tuple[float, float]:
        """A screened head's drop of :attr:`estimand` on the screening samples and its upper bound
        ``mean + z * sd`` (default ``z``: :data:`SCREEN_Z`) over bootstrap resamples of those samples
        (paired with the baseline)."""
        z = SCREEN_Z if z is None else z
        idx = torch.tensor(self.screen_index)
        base = {k: v[idx] for k, v in self.baseline.items()}
        per = self.screened[head]
        m = len(idx)
        boot = torch.randint(0, m, (n_boot, m), generator=torch.Generator().manual_seed(0))
        d = (self._resampled(base, boot, self.estimand) - self._resampled(per, boot, self.estimand)).double()
        full = torch.arange(m)[None]
        mean = float(self._resampled(base, full, self.estimand)[0] - self._resampled(per, full, self.estimand)[0])
        return mean, mean + z * float(d.std())

    def error_scale(self, head: HeadRef) -> float:
        """How far ``auto`` lets ``head``'s estimate be off, in units of its calibration constant: the
        estimate's absolute mass when attribution measured it, else the ablation's relative size."""
        return self.masses[head] if self.masses else self.sizes[head]

    def drop(self, head: HeadRef | str, metric: str | None = None) -> float:
        """The drop of the metric (default: the scan's) when ``head`` alone is ablated: the intact model's value
        minus the ablated one. Exact for an exactly run head; for another head the attribution estimate of the
        scan's estimand (NaN when there is none)."""
        return self._value(self.baseline, metric) - self.ablated(head, metric) if self.baseline else math.nan

    def drops(self, metric: str | None = None) -> dict[HeadRef, float]:
        """:meth:`drop` of every scanned head, in scan order (``{HeadRef: drop}``)."""
        return {h: self.drop(h, metric) for h in self.heads}

    def est_drop(self, head: HeadRef) -> float:
        """Attribution estimate of the drop of :attr:`estimand` when ``head`` is ablated (NaN if none)."""
        return self._value(self.baseline, self.estimand) - self.estimates[head] if head in self.estimates else math.nan

    def _resampled(self, per_sample: dict[str, Tensor], idx: Tensor, metric: str | None = None) -> Tensor:
        """The metric on each row of sample indices ``idx`` (``[B, n]``): ``[B]`` values."""
        m = metric or self.metric
        if m == "accuracy":
            return per_sample["correct"][idx].float().mean(-1)
        if m == "logprob":
            return per_sample["gold_score"][idx].sum(-1) / per_sample["n_gold"][idx].sum(-1).clamp_min(1)
        return per_sample["logit_diff"][idx].mean(-1)

    def intervals(self, level: float = 0.95, n_boot: int = N_BOOTSTRAP) -> dict[HeadRef, tuple[float, float]]:
        """Bootstrap interval (over samples, paired with the baseline; fixed seed) of each exactly run
        head's drop: ``{head: (low, high)}`` at ``level``."""
        if not self.baseline or not self.exact:
            return {}
        key = (id(self.exact), len(self.exact), id(self.baseline), level, n_boot)
        cached = getattr(self, "_intervals", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        n = len(next(iter(self.baseline.values())))
        idx = torch.randint(0, n, (n_boot, n), generator=torch.Generator().manual_seed(0))
        base = self._resampled(self.baseline, idx)
        q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
        out = {}
        for h, per in self.exact.items():
            lo, hi = torch.quantile((base - self._resampled(per, idx)).double(), q).tolist()
            out[h] = (lo, hi)
        self._intervals = (key, out)
        return out

    def stability(self, top: int = 10) -> dict[str, Any]:
        """How stable the ranking is: the exactly run heads ranked on two disjoint halves of the samples
        (even / odd), and the overlap of their top ``k = min(top, n_exact)`` (``top_k_overlap``) and top 5."""
        exact = [h for h in self.heads if h in self.exact]
        if not self.baseline or len(exact) < 2:
            return {}
        n = len(next(iter(self.baseline.values())))
        halves = [torch.arange(0, n, 2)[None], torch.arange(1, n, 2)[None]]
        if halves[1].numel() == 0:
            return {}
        ranks, per_half = [], []
        for idx in halves:
            base = float(self._resampled(self.baseline, idx)[0])
            drops = {h: base - float(self._resampled(self.exact[h], idx)[0]) for h in exact}
            ranks.append(sorted(exact, key=lambda h: -drops[h]))
            per_half.append({h.name: d for h, d in drops.items()})
        k = min(top, len(exact))
        k5 = min(5, len(exact))
        return {"halves": "even/odd samples", "n_exact": len(exact), "k": k,
                "top_k_overlap": len(set(ranks[0][:k]) & set(ranks[1][:k])),
                "top5_overlap": len(set(ranks[0][:k5]) & set(ranks[1][:k5])),
                "top_half_a": [h.name for h in ranks[0][:k]], "top_half_b": [h.name for h in ranks[1][:k]],
                "drops_a": per_half[0], "drops_b": per_half[1]}

    def to_frame(self) -> pd.DataFrame:
        """One row per head, sorted by rank (1 = largest drop); ``drop_lo``/``drop_hi`` bound the drop of
        exactly run heads (95 % bootstrap interval over samples); ``screen_drop`` is a screened head's drop
        on the screening samples (``source`` ``screen``: its ``drop`` is still the attribution estimate)."""
        base = self.baseline_value
        ci = self.intervals()
        rows = []
        for h in self.heads:
            abl = self.ablated(h)
            est = self.est_drop(h)
            lo, hi = ci.get(h, (math.nan, math.nan))
            screen = self.screen_bound(h)[0] if h in self.screened else math.nan
            rows.append({"layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, "baseline": base,
                         "ablated": abl, "drop": base - abl, "source": "exact" if h in self.exact else "screen" if h in self.screened else
                         ("attribution" if h in self.estimates else "none"), "est_drop": est,
                         "est_mass": self.masses.get(h, math.nan),
                         "drop_lo": lo, "drop_hi": hi, "screen_drop": screen})
        df = pd.DataFrame(rows, columns=[c for c in COLUMNS if c != "rank"])
        exact_first = (df["source"] != "exact").astype(int)
        key = df["drop"].where(df["source"] == "exact", df["est_drop"]).fillna(-math.inf)
        order = sorted(range(len(df)), key=lambda i: (exact_first.iloc[i], -key.iloc[i], i))
        df = df.iloc[order].reset_index(drop=True)
        df.insert(COLUMNS.index("rank"), "rank", range(1, len(df) + 1))
        return df

    def top(self, k: int) -> list[HeadRef]:
        """The ``k`` best-ranked heads."""
        return [HeadRef.parse(n) for n in self.to_frame()["name"].head(k)]

    @property
    def metrics(self) -> dict[str, Any]:
        """``baseline`` (the metric of the intact model), ``metric``, ``n_heads``, ``n_exact``, ``n_screened``,
        ``unsettled``, ``seconds``."""
        return {"baseline": self.baseline_value if self.baseline else math.nan, "metric": self.metric,
                "n_heads": len(self.heads), "n_exact": len(self.exact), "n_screened": len(self.screened),
                "unsettled": self.unsettled,
                "seconds": self.seconds}

    def to_state(self) -> dict[str, Any]:
        """Everything the scan measured, as JSON-able values (see :meth:`from_state`)."""
        return {"model": self.model, "task": self.task, "method": self.method, "metric": self.metric,
                "strategy": self.strategy, "heads": [h.name for h in self.heads],
                "baseline": _to_json(self.baseline) if self.baseline else None,
                "exact": {h.name: _to_json(v) for h, v in self.exact.items()},
                "estimates": {h.name: v for h, v in self.estimates.items()},
                "sizes": {h.name: v for h, v in self.sizes.items()},
                "masses": {h.name: v for h, v in self.masses.items()}, "seconds": self.seconds,
                "unsettled": self.unsettled, "screen_index": list(self.screen_index),
                "screened": {h.name: _to_json(v) for h, v in self.screened.items()}}

    @classmethod
    def from_state(cls, state: dict[str, Any], where: str = "the scan state") -> "HeadScan":
        """The scan :meth:`to_state` described (its per-sample lists must agree in length: ``where`` names the
        source in the error)."""
        _check_lengths(state, where)
        scan = cls(state["model"], state["task"], state["method"], state["metric"], state["strategy"],
                   [HeadRef.parse(n) for n in state["heads"]], {}, seconds=float(state.get("seconds") or 0.0),
                   unsettled=int(state.get("unsettled") or 0))
        scan.restore(state)
        return scan

    def restore(self, state: dict[str, Any]) -> None:
        """Take the per-sample results, estimates and sizes of a saved state (a checkpoint's)."""
        if state.get("baseline"):
            self.baseline = _from_json(state["baseline"])
        self.exact = {HeadRef.parse(k): _from_json(v) for k, v in state.get("exact", {}).items()}
        self.estimates = {HeadRef.parse(k): float(v) for k, v in state.get("estimates", {}).items()}
        self.sizes = {HeadRef.parse(k): float(v) for k, v in state.get("sizes", {}).items()}
        self.masses = {HeadRef.parse(k): float(v) for k, v in (state.get("masses") or {}).items()}
        self.screen_index = [int(i) for i in state.get("screen_index") or []]
        self.screened = {HeadRef.parse(k): _from_json(v) for k, v in (state.get("screened") or {}).items()}

    def save(self, path: str | os.PathLike, run_id: str | None = None) -> Path:
        """Write the scan (every per-sample result) to ``path`` as a ``scan`` JSON document (``run_id``: the id
        of the saved result it belongs to)."""
        return write_json(path, "scan", {**self.to_state(), **({"run_id": run_id} if run_id else {})}, indent=None)

    @classmethod
    def load(cls, path: str | os.PathLike, run_id: str | None = None) -> "HeadScan":
        """Read a scan written by :meth:`save` (given ``run_id``, it must carry that id)."""
        return cls.from_state(read_json(path, "scan", run_id), where=str(path))

    def __repr__(self) -> str:
        return (f"HeadScan({self.model!r}, {self.task!r}, {len(self.heads)} heads, {self.strategy}, "
                f"{self.method} ablation, baseline {self.metric}={self.baseline_value:.3f}, "
                f"{len(self.exact)} exact, {self.seconds:.1f}s)")


def default_verify(n_heads: int, certify: int = DEFAULT_CERTIFY) -> int:
    """How many heads ``auto`` runs exactly before calibrating: twice ``certify``, at least 20 (all if fewer)."""
    return min(n_heads, max(20, 2 * certify))


# ---- per-sample summaries -------------------------------------------------------------------
_PER_SAMPLE = {"logit_diff": torch.float64, "correct": torch.bool, "gold_score": torch.float64, "n_gold": torch.long}


def per_sample(scores: CandidateScores) -> dict[str, Tensor]:
    """What a scan keeps per sample: logit difference, correctness, the gold continuation's summed
    log-prob and its token count."""
    n_gold = scores.n_tokens.gather(1, scores.gold[:, None])[:, 0]
    return {"logit_diff": scores.logit_diff.double().clone(), "correct": scores.correct.clone(),
            "gold_score": scores.gold_score.double().clone(), "n_gold": n_gold.clone()}


def _to_json(per: dict[str, Tensor]) -> dict[str, list]:
    return {k: per[k].tolist() for k in _PER_SAMPLE if k in per}


def _check_lengths(state: dict[str, Any], where: str) -> None:
    """Refuse a state whose per-sample lists disagree in length (every head's results cover the baseline's samples;
    a screened head's the screening samples) or that names results for heads it does not scan."""
    heads = set(state.get("heads") or [])
    n = None
    if state.get("baseline"):
        lengths = {len(v) for v in state["baseline"].values()}
        if len(lengths) > 1:
            raise InputError(f"{where}: the baseline's per-sample lists have different lengths {sorted(lengths)}")
        n = lengths.pop() if lengths else None
    m = len(state.get("screen_index") or [])
    for key, want in (("exact", n), ("screened", m)):
        for name, per in (state.get(key) or {}).items():
            if name not in heads:
                raise InputError(f"{where}: {key} holds results for {name}, which is not among the scanned heads")
            bad = {k: len(v) for k, v in per.items() if want is not None and len(v) != want}
            if bad:
                raise InputError(f"{where}: {key} {name} has {bad} per-sample values where the "
                                 f"{'baseline' if key == 'exact' else 'screening set'} has {want}")
    if n is not None and any(i >= n for i in state.get("screen_index") or []):
        raise InputError(f"{where}: screen_index names a sample beyond the {n} of the baseline")


def _from_json(d: dict[str, list]) -> dict[str, Tensor]:
    """Per-sample tensors from JSON (strict JSON stores a non-finite value, e.g. the infinite logit
    difference of a single-candidate sample, as null: it comes back as NaN)."""
    return {k: torch.tensor([math.nan if v is None else v for v in d[k]], dtype=dtype)
            for k, dtype in _PER_SAMPLE.items() if k in d}


# ---- checkpoint ---------------------------------------------------------------------------
def _fingerprint(model: Model, plan: ScoringPlan, method: str, heads: Sequence[HeadRef], reference: Any) -> str:
    ref = reference
    if ref is not None and hasattr(ref, "prompts"):
        ref = list(ref.prompts)
    if isinstance(ref, Tensor):
        ref = ref.tolist()
    elif ref is not None and hasattr(ref, "ids"):
        ref = ref.ids.tolist()
    first = next(model.hf_model.parameters())
    payload = {  # the dtype too: a resume in another precision would mix two models' numbers
        "model": model.name, "arch": model.architecture, "layers": model.n_layers, "dtype": str(first.dtype),
        "weights": float(first.detach().double().sum()),
        "task": [[s.prompt, list(s.candidates), s.gold] for s in plan.samples], "scoring": plan.method,
        "method": method, "reference": ref if ref is None or isinstance(ref, (list, str)) else repr(ref),
        "heads": [h.name for h in heads],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _write_checkpoint(path: Path, state: dict[str, Any]) -> None:
    """Write a checkpoint atomically (see :mod:`gna_interp.store`)."""
    write_json(path, "checkpoint", state, indent=None)


def _read_checkpoint(path: Path, fingerprint: str) -> dict[str, Any] | None:
    if not path.exists():
        return None
    try:
        state = read_json(path, "checkpoint")
    except InputError as e:
        raise InputError(f"checkpoint {str(path)!r} cannot be read: {e}; delete it to start the scan afresh") from e
    if state.get("fingerprint") != fingerprint:
        raise InputError(
            f"checkpoint {str(path)!r} belongs to a different scan (model, task, ablation method, reference or "
            f"head list differ); delete it (gna scan --fresh) or write elsewhere (another --out / checkpoint path)"
        )
    return state


def _merge_states(states: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """One checkpoint state from several of the same scan (a single process's and the ranks'): the union of
    their exact and screened heads (first seen first); baseline, estimates, sizes and screening samples
    from the first state that has them."""
    states = [s for s in states if s]
    if not states:
        return None
    out = {**states[0], "exact": {}, "screened": {}}
    for s in states:
        for key in ("exact", "screened"):
            for k, v in (s.get(key) or {}).items():
                out[key].setdefault(k, v)
        for key in ("baseline", "screen_index", "estimates", "sizes"):
            if not out.get(key) and s.get(key):
                out[key] = s[key]
    return out


def _resume_state(path: Path, fingerprint: str, shard: Shard | None) -> tuple[dict[str, Any] | None, bool]:
    """The state to resume from: ``path``'s checkpoint merged with every rank checkpoint beside it (all
    of them this scan's, else :class:`InputError`); under a shard, merged over what every rank sees.
    Also whether rank checkpoints were found."""
    state = _read_checkpoint(path, fingerprint)
    ranks = [_read_checkpoint(f, fingerprint) for f in rank_files(path)]
    if ranks:
        state = _merge_states([state, *ranks])
    if shard is not None:  # a rank may see files the others do not (no shared folder): merge what all saw
        seen = shard.gather((state, bool(ranks)))
        return _merge_states([s for s, _ in seen]), any(r for _, r in seen)
    return state, bool(ranks)


def _finish_checkpoint(scan: HeadScan, path: Path | None, fingerprint: str, shard: Shard | None,
                       merged: bool) -> None:
    """Leave what one process leaves: the whole scan in ``path``, and no rank checkpoints (under a shard
    rank 0 writes it; alone, only when rank checkpoints were merged, which are then deleted)."""
    if path is None or (shard is None and not merged):
        return
    if shard is None or shard.lead:
        _write_checkpoint(path, {"fingerprint": fingerprint, **scan.to_state()})
    if shard is not None:
        shard.barrier()  # the merged checkpoint is written: the rank files are no longer needed
    for f in rank_files(path):
        f.unlink(missing_ok=True)


def _agree(scan: HeadScan, shard: Shard | None) -> None:
    """Under a shard: rank 0's baseline, estimates and sizes on every rank (``auto`` decides from them)."""
    if shard is not None:
        scan.baseline, scan.estimates, scan.sizes = shard.broadcast((scan.baseline, scan.estimates, scan.sizes))


def _replay_problem(prefixes: Prefixes, shard: Shard | None) -> str | None:
    """None when replays reproduce the model, else why not (under a shard: rank 0's verdict)."""
    try:
        prefixes.verify()
        why = None
    except ReplayMismatch as e:
        why = str(e)
    return shard.broadcast(why) if shard is not None else why


Unit = list[Replacement]  # heads scored together: one replay group, or one head of the naive loop


class _Progress:
    """Collects results, mirrors them into the checkpoint, drives the progress bar; under a shard, splits
    each phase's units over the ranks and gathers their results (:meth:`run`)."""

    def __init__(self, scan: HeadScan, path: Path | None, fingerprint: str, bar: Any,
                 shard: Shard | None = None) -> None:
        self.scan, self.path, self.fingerprint, self.bar, self.shard = scan, path, fingerprint, bar, shard

    def save(self) -> None:
        if self.path is not None:
            _write_checkpoint(self.path, {"fingerprint": self.fingerprint, **self.scan.to_state()})

    def done(self, results: dict[HeadRef, CandidateScores]) -> None:
        for h, sc in results.items():
            self.scan.exact[h] = per_sample(sc)
        self.save()
        if self.bar is not None:
            self.bar.update(len(results))

    def run(self, units: list[Unit], compute: Callable[[Unit], dict[HeadRef, CandidateScores]],
            record: Callable[[dict[HeadRef, CandidateScores]], None], store: dict[HeadRef, dict[str, Tensor]],
            cost: Callable[[Unit], float]) -> None:
        """Score each unit with ``compute`` and ``record`` it (into ``store``; recording saves). Under a shard
        this rank runs only the units :func:`~gna_interp.circuits.distributed.assign` gives it (by ``cost``),
        then the ranks all-gather, and ``store`` takes every unit's heads in the order one process
        records them."""
        if self.shard is None:
            for unit in units:
                record(compute(unit))
            return
        owner = assign([cost(u) for u in units], self.shard.world)
        mine: dict[HeadRef, dict[str, Tensor]] = {}
        for unit, rank in zip(units, owner):
            if rank == self.shard.rank:
                record(compute(unit))
                mine.update({r.site.head: store[r.site.head] for r in unit})
        got = {h: v for part in self.shard.gather(mine) for h, v in part.items()}
        phase = [r.site.head for unit in units for r in unit]
        kept = {h: v for h, v in store.items() if h not in got}
        store.clear()
        store.update(kept)
        store.update({h: got[h] for h in phase})
        self.save()
        if self.bar is not None and store is self.scan.exact:
            self.bar.update(len(phase) - len(mine))


# ---- engines ------------------------------------------------------------------------------
def _exact_group(model: Model, plan: ScoringPlan, prefixes: Prefixes, group: list[Replacement],
                 ) -> dict[HeadRef, CandidateScores]:
    """Scores with each of ``group``'s heads (all in one layer) ablated, stacked in one replay per chunk."""
    return {r.site.head: sc for r, sc in zip(group, replay_scores(model, plan, prefixes, [[r] for r in group]))}


def _groups(replaced: list[Replacement], stack: int) -> list[list[Replacement]]:
    by_layer: dict[int, list[Replacement]] = {}
    for r in replaced:
        by_layer.setdefault(r.site.head.layer, []).append(r)
    return [rs[k:k + stack] for _, rs in sorted(by_layer.items()) for k in range(0, len(rs), stack)]


def _default_stack(model: Model, chunks: list[Chunk], max_prefix_bytes: int) -> int:
    """``ScanConfig.stack`` when unset: :func:`~gna_interp.models.estimate.replay_stack` for the largest chunk
    (on CPU ``64 // rows``; on CUDA sized to the free memory, less the clean prefixes the scan will keep)."""
    values = sum(c.n_tokens for c in chunks) * int(getattr(model.cfg, "d_model", 0) or 0) * model.n_layers
    kept = values * 4 <= max_prefix_bytes  # Prefixes' own rule (4 bytes a value)
    reads = max(-(-len(c.read_pos) // c.size) for c in chunks)
    return replay_stack(model, max(c.size for c in chunks), max(int(c.batch.ids.shape[1]) for c in chunks),
                        reads=reads, reserve_bytes=values * model.dtype.itemsize if kept else 0)


def _as_plan(model: Model, task: Task | ScoringPlan, scoring: Any) -> tuple[ScoringPlan, str]:
    if isinstance(task, ScoringPlan):
        return task, "samples"
    if not isinstance(task, Task):
        raise InputError(f"scan_heads needs a Task (e.g. KVRetrieval(...)) or a ScoringPlan, got {type(task).__name__}")
    return plan_scoring(model, task.samples, scoring), task.name  # type: ignore[arg-type]


def _attribution_phase(model: Model, plan: ScoringPlan, chunks: list[Chunk], prefixes: Prefixes,
                       replaced: list[Replacement], scan: HeadScan, progress: bool) -> None:
    """Fill ``scan.estimates`` (and the baseline, if missing) from one forward + backward per chunk."""
    weights = None
    if scan.estimand == "logprob":
        weights = logprob_weights(plan)
    elif not whole_samples(chunks):  # a sample's rows span several chunks: weights from a clean pass first
        weights = metric_weights(plan, prefixes.clean(plan))
    with tqdm(total=len(chunks), desc="attribution", unit="batch", disable=not progress, leave=False) as bar:
        att = attribution_estimates(model, plan, chunks, replaced, weights, bar.update)
    if not scan.baseline:
        scan.baseline = per_sample(att.clean)
    base = scan._value(scan.baseline, scan.estimand)
    scan.estimates = {r.site.head: base + float(e) for r, e in zip(replaced, att.delta)}
    scan.sizes = {r.site.head: float(z) for r, z in zip(replaced, att.size)}
    scan.masses = {r.site.head: float(a) for r, a in zip(replaced, att.mass)}


def _next_to_verify(scan: HeadScan, certify: int, count: int, settle_above: float | None = None,
                    focus: set[HeadRef] | None = None) -> list[HeadRef]:
    """The unrun heads (of ``focus``, when given) that could still displace the ``certify``-th exact drop or
    exceed ``settle_above`` (most threatening first, at most ``count``); empty when the leading heads are
    settled (see the module docstring). A screened head's bound is its screening bound
    (:meth:`HeadScan.screen_bound`)."""
    base = scan._value(scan.baseline, scan.estimand)
    drop = {h: base - scan._value(v, scan.estimand) for h, v in scan.exact.items()}
    est = {h: scan.est_drop(h) for h in scan.heads}
    bar = math.inf if certify <= 0 else sorted(drop.values(), reverse=True)[certify - 1] if len(drop) >= certify \
        else -math.inf
    if settle_above is not None:
        bar = min(bar, settle_above)
    c = _calibration(drop, est, scan, bar)
    bound = {h: scan.screen_bound(h)[1] if h in scan.screened else est[h] + c * scan.error_scale(h)
             for h in scan.heads if h not in drop and (focus is None or h in focus)}
    return sorted((h for h, b in bound.items() if b > bar), key=lambda h: -bound[h])[:count]


def _calibration(drop: dict[HeadRef, float], est: dict[HeadRef, float], scan: HeadScan, bar: float) -> float:
    """``c``: the largest ``(exact drop - estimated drop) / error scale`` among the exact heads whose drop is
    below :data:`CALIBRATION_CEILING` x ``bar`` (all exact heads when none is, or ``bar`` is not finite).
    Heads far above the bar are left out: first-order estimates underestimate large, saturating effects in
    proportion to their size (SmolLM2's L18H6: estimated 0.38, exact 1.03), and what the bound must decide
    is whether a head can cross the bar, not by how much a head already far above it does."""
    ratios = {h: (d - est[h]) / scan.error_scale(h) for h, d in drop.items() if scan.error_scale(h) > 0}
    near = [r for h, r in ratios.items() if not math.isfinite(bar) or drop[h] < CALIBRATION_CEILING * max(bar, 0.0)]
    return max([0.0] + (near or list(ratios.values())))


def _exact_phase(model: Model, plan: ScoringPlan, batch_size: int, prefixes: Prefixes, todo: list[Replacement],
                 stack: int, naive: bool, scan: HeadScan, rec: _Progress) -> None:
    """Run ``todo`` exactly (fast replay of the chunks' last blocks; one full forward per head when
    ``naive`` or when replays do not reproduce the model), recording each finished group."""
    if not naive and (problem := _replay_problem(prefixes, rec.shard)) is not None:
        warnings.warn(f"{problem}; falling back to one full forward per head", RuntimeWarning, stacklevel=3)
        naive = True
    if not scan.baseline:
        scan.baseline = per_sample(run_plan(model, plan, batch_size, share_prefix=False) if naive
                                    else prefixes.clean(plan))
        _agree(scan, rec.shard)
    rec.save()
    if naive:  # full rows, never a KV-cached prefix: one plain forward per batch and head
        rec.run([[r] for r in todo],
                lambda u: {u[0].site.head: run_plan(model, plan, batch_size, fwd_hooks=ablation_hooks(u),
                                                    share_prefix=False)},
                rec.done, scan.exact, lambda u: 1.0)
    else:
        rec.run(_groups(todo, stack), lambda g: _exact_group(model, plan, prefixes, g), rec.done, scan.exact,
                _replay_cost(model))


def _replay_cost(model: Model) -> Callable[[Unit], float]:
    """The relative cost of a replay group: its heads times the blocks it re-runs."""
    return lambda g: float(len(g) * (model.n_layers - g[0].site.head.layer))


def scan_heads(model: Model, task: Task | ScoringPlan, heads: Sequence[HeadRef | str] | str | None = None,
               config: ScanConfig | None = None, **overrides: Any) -> HeadScan:
    """Ablate each head of ``heads`` (default: every head of ``model``) on its own and measure the metric.

    ``task`` is a task (or a :class:`~gna_interp.tasks.scoring.ScoringPlan` made from one); ``config`` a
    :class:`ScanConfig`, or keyword overrides of its fields (``strategy="auto"``, ``method``,
    ``metric``, ``batch_size``, ``checkpoint``, ...); an unknown keyword raises naming the closest one.
    Under ``torchrun`` (``WORLD_SIZE > 1``) the exact ablations are split over the ranks and every rank
    returns the whole scan (:mod:`gna_interp.circuits.distributed`).
    """
    cfg = ScanConfig.build(config, **overrides)
    head_list = list(dict.fromkeys(model.check_heads(heads) if heads is not None else model.heads()))
    if not head_list:
        raise InputError(f"no heads to scan: {model.name} has no supported heads, or the list given was empty")
    shard = active()
    if shard is not None:
        check_world(shard.world, len(head_list))
    lead = shard is None or shard.lead
    start = time.perf_counter()
    plan, task_name = _as_plan(model, task, cfg.scoring)
    replaced = replacements(model, head_list, cfg.method, cfg.reference)
    by_head = {r.site.head: r for r in replaced}
    chunks = layout_chunks(model, plan, cfg.batch_size, pack=False if cfg.method == "resample" else None)
    stack = cfg.stack or _default_stack(model, chunks, cfg.max_prefix_bytes)
    if shard is not None:  # rank 0's: a default sized to free GPU memory may differ between ranks
        stack = shard.broadcast(stack)
    path = Path(cfg.checkpoint) if cfg.checkpoint is not None else None
    fingerprint = _fingerprint(model, plan, cfg.method, head_list, cfg.reference)
    state, merged = _resume_state(path, fingerprint, shard) if path is not None else (None, False)

    scan = HeadScan(model.name, task_name, cfg.method, cfg.metric, cfg.strategy, head_list, {})
    if state is not None:
        scan.restore(state)
    prefixes = Prefixes(model, chunks, cfg.max_prefix_bytes)
    rec = _Progress(scan, rank_path(path, shard.rank, shard.world) if shard and path else path, fingerprint, None,
                    shard)
    if cfg.strategy in ("attribution", "auto") and len(scan.estimates) < len(head_list):
        _attribution_phase(model, plan, chunks, prefixes, replaced, scan, cfg.progress and lead)
        _agree(scan, shard)
        rec.save()
    focus = set(model.check_heads(list(cfg.focus))) if cfg.focus is not None else None
    todo = _initial_exact(scan, cfg, focus)
    with tqdm(total=len(todo), desc=f"scan {cfg.strategy}", unit="head", disable=not (cfg.progress and lead)) as bar:
        rec.bar = bar
        if todo or not scan.baseline:
            _exact_phase(model, plan, cfg.batch_size, prefixes, [by_head[h] for h in todo], stack,
                         cfg.strategy == "naive", scan, rec)
        if cfg.strategy == "auto" and (cfg.certify > 0 or cfg.settle_above is not None):
            screen = _Screen.make(model, plan, scan, cfg, shard)
            while more := _next_to_verify(scan, min(cfg.certify, len(head_list)),
                                          len(head_list) if screen else stack, cfg.settle_above, focus):
                capped = cfg.max_exact is not None and len(scan.exact) >= cfg.max_exact
                if screen and not capped and (fresh := [h for h in more if h not in scan.screened]):
                    screen.run(scan, [by_head[h] for h in fresh], stack, rec)
                    continue
                more = more[:stack]
                if capped:
                    scan.unsettled = len(_next_to_verify(scan, min(cfg.certify, len(head_list)), len(head_list),
                                                         cfg.settle_above, focus))
                    warnings.warn(f"auto scan stopped at max_exact={cfg.max_exact} exact heads; {scan.unsettled} unrun "
                                  f"heads could still enter the top {cfg.certify}", RuntimeWarning, stacklevel=2)
                    break
                more = more[:cfg.max_exact - len(scan.exact)] if cfg.max_exact is not None else more
                bar.total += len(more)
                bar.refresh()
                _exact_phase(model, plan, cfg.batch_size, prefixes, [by_head[h] for h in more], stack, False, scan,
                             rec)
    scan.seconds = time.perf_counter() - start
    _finish_checkpoint(scan, path, fingerprint, shard, merged)
    return scan


class _Screen:
    """The screening stage of ``auto``: exact runs on a spread subset of the samples (see ``ScanConfig.screen``)."""

    def __init__(self, model: Model, plan: ScoringPlan, prefixes: Prefixes) -> None:
        self.model, self.plan, self.prefixes = model, plan, prefixes

    @classmethod
    def make(cls, model: Model, plan: ScoringPlan, scan: HeadScan, cfg: ScanConfig,
             shard: Shard | None = None) -> "_Screen | None":
        n = len(plan.samples)
        m = (n // 4 if n >= 64 else 0) if cfg.screen is None else min(cfg.screen, n)
        if m < 2 or m >= n or cfg.method == "resample":
            return None
        scan.screen_index = scan.screen_index or [int(i) for i in torch.linspace(0, n - 1, m).round().long()]
        sub = plan_scoring(model, [plan.samples[i] for i in scan.screen_index], plan.method)  # type: ignore[arg-type]
        prefixes = Prefixes(model, layout_chunks(model, sub, cfg.batch_size), cfg.max_prefix_bytes)
        if _replay_problem(prefixes, shard) is not None:  # no fast replay: screening would cost what exact runs do
            return None
        return cls(model, sub, prefixes)

    def run(self, scan: HeadScan, todo: list[Replacement], stack: int, rec: _Progress) -> None:
        """Run ``todo`` on the screening samples, recording each finished group."""
        def record(results: dict[HeadRef, CandidateScores]) -> None:
            for h, sc in results.items():
                scan.screened[h] = per_sample(sc)
            rec.save()
            if rec.bar is not None:
                rec.bar.set_postfix_str(f"screened {len(scan.screened)} on {len(self.plan.samples)} samples")

        rec.run(_groups(todo, stack), lambda g: _exact_group(self.model, self.plan, self.prefixes, g), record,
                scan.screened, _replay_cost(self.model))


def _initial_exact(scan: HeadScan, cfg: ScanConfig, focus: set[HeadRef] | None = None) -> list[HeadRef]:
    """The heads run exactly first: every unfinished head (``exact``/``naive``), the ``verify`` heads
    (``auto``; among ``focus`` when given) taken alternately from the largest estimated drops and the largest
    absolute masses (a head whose terms cancel can hide a large effect, see
    :mod:`gna_interp.circuits.attribution`), none (``attribution``)."""
    if cfg.strategy in ("exact", "naive"):
        return [h for h in scan.heads if h not in scan.exact]
    if cfg.strategy != "auto":
        return []
    n = len(scan.heads)
    n_verify = default_verify(n, cfg.certify) if cfg.verify is None else min(cfg.verify, n)
    pool = [h for h in scan.heads if focus is None or h in focus]
    by_est = sorted(pool, key=lambda h: -scan.est_drop(h))
    by_mass = sorted(pool, key=lambda h: -scan.masses.get(h, 0.0)) if scan.masses else by_est
    order = list(dict.fromkeys(h for pair in zip(by_est, by_mass) for h in pair))
    return [h for h in order[:n_verify] if h not in scan.exact]
