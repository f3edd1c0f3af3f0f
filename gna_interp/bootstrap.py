"""The paired bootstrap every interval of the package is read from.

A comparison of arms measured on the same samples (the intact model and a head removed, a single and a pair, the
circuit alone and the full model) is resampled *paired*: every arm is indexed by the same rows of
:func:`paired_bootstrap`, so the per-sample correlation between arms stays in each resample. An interval is then the
two-sided quantile of the resampled statistic (:func:`interval`). The indices come from a generator of their own,
seeded (seed 0 unless told), so the same numbers give the same interval in every process.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.constants import N_BOOTSTRAP
from gna_interp.options import check_level, check_n_boot

__all__ = ["N_BOOTSTRAP", "far_outside", "interval", "paired_bootstrap"]


def paired_bootstrap(n: int, n_boot: int = N_BOOTSTRAP, seed: int = 0) -> Int[Tensor, "n_boot n"]:
    """``n_boot`` resamples of ``n`` sample indices drawn with replacement (``torch.randint`` on a generator seeded
    ``seed``): row ``b`` picks the samples of resample ``b`` for every arm of the comparison alike."""
    return torch.randint(0, n, (check_n_boot(n_boot), n), generator=torch.Generator().manual_seed(seed))


def interval(values: Float[Tensor, " n_boot"], level: float) -> tuple[float, float]:
    """The central ``level`` interval of resampled ``values``: their ``(1 - level) / 2`` and ``(1 + level) / 2``
    quantiles (float64)."""
    level = check_level(level)
    q = torch.tensor([(1 - level) / 2, (1 + level) / 2], dtype=torch.float64)
    lo, hi = torch.quantile(values.double(), q).tolist()
    return lo, hi


def far_outside(value: float | None, low: float | None, high: float | None) -> bool:
    """Whether a measured ``value`` lies far outside its own interval ``[low, high]`` (more than the interval's width
    beyond it): a bootstrap interval holds the estimate it was drawn around, so such a record was edited or mixed from
    two runs. False when any of the three is missing (None or NaN)."""
    if value is None or low is None or high is None or any(x != x for x in (value, low, high)):
        return False
    slack = max(high - low, 0.0) + 1e-9 * max(1.0, abs(value))
    return not low - slack <= value <= high + slack
