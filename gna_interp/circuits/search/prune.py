"""`prune_curve`: task scores as whole blocks are removed (gradually from the end, or one at a time)."""

from __future__ import annotations

from typing import Any, Iterable, Literal, Mapping, Sequence

import pandas as pd
from gna_interp.progress import tqdm

from gna_interp.errors import InputError
from gna_interp.interventions.layers import LayerSkip, check_layers
from gna_interp.models.model import Model, check_model
from gna_interp.options import Options, check_int, options
from gna_interp.tasks.base import Task
from gna_interp.engine.replay import FORWARDS, PlanRunner
from gna_interp.engine.plan import Method, plan_scoring

PruneMode = Literal["from_end", "single"]
COLUMNS = ["mode", "k", "layer", "skipped", "skipped_kinds", "task", "accuracy", "logit_diff", "gold_prob",
           "chance", "n_samples", "accuracy_drop", "logit_diff_drop"]


def _named_tasks(tasks: Task | Sequence[Task] | Mapping[str, Task]) -> dict[str, Task]:
    if isinstance(tasks, Task):
        return {tasks.name: tasks}
    if isinstance(tasks, Mapping):
        named = dict(tasks)
    else:
        named = {}
        for t in tasks:
            if t.name in named:
                raise InputError(f"two tasks are named {t.name!r}; pass a dict {{name: task}} to tell them apart")
            named[t.name] = t
    if not named:
        raise InputError("no tasks given to prune_curve")
    bad = [n for n, t in named.items() if not isinstance(t, Task)]
    if bad:
        raise InputError(f"prune_curve needs Task objects; got something else for {bad}")
    return named


def _settings(model: Model, mode: str, ks: Iterable[int] | None,
              layers: Iterable[int] | None) -> list[tuple[int, int | None, list[int]]]:
    """``(k, layer, skipped)`` per point, the unpruned model first."""
    n = model.n_layers
    if mode == "from_end":
        if layers is not None:
            raise InputError("mode='from_end' takes ks (how many final blocks to drop), not layers")
        wanted = range(n + 1) if ks is None else list(ks)
        bad = [k for k in wanted if isinstance(k, bool) or not isinstance(k, int) or not 0 <= k <= n]
        if bad:
            raise InputError(f"ks must be integers in 0..{n} (blocks of {model.name}), got {bad}")
        points = sorted(set(wanted) | {0})
        return [(k, None, list(range(n - k, n))) for k in points]
    if mode == "single":
        if ks is not None:
            raise InputError("mode='single' takes layers (which blocks to skip one at a time), not ks")
        idx = list(range(n)) if layers is None else check_layers(model, layers)
        return [(0, None, [])] + [(1, layer, [layer]) for layer in idx]
    raise InputError(f"unknown prune mode {mode!r}; choose 'from_end' or 'single'")


@options
class PruneScoring(Options):
    """How :func:`prune_curve` scores each point: ``batch_size`` prompts a forward, the scoring ``method``
    (:func:`~gna_interp.engine.plan.plan_scoring`), a ``progress`` bar."""

    batch_size: int = 16
    method: Method = "auto"
    progress: bool = True

    def validate(self) -> None:
        check_int("batch_size", self.batch_size, 1)


def prune_curve(model: Model, tasks: Task | Sequence[Task] | Mapping[str, Task], mode: PruneMode = "from_end",
                ks: Iterable[int] | None = None, layers: Iterable[int] | None = None,
                config: PruneScoring | None = None, **overrides: Any) -> pd.DataFrame:
    """Scores of ``tasks`` with blocks removed; the model is restored afterwards, whatever happens.

    ``mode="from_end"`` drops the last ``k`` blocks for each ``k`` in ``ks`` (default ``0..n_layers``);
    ``mode="single"`` skips each block of ``layers`` (default all) alone. The unpruned model is always
    the first point. Columns: ``mode, k, layer, skipped, skipped_kinds, task, accuracy, logit_diff,
    gold_prob, chance, n_samples, accuracy_drop, logit_diff_drop`` (drops are relative to the
    unpruned model; ``layer`` is the skipped block in ``single`` mode, else ``-1``). ``config``
    (:class:`PruneScoring`) or keyword ``overrides`` of its fields: ``batch_size``, ``method``, ``progress``.
    """
    check_model(model)
    cfg = PruneScoring.build(config, **overrides)
    batch_size, method, progress = cfg.batch_size, cfg.method, cfg.progress
    named = _named_tasks(tasks)
    points = _settings(model, mode, ks, layers)
    runners = {name: PlanRunner(model, plan_scoring(model, t.samples, method), batch_size=batch_size, replays=FORWARDS)
               for name, t in named.items()}
    kinds = model.layer_kinds()
    records = []
    for k, layer, skipped in tqdm(points, desc=f"prune {mode}", unit="point", disable=not progress):
        for name, runner in runners.items():
            m = runner.run_under([LayerSkip(tuple(skipped))]).metrics
            records.append({"mode": mode, "k": k, "layer": -1 if layer is None else layer,
                            "skipped": ",".join(map(str, skipped)),
                            "skipped_kinds": ",".join(sorted({kinds[i] for i in skipped})), "task": name,
                            **{c: m[c] for c in ("accuracy", "logit_diff", "gold_prob", "chance", "n_samples")}})
    df = pd.DataFrame(records)
    base = df[df["skipped"] == ""].drop_duplicates("task").set_index("task")
    df["accuracy_drop"] = df["task"].map(base["accuracy"]) - df["accuracy"]
    df["logit_diff_drop"] = df["task"].map(base["logit_diff"]) - df["logit_diff"]
    return df[COLUMNS]
