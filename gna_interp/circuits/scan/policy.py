"""The ``auto`` policy of a head scan, as pure functions of the scan so far: which heads to run exactly first, and
which unrun heads could still enter the leading ones (see :mod:`gna_interp.circuits.scan` for the rule and its
measured behaviour). Nothing here runs a model: the policy can be replayed on a recorded scan in seconds
(docs/discovery.md §5).
"""

from __future__ import annotations

import math

from gna_interp.circuits.scan.result import HeadScan
from gna_interp.models.heads import HeadRef

DEFAULT_CERTIFY = 10
CALIBRATION_CEILING = 1.5  # auto calibrates its error bound on exact heads whose drop is below this x the bar

__all__ = ["CALIBRATION_CEILING", "DEFAULT_CERTIFY", "calibration", "default_verify", "initial_exact",
           "next_to_verify"]


def default_verify(n_heads: int, certify: int = DEFAULT_CERTIFY) -> int:
    """How many heads ``auto`` runs exactly before calibrating: twice ``certify``, at least 20 (all if fewer)."""
    return min(n_heads, max(20, 2 * certify))



def next_to_verify(scan: HeadScan, certify: int, count: int, settle_above: float | None = None,
                    focus: set[HeadRef] | None = None) -> list[HeadRef]:
    """The unrun heads (of ``focus``, when given) that could still displace the ``certify``-th exact drop or
    exceed ``settle_above`` (most threatening first, at most ``count``); empty when the leading heads are
    settled (see the module docstring). A screened head's bound is its screening bound
    (:meth:`HeadScan.screen_bound`)."""
    drop = {h: scan.drop(h, scan.estimand) for h in scan.exact}
    est = {h: scan.est_drop(h) for h in scan.heads}
    bar = math.inf if certify <= 0 else sorted(drop.values(), reverse=True)[certify - 1] if len(drop) >= certify \
        else -math.inf
    if settle_above is not None:
        bar = min(bar, settle_above)
    c = calibration(drop, est, scan, bar)
    bound = {h: scan.screen_bound(h)[1] if h in scan.screened else est[h] + c * scan.error_scale(h)
             for h in scan.heads if h not in drop and (focus is None or h in focus)}
    return sorted((h for h, b in bound.items() if b > bar), key=lambda h: -bound[h])[:count]


def calibration(drop: dict[HeadRef, float], est: dict[HeadRef, float], scan: HeadScan, bar: float) -> float:
    """``c``: the largest ``(exact drop - estimated drop) / error scale`` among the exact heads whose drop is
    below :data:`CALIBRATION_CEILING` x ``bar`` (all exact heads when none is, or ``bar`` is not finite).
    Heads far above the bar are left out: first-order estimates underestimate large, saturating effects in
    proportion to their size (SmolLM2's L18H6: estimated 0.38, exact 1.03), and what the bound must decide
    is whether a head can cross the bar, not by how much a head already far above it does."""
    ratios = {h: (d - est[h]) / scan.error_scale(h) for h, d in drop.items() if scan.error_scale(h) > 0}
    near = [r for h, r in ratios.items() if not math.isfinite(bar) or drop[h] < CALIBRATION_CEILING * max(bar, 0.0)]
    return max([0.0] + (near or list(ratios.values())))



def initial_exact(scan: HeadScan, strategy: str, certify: int, verify: int | None = None,
                  focus: set[HeadRef] | None = None) -> list[HeadRef]:
    """The heads run exactly first: every unfinished head (``exact``/``naive``), the ``verify`` heads
    (``auto``; among ``focus`` when given) taken alternately from the largest estimated drops and the largest
    absolute masses (a head whose terms cancel can hide a large effect, see
    :mod:`gna_interp.engine.attribution`), none (``attribution``)."""
    if strategy in ("exact", "naive"):
        return [h for h in scan.heads if h not in scan.exact]
    if strategy != "auto":
        return []
    n = len(scan.heads)
    n_verify = default_verify(n, certify) if verify is None else min(verify, n)
    pool = [h for h in scan.heads if focus is None or h in focus]
    by_est = sorted(pool, key=lambda h: -scan.est_drop(h))
    by_mass = sorted(pool, key=lambda h: -scan.masses.get(h, 0.0)) if scan.masses else by_est
    order = list(dict.fromkeys(h for pair in zip(by_est, by_mass) for h in pair))
    return [h for h in order[:n_verify] if h not in scan.exact]
