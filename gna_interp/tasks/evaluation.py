"""`evaluate(model, task)`: score a task's candidates and summarise, with a progress bar."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Mapping

import pandas as pd
import torch

from gna_interp.constants import EVALUATION_JSON
from gna_interp.errors import InputError
from gna_interp.options import check_int
from gna_interp.models.model import Model, check_model
from gna_interp.results import Result
from gna_interp.tasks.base import Task
from gna_interp.tasks.io import sample_from_dict
from gna_interp.engine.forward import ChunkHooks, RunOptions, run_plan
from gna_interp.engine.plan import CandidateScores, Method, ScoringPlan, plan_of


@dataclass
class Evaluation(Result):
    """Result of :func:`evaluate`: metrics, the per-sample table and the raw candidate scores. Saves to one
    ``evaluation`` JSON file (:meth:`save` / :meth:`load`, a folder's ``evaluation.json``) holding the samples and
    every candidate's score, so :meth:`to_frame` and :attr:`metrics` read the same numbers after a round trip."""

    task: str
    scores: CandidateScores
    seconds: float

    FORMAT = "evaluation"
    FILE = EVALUATION_JSON

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

    # ---- persistence -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The task's name, the seconds taken and the candidate scores: the samples (:meth:`Sample.to_dict`), every
        candidate's summed log-prob (``scores``, one list a sample; a non-finite one, as the ``-inf`` of a
        candidate the sample lacks, as null) and token count (``n_tokens``), the scoring ``method``,
        ``n_forwards`` and the scores' ``dtype``."""
        s = self.scores
        return {"task": self.task, "seconds": float(self.seconds), "method": s.method, "n_forwards": int(s.n_forwards),
                "dtype": str(s.scores.dtype).removeprefix("torch."), "samples": [x.to_dict() for x in s.samples],
                "scores": [[v if math.isfinite(v) else None for v in row] for row in s.scores.tolist()],
                "n_tokens": s.n_tokens.tolist()}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Evaluation":
        """The evaluation :meth:`to_dict` described (a null score back as ``-inf``); :class:`InputError` for a
        malformed one."""
        try:
            samples = tuple(sample_from_dict(x) for x in d["samples"])
            dtype = _SCORE_DTYPES[str(d.get("dtype", "float64"))]
            rows = [[-math.inf if v is None else float(v) for v in row] for row in d["scores"]]
            scores = torch.tensor(rows, dtype=dtype) if rows else torch.empty((0, 0), dtype=dtype)
            n_tokens = torch.tensor(d["n_tokens"], dtype=torch.long) if rows else torch.empty((0, 0), dtype=torch.long)
            out = cls(str(d["task"]), CandidateScores(samples, scores, n_tokens, str(d["method"]), int(d["n_forwards"])),
                      float(d.get("seconds") or 0.0))
        except (KeyError, TypeError, ValueError, RuntimeError) as e:
            raise InputError(f"not an evaluation document ({type(e).__name__}: {str(e)[:120]})") from None
        widest = max((len(x.candidates) for x in samples), default=0)
        if scores.dim() != 2 or scores.shape != n_tokens.shape or len(scores) != len(samples) or scores.shape[1] < widest:
            raise InputError(f"an evaluation document whose scores ({list(scores.shape)}) and token counts "
                             f"({list(n_tokens.shape)}) do not give each of its {len(samples)} samples a row of at "
                             f"least {widest} candidates")
        return out


_SHOWN = 5  # samples an Evaluation shows in Jupyter
_SCORE_DTYPES = {"float64": torch.float64, "float32": torch.float32}  # the dtypes an evaluation document's scores take


def evaluate(model: Model, task: Task | ScoringPlan, batch_size: int = 16, method: Method = "auto",
             fwd_hooks: ChunkHooks = (), config: RunOptions | None = None, **overrides: Any) -> Evaluation:
    """Score every sample of ``task`` on ``model`` (CPU or GPU, wherever the model lives).

    ``batch_size`` is the number of sequences per forward pass; ``config``
    (:class:`~gna_interp.engine.forward.RunOptions`) or keyword ``overrides`` of its fields: ``progress`` (a bar,
    default on) and ``share_prefix`` (how a sample's several rows are run, see
    :func:`~gna_interp.engine.forward.run_plan`: packed by default).
    Pass a :class:`ScoringPlan` (from :func:`plan_scoring` on this model, where it lives now) instead of a task to skip
    re-tokenizing when evaluating many times, e.g. under different ablations given as ``fwd_hooks``; a plan made for
    another model or device is refused (:meth:`ScoringPlan.check_model`; :func:`for_model` lays it out again).
    """
    check_model(model, runnable=False)  # a meta model: refused below, once its prompts are tokenised
    check_int("batch_size", batch_size, 1)
    plan = plan_of(model, task, method, "evaluate")
    model.check_runnable()  # after tokenising: a meta model without tokenizer files says that first
    name = getattr(task, "name", "samples")
    start = time.perf_counter()
    cfg = RunOptions.build(config, **overrides)
    run = cfg.replace(progress=True if cfg.progress is None else cfg.progress, desc=cfg.desc or f"evaluate {name}")
    scores = run_plan(model, plan, batch_size, fwd_hooks, run)
    return Evaluation(name, scores, time.perf_counter() - start)
