"""The task metrics, each defined once: logit difference, accuracy, and the gold continuation's log-prob per token.

Scans, their intervals and halves, attribution, the control and evaluation read a metric from here, as
TransformerLens's ``generic_activation_patch`` takes one metric callable. A metric maps **per-sample results**
(:data:`Results`, made from scored candidates by :func:`results`) to one number:

- :meth:`Metric.value` on all the samples, and :meth:`Metric.resampled` on each row of a ``[B, n]`` tensor of
  sample indices (bootstrap resamples, the even / odd halves);
- its **estimand** is the metric attribution estimates in its place (accuracy is a step function: attribution
  estimates the logit difference for it), and :meth:`Metric.target_weights` weighs the scored targets' log-probs
  so that their weighted sum is that metric (the seed of the backward pass).

=============  ====================================================================  ==============
metric         value                                                                 estimand
=============  ====================================================================  ==============
logit_diff     mean over samples of (gold candidate's score - best other's)          logit_diff
accuracy       fraction of samples whose best-scored candidate is the gold one       logit_diff
logprob        gold continuations' summed log-prob / their token count (all          logprob
               samples pooled: the negative LM loss on a text task)
=============  ====================================================================  ==============
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.errors import OptionError

__all__ = ["ACCURACY", "LOGIT_DIFF", "LOGPROB", "METRICS", "Metric", "Results", "get_metric", "raw", "results"]

Results = dict[str, Tensor]  # per sample: logit_diff, correct, gold_score, n_gold (see RESULT_DTYPES)
RESULT_DTYPES: dict[str, torch.dtype] = {"logit_diff": torch.float64, "correct": torch.bool,
                                         "gold_score": torch.float64, "n_gold": torch.long}


class Scored(Protocol):
    """What the metrics read of scored candidates (:class:`~gna_interp.engine.plan.CandidateScores`)."""

    scores: Tensor
    gold: Tensor
    correct: Tensor
    logit_diff: Tensor
    gold_score: Tensor
    n_tokens: Tensor


class Planned(Protocol):
    """What the target weights read of a scoring plan (:class:`~gna_interp.engine.plan.ScoringPlan`)."""

    samples: Sequence[Any]
    targets: Sequence[Any]


def raw(scores: Scored) -> Results:
    """The per-sample results of ``scores`` as scored (their own dtype, not copied): what evaluation reports."""
    return {"logit_diff": scores.logit_diff, "correct": scores.correct, "gold_score": scores.gold_score,
            "n_gold": scores.n_tokens.gather(1, scores.gold[:, None])[:, 0]}


def results(scores: Scored) -> Results:
    """What a scan keeps per sample of ``scores``: logit difference, correctness, the gold continuation's summed
    log-prob and its token count (float64 / bool / long, detached copies)."""
    return {k: v.to(RESULT_DTYPES[k]).clone() for k, v in raw(scores).items()}


class Metric:
    """One task metric over per-sample results (see the module docstring); subclasses define :meth:`resampled`
    and :meth:`value` (both reduce in the dtype of the results given)."""

    name: ClassVar[str]
    estimand: ClassVar[str]
    needs_clean: ClassVar[bool]  # whether the estimand's target weights read the intact model's scores

    def resampled(self, res: Results, idx: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        """The metric on each row of sample indices ``idx``."""
        raise NotImplementedError

    def value(self, res: Results) -> float:
        """The metric on all the samples of ``res``."""
        raise NotImplementedError

    def target_weights(self, plan: Planned, clean: Scored | None) -> Float[Tensor, " n_targets"]:
        """Weights of the plan's targets whose weighted sum of log-probs is this metric's estimand (``clean``: the
        intact model's scores, which the weights read when :attr:`needs_clean`)."""
        return METRICS[self.estimand].target_weights(plan, clean)

    def __repr__(self) -> str:
        return f"Metric({self.name!r})"


class LogitDiff(Metric):
    name, estimand, needs_clean = "logit_diff", "logit_diff", True

    def resampled(self, res: Results, idx: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        return res["logit_diff"][idx].mean(-1)

    def value(self, res: Results) -> float:
        return float(res["logit_diff"].mean())

    def target_weights(self, plan: Planned, clean: Scored | None) -> Float[Tensor, " n_targets"]:
        """``+1/n`` for each sample's gold candidate, ``-1/n`` for the intact model's best other one, 0 else."""
        if clean is None:
            raise ValueError("the logit difference's weights depend on the intact model's best other candidates")
        n = len(plan.samples)
        gold = clean.gold.tolist()
        others = clean.scores.scatter(1, clean.gold[:, None], float("-inf")).argmax(-1).tolist()
        w = torch.zeros(len(plan.targets), dtype=torch.float32)
        for i, t in enumerate(plan.targets):
            if t.cand == gold[t.sample]:
                w[i] = 1.0 / n
            elif t.cand == others[t.sample] and len(plan.samples[t.sample].candidates) > 1:
                w[i] = -1.0 / n
        return w


class Accuracy(Metric):
    name, estimand, needs_clean = "accuracy", "logit_diff", True

    def resampled(self, res: Results, idx: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        return res["correct"][idx].float().mean(-1)

    def value(self, res: Results) -> float:
        return float(res["correct"].float().mean())


class LogProb(Metric):
    name, estimand, needs_clean = "logprob", "logprob", False

    def resampled(self, res: Results, idx: Int[Tensor, "b n"]) -> Float[Tensor, " b"]:
        return res["gold_score"][idx].sum(-1) / res["n_gold"][idx].sum(-1).clamp_min(1)

    def value(self, res: Results) -> float:
        return float(res["gold_score"].sum() / res["n_gold"].sum().clamp_min(1))

    def target_weights(self, plan: Planned, clean: Scored | None = None) -> Float[Tensor, " n_targets"]:
        """``1/N`` for every gold target (``N`` the gold continuations' tokens in all), 0 else."""
        gold = [t for t in plan.targets if t.cand == plan.samples[t.sample].gold]
        n = max(1, sum(len(t.tokens) for t in gold))
        return torch.tensor([1.0 / n if t.cand == plan.samples[t.sample].gold else 0.0 for t in plan.targets],
                            dtype=torch.float32)


LOGIT_DIFF, ACCURACY, LOGPROB = LogitDiff(), Accuracy(), LogProb()
METRICS: dict[str, Metric] = {m.name: m for m in (LOGIT_DIFF, ACCURACY, LOGPROB)}


def get_metric(metric: str | Metric) -> Metric:
    """The metric named ``metric`` (or ``metric`` itself); :class:`OptionError` naming the choices otherwise."""
    if isinstance(metric, Metric):
        return metric
    if metric not in METRICS:
        raise OptionError(f"unknown metric {metric!r}; choose one of {', '.join(METRICS)}")
    return METRICS[metric]
