"""`reference_scan`: the plain loop every fast scan is tested against.

For each head: remove it with :func:`~gna_interp.interventions.ablate` (undone on exit), score every sample of the
task from scratch with :func:`~gna_interp.engine.score_candidates` (no shared prefix, no replay, no attribution), and
keep the per-sample results. Nothing is cached between heads, so it is slow (one full pass of the task a head) and
obviously right; ``scan_heads(strategy="exact")`` replays only the blocks after each head from cached prefixes and
must give the same numbers to float noise (``tests/test_reference.py``).
"""

from __future__ import annotations

from typing import Any, Sequence

from gna_interp.circuits.scan.result import HeadScan
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod, ablate
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model, check_model
from gna_interp.options import Options, options
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import Results, results
from gna_interp.engine.forward import score_candidates

__all__ = ["ReferenceOptions", "reference_scan"]


@options
class ReferenceOptions(Options):
    """How :func:`reference_scan` removes and scores: the ablation ``method`` (``"zero"``, or ``"mean"`` with
    ``reference``, the prompts or task whose mean activation replaces the head, as in :func:`ablate`), the scan's
    ``metric`` and ``batch_size`` prompts a forward."""

    method: AblationMethod = "zero"
    reference: Any = None
    metric: str = "logit_diff"
    batch_size: int = 16


def reference_scan(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None = None,
                   config: ReferenceOptions | None = None, **overrides: Any) -> HeadScan:
    """Ablate each of ``heads`` (default: every head) alone and score ``task`` with plain forwards: a
    :class:`HeadScan` (strategy ``reference``) with every head run exactly. ``config`` (:class:`ReferenceOptions`)
    or keyword ``overrides`` of its fields: ``method``, ``reference``, ``metric``, ``batch_size``."""
    check_model(model)
    cfg = ReferenceOptions.build(config, **overrides)
    method, reference, metric, batch_size = cfg.method, cfg.reference, cfg.metric, cfg.batch_size
    if not isinstance(task, Task):
        raise InputError(f"reference_scan needs a Task (e.g. KVRetrieval(...)), got {type(task).__name__}")
    if method not in ("zero", "mean"):
        raise InputError(f"reference_scan takes method 'zero' or 'mean', got {method!r}")
    head_list = list(dict.fromkeys(model.check_heads(heads) if heads is not None else model.heads()))

    def score() -> Results:
        return results(score_candidates(model, task.samples, batch_size=batch_size, share_prefix=False))

    scan = HeadScan(model.name, task.name, method, metric, "reference", head_list, score())
    for head in head_list:
        with ablate(model, [head], method, reference):
            scan.exact[head] = score()
    return scan
