"""`evaluate(model, task)`: score a task's candidates and summarise, with a progress bar."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.options import check_int
from gna_interp.models.model import Model, check_model
from gna_interp.tasks.base import Task
from gna_interp.tasks.scoring import (CandidateScores, ChunkHooks, Method, RunOptions, ScoringPlan, plan_scoring,
                                     run_plan)


@dataclass
class Evaluation:
    """Result of :func:`evaluate`: metrics, the per-sample table and the raw candidate scores."""

    task: str
    scores: CandidateScores
    seconds: float

    @property
    def metrics(self) -> dict[str, float]:
        """``accuracy, logit_diff, gold_prob, chance, n_samples, n_forwards, seconds``."""
        return {**self.scores.metrics, "n_forwards": self.scores.n_forwards, "seconds": self.seconds}

    @property
    def accuracy(self) -> float:
        return self.metrics["accuracy"]

    @property
    def logit_diff(self) -> float:
        return self.metrics["logit_diff"]

    @property
    def gold_prob(self) -> float:
        return self.metrics["gold_prob"]

    def to_frame(self) -> pd.DataFrame:
        """Per-sample table (see :meth:`CandidateScores.to_frame`)."""
        return self.scores.to_frame()

    @property
    def frame(self) -> pd.DataFrame:
        """Same as :meth:`to_frame`."""
        return self.to_frame()

    def __repr__(self) -> str:
        m = self.metrics
        return (f"Evaluation({self.task!r}: accuracy={m['accuracy']:.3f} (chance {m['chance']:.3f}), "
                f"logit_diff={m['logit_diff']:.3f}, gold_prob={m['gold_prob']:.3f}, n={m['n_samples']}, "
                f"{m['n_forwards']} forwards, {m['seconds']:.1f}s)")


    def _repr_html_(self) -> str:
        """Jupyter's display: the metrics table and the first few samples (``to_frame()`` has them all)."""
        from gna_interp import html_repr

        m = self.metrics
        rows = [["accuracy", html_repr.fmt(m["accuracy"]), f"chance {html_repr.fmt(m['chance'])}"],
                ["logit_diff", html_repr.fmt(m["logit_diff"]), "gold score minus the best other candidate's, mean"],
                ["gold_prob", html_repr.fmt(m["gold_prob"]), "probability of the gold continuation, mean"],
                ["n_samples", m["n_samples"], ""], ["n_forwards", m["n_forwards"], ""],
                ["seconds", html_repr.fmt(m["seconds"], 1), ""]]
        parts = [html_repr.title(f"Evaluation on {self.task}",
                             f"accuracy {html_repr.fmt(m['accuracy'])} (chance {html_repr.fmt(m['chance'])})"),
                 html_repr.table(["metric", "value", ""], rows)]
        n = int(m["n_samples"])
        if n:
            df = self.scores.to_frame().head(_SHOWN)
            parts.append(html_repr.title(f"first {len(df)} of {n} samples", ".to_frame() has every one"))
            parts.append(html_repr.table(["sample", "answer", "predicted", "correct", "logit_diff", "gold_prob"],
                                     [[r.sample, repr(r.answer), repr(r.predicted), "✓" if r.correct else "✗",
                                       html_repr.fmt(r.logit_diff), html_repr.fmt(r.gold_prob)] for r in df.itertuples()]))
        return html_repr.block(parts)


_SHOWN = 5  # samples an Evaluation shows in Jupyter


def evaluate(model: Model, task: Task | ScoringPlan, batch_size: int = 16, method: Method = "auto",
             fwd_hooks: ChunkHooks = (), config: RunOptions | None = None, **overrides: Any) -> Evaluation:
    """Score every sample of ``task`` on ``model`` (CPU or GPU, wherever the model lives).

    ``batch_size`` is the number of sequences per forward pass; ``config``
    (:class:`~gna_interp.tasks.scoring.RunOptions`) or keyword ``overrides`` of its fields: ``progress`` (a bar,
    default on) and ``share_prefix`` (how a sample's several rows are run, see
    :func:`~gna_interp.tasks.scoring.run_plan`: packed by default).
    Pass a :class:`ScoringPlan` (from :func:`plan_scoring` on this model, where it lives now) instead of a task to skip
    re-tokenizing when evaluating many times, e.g. under different ablations given as ``fwd_hooks``; a plan made for
    another model or device is refused (:meth:`ScoringPlan.check_model`; :func:`for_model` lays it out again).
    """
    check_model(model, runnable=False)  # a meta model: refused below, once its prompts are tokenised
    if not isinstance(task, (Task, ScoringPlan)):
        raise InputError(f"evaluate needs a Task (e.g. KVRetrieval(...)) or a ScoringPlan, got {type(task).__name__}")
    check_int("batch_size", batch_size, 1)
    plan = task if isinstance(task, ScoringPlan) else plan_scoring(model, task.samples, method)
    model.check_runnable()  # after tokenising: a meta model without tokenizer files says that first
    name = getattr(task, "name", "samples")
    start = time.perf_counter()
    cfg = RunOptions.build(config, **overrides)
    run = cfg.replace(progress=True if cfg.progress is None else cfg.progress, desc=cfg.desc or f"evaluate {name}")
    scores = run_plan(model, plan, batch_size, fwd_hooks, run)
    return Evaluation(name, scores, time.perf_counter() - start)
