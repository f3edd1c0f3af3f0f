"""The ablation curve: a task's metrics as the best-ranked heads are removed together, beside as many heads drawn at
random (each seed draws one random order of the other heads and removes its first ``j``), and the generic heads
(columns :data:`CURVE_COLUMNS`)."""

from __future__ import annotations

import math
import random
from typing import Any, Sequence

import pandas as pd

from gna_interp.engine.replay import SetAblation
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, options
from gna_interp.tasks.base import Task
from gna_interp.tasks.text import lm_loss

CURVE_COLUMNS = ["k", "series", "seed", "accuracy", "logit_diff", "gold_prob", "lm_loss", "heads"]

__all__ = ["CURVE_COLUMNS", "RANDOM_SALT", "CurveConfig", "ablation_curve", "curve_k", "random_orders"]


@options
class CurveConfig(Options):
    """How :func:`ablation_curve` removes heads.

    Attributes:
        k: the most heads removed together (the curve runs ``j = 0..k``).
        seeds: random orders of the other heads, compared with the top ``k`` at ``j = k``.
        method, reference: the ablation (and, for ``mean`` / ``resample``, its reference prompts or task).
        batch_size: prompts per forward.
        band: the random orders measured at every ``j`` (the curve's band; one by default: the other orders are
            measured at ``j = k`` only, where the comparison is made); None: all of them.
        generic: heads measured together at ``j = min(k, len(generic))`` (the generic heads of a control).
    """

    k: int = 5
    seeds: int = 3
    method: AblationMethod = "zero"
    reference: Any = None
    batch_size: int = 16
    band: int | None = 1
    generic: Sequence[HeadRef] = ()

    def validate(self) -> None:
        if isinstance(self.k, bool) or isinstance(self.seeds, bool) or self.k < 0 or self.seeds < 0:
            raise InputError(f"k and seeds must be >= 0, got k={self.k}, seeds={self.seeds}")


RANDOM_SALT = "gna-random-heads"  # the curve's random orders; other callers drawing the same heads pass it too


def random_orders(heads: Sequence[HeadRef], seeds: int, salt: str = RANDOM_SALT) -> list[list[HeadRef]]:
    """``seeds`` shuffles of ``heads``, seed ``s`` seeded by ``f"{salt}-{s}"`` (the same on every machine); the
    ablation curve's random draws are their prefixes, so any caller with the same pool and salt draws the same."""
    orders = []
    for s in range(seeds):
        order = list(heads)
        random.Random(f"{salt}-{s}").shuffle(order)
        orders.append(order)
    return orders


def ablation_curve(model: Model, task: Task | SetAblation, ranked: Sequence[HeadRef], pool: Sequence[HeadRef], *,
                   control: Task | SetAblation | None = None, config: CurveConfig | None = None,
                   **overrides: Any) -> pd.DataFrame:
    """Task metrics (and the LM loss on ``control`` when given) after removing ``ranked[:j]``
    (``j = 0..k``), ``j`` random heads of ``pool`` that are not among ``ranked[:k]`` (``seeds`` random
    orders), and the first ``k`` of ``generic`` (fewer when there are fewer); columns :data:`CURVE_COLUMNS`.

    The first ``band`` random orders are measured at every ``j`` (the curve's band); the others only at
    ``j = k``, where the top ``k`` are compared with the median of all ``seeds`` draws (``band=None``:
    every order at every ``j``). The generic heads are measured at ``j = k`` only, and the LM loss at
    ``j = 0`` and ``j = k`` (where the comparison is made). Each point replays only the blocks from its earliest
    removed head on, and the points of one series (nested sets) from the heads each adds
    (:meth:`~gna_interp.engine.replay.SetAblation.run_nested`); pass ``task`` (and ``control``) as a
    :class:`~gna_interp.engine.replay.SetAblation` made with the same method to reuse its clean prefixes.
    ``config``: a :class:`CurveConfig` (``k``, ``seeds``, ``method``, ``reference``, ``batch_size``, ``band``,
    ``generic``), or keyword overrides of its fields."""
    from gna_interp.models.model import check_model
    check_model(model)
    cfg = CurveConfig.build(config, **overrides)
    k, seeds, band, generic = cfg.k, cfg.seeds, cfg.band, list(cfg.generic)
    method, reference, batch_size = cfg.method, cfg.reference, cfg.batch_size
    others = [h for h in pool if h not in set(ranked[:k])]
    if k > len(ranked) or k > len(others):
        raise InputError(f"cannot remove k={k} heads: only {len(ranked)} ranked and {len(others)} other heads "
                         f"in the pool to draw random ones from")
    runner = SetAblation.of(model, task, method, reference, batch_size)
    ctl = SetAblation.of(model, control, method, reference, batch_size) if control is not None else None
    rows = []

    def points(series: str, seed: int, js: Sequence[int], order: Sequence[HeadRef]) -> None:
        """The points ``j in js`` of one series: ``order[:j]`` removed (nested sets share their replays)."""
        for j, scores in zip(js, runner.run_nested([order[:j] for j in js])):
            m = scores.metrics
            measured = j in (0, k) or series == "generic"  # the generic point sits at min(k, len(generic))
            loss = lm_loss(ctl.run(order[:j])) if ctl is not None and measured else math.nan
            rows.append({"k": j, "series": series, "seed": seed, "accuracy": m["accuracy"],
                         "logit_diff": m["logit_diff"], "gold_prob": m["gold_prob"], "lm_loss": loss,
                         "heads": ",".join(h.name for h in order[:j])})

    points("top", 0, range(k + 1), ranked)
    base = dict(rows[0])
    for s, order in enumerate(random_orders(others, seeds)):
        rows.append({**base, "series": "random", "seed": s})
        points("random", s, range(1 if band is None or s < band else k, k + 1), order)
    if generic and k:
        rows.append({**base, "series": "generic", "seed": 0})
        points("generic", 0, [min(k, len(generic))], generic)
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def curve_k(n_heads: int, k: int) -> int:
    """How many heads the curve removes: ``k``, but at most a quarter of the heads (at least 1), so that
    ``k`` random heads are a small draw that cannot contain the circuit by construction."""
    return max(1, min(k, n_heads // 4)) if n_heads > 1 else min(k, n_heads)
