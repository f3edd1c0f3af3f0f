"""A scoring plan: the rows to feed and the tokens to read so that every candidate of every sample is scored.

A candidate's score is the sum of the log-probabilities of its tokens given the prompt (the official
KV-retrieval scorer). Candidate tokens are those that ``prompt + candidate`` adds to the prompt's
tokens, so a leading space is tokenized in context (``" A"`` for BPE, ``"▁A"`` for SentencePiece).

To score candidate ``c = (t1..tL)`` the model must be fed ``prompt + t1..t(L-1)``. These *rows* are
deduplicated per sample: a row that is a prefix of another is dropped, its log-probs are read from
the longer one. Single-token candidates therefore share one row (first-token scoring); multi-token
ones are teacher-forced behind the shared prompt (:mod:`gna_interp.engine.layout` lays the rows out,
:mod:`gna_interp.engine.forward` runs them).

Methods:

- ``auto`` (default): exact, as above;
- ``first_token``: score only each candidate's first token (one row per sample; the candidates'
  first tokens must differ), the usual letter-scoring shortcut;
- ``per_candidate``: the official protocol, one forward of ``prompt + candidate`` per candidate
  (for timing and reference; same scores as ``auto``).

A plan reads samples through :class:`Scorable` (what :class:`~gna_interp.tasks.sample.Sample` provides), so the engine
needs nothing of the task layer; :class:`CandidateScores` holds what a run of the plan scored.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping, Protocol, Sequence

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.engine.metrics import ACCURACY, LOGIT_DIFF, raw
from gna_interp.errors import InputError
from gna_interp.models.model import Model

__all__ = ["METHODS", "CandidateScores", "Method", "Row", "Scorable", "ScoringPlan", "Target", "for_model", "plan_of",
           "plan_scoring"]


class Scorable(Protocol):
    """What a plan needs of one sample: its ``prompt``, its ``candidates``, the ``gold`` index, the ``answer`` text and
    the ``meta`` facts copied into per-sample tables (:class:`~gna_interp.tasks.sample.Sample` has them all)."""

    @property
    def prompt(self) -> str: ...

    @property
    def candidates(self) -> tuple[str, ...]: ...

    @property
    def gold(self) -> int: ...

    @property
    def answer(self) -> str: ...

    @property
    def meta(self) -> Mapping[str, Any]: ...


Method = Literal["auto", "first_token", "per_candidate"]
METHODS: tuple[str, ...] = ("auto", "first_token", "per_candidate")


@dataclass(frozen=True)
class Row:
    """One sequence to feed: a sample's prompt tokens plus ``fed`` continuation tokens."""

    sample: int
    ids: tuple[int, ...]
    prompt_len: int

    @property
    def n_fed(self) -> int:
        return len(self.ids) - self.prompt_len


@dataclass(frozen=True)
class Target:
    """Where candidate ``cand`` of ``sample`` is read: its ``tokens``, predicted along row ``row``."""

    sample: int
    cand: int
    row: int
    tokens: tuple[int, ...]


@dataclass(frozen=True)
class ScoringPlan:
    """Tokenized rows and targets for a list of samples under one model's tokenizer (reusable), and how that model
    (named ``model``) lays them out (:func:`for_model`): ``pad_id`` pads a row, ``packs`` says whether
    :func:`layout_chunks` packs each sample's rows into one tree-masked sequence by default, ``device`` is where
    the model reads its tokens. :func:`layout_chunks` needs nothing else; :meth:`check_model` refuses a model the
    layout would be wrong for. ``prompt_ids`` and ``candidate_ids`` are each sample's prompt tokens and its
    candidates' tokens in full (a ``first_token`` plan reads only the first; a plan in token space, the lm-eval
    harness's, gives none), which :func:`for_model` checks against the model's vocabulary."""

    samples: tuple[Scorable, ...]
    rows: tuple[Row, ...]
    targets: tuple[Target, ...]
    method: str
    prompt_ids: tuple[tuple[int, ...], ...]
    candidate_ids: tuple[tuple[tuple[int, ...], ...], ...] = ()
    pad_id: int = 0
    packs: bool = False
    model: str = ""
    device: str = "cpu"

    @property
    def n_candidates(self) -> list[int]:
        return [len(s.candidates) for s in self.samples]

    @property
    def n_row_tokens(self) -> int:
        """Tokens fed when every row is run in full (prompt repeated per row)."""
        return sum(len(r.ids) for r in self.rows)

    @property
    def n_shared_tokens(self) -> int:
        """Tokens fed when the prompts are run once and the rows continue from their cache."""
        return sum(map(len, self.prompt_ids)) + sum(r.n_fed for r in self.rows)

    @functools.cached_property
    def longest_row(self) -> int:
        """Tokens in the plan's longest row (prompt + fed tokens): what must fit the context, and what packing is
        judged on."""
        return max(len(r.ids) for r in self.rows)

    def check_model(self, model: Model) -> None:
        """Refuse ``model`` when this plan's layout (:func:`for_model`) would be wrong for it: another pad token,
        packing that ``model`` does not honour (a plan that does not pack is right for every model), or tokens
        on another device."""
        if (self.pad_id != model.pad_id or self.device != str(model.device)
                or (self.packs and self.longest_row > model.longest_packed_row)):
            raise InputError(f"this scoring plan was laid out for {self.model or 'another model'} on {self.device}, "
                             f"whose padding, packing or device {model.name} on {model.device} does not share; lay it "
                             f"out for this model: for_model(model, plan) (or plan_scoring(model, samples) again)")

    def describe(self) -> str:
        n_c = sum(self.n_candidates)
        return f"{len(self.samples)} samples, {n_c} candidates -> {len(self.rows)} rows ({self.method})"

def _candidate_tokens(tokenizer: Any, prompt_ids: Sequence[list[int]], samples: Sequence[Scorable]
                      ) -> list[list[tuple[int, ...]]]:
    """Per sample, each candidate's tokens after the prompt's (``prompt + candidate`` tokenized jointly, every sample
    in one call of the tokenizer); :class:`InputError` where a candidate merges with the prompt or adds nothing."""
    joint = tokenizer([s.prompt + c for s in samples for c in s.candidates])["input_ids"]
    out: list[list[tuple[int, ...]]] = []
    k = 0
    for index, (s, p_ids) in enumerate(zip(samples, prompt_ids)):
        n = len(p_ids)
        tails = []
        for c, ids in zip(s.candidates, joint[k:k + len(s.candidates)]):
            ids = list(ids)
            if ids[:n] != p_ids:
                raise InputError(
                    f"sample {index}: candidate {c!r} merges with the end of the prompt into one token "
                    f"(prompt ends {s.prompt[-20:]!r}), so it cannot be scored as a continuation; end the prompt "
                    f"on a token boundary (e.g. move a shared leading space from the candidates into the prompt)"
                )
            tail = tuple(ids[n:])
            if not tail:
                raise InputError(f"sample {index}: candidate {c!r} tokenizes to nothing after the prompt; "
                                 f"give every candidate some text the tokenizer keeps")
            tails.append(tail)
        out.append(tails)
        k += len(s.candidates)
    return out


PLANS = "plan.plans"  # Model.facts key: the latest plans made for the model, by the text their tokens come from
KEEP_PLANS = 8


def plan_scoring(model: Model, samples: Sequence[Scorable], method: Method = "auto") -> ScoringPlan:
    """Tokenize ``samples`` and decide the rows to feed; raises :class:`InputError` for bad input. The latest
    :data:`KEEP_PLANS` plans of a model are kept by their samples' prompts and candidates: a plan of the same text
    again (the stages of one analysis, a repeated call) reuses their tokens, with the samples given."""
    if method not in METHODS:
        raise InputError(f"unknown scoring method {method!r}; choose one of {METHODS}")
    samples = tuple(samples)
    if not samples:
        raise InputError("no samples to score")
    key = (method, tuple((s.prompt, tuple(s.candidates)) for s in samples))
    held = model.facts.get(PLANS)  # (tokenizer, {key: plan}): a tokenizer set anew starts afresh
    if held is None or held[0] is not model.tokenizer:
        held = model.facts[PLANS] = (model.tokenizer, {})
    kept = held[1]
    plan = kept.pop(key, None)
    if plan is None or plan.device != str(model.device):
        plan = _plan_scoring(model, samples, method)
    kept[key] = plan  # the latest last
    while len(kept) > KEEP_PLANS:
        kept.pop(next(iter(kept)))
    return replace(plan, samples=samples)


def _plan_scoring(model: Model, samples: tuple[Scorable, ...], method: Method) -> ScoringPlan:
    tok = model.tokenizer
    prompt_ids = [list(ids) for ids in tok([s.prompt for s in samples])["input_ids"]]
    rows: list[Row] = []
    targets: list[Target] = []
    candidate_ids: list[tuple[tuple[int, ...], ...]] = []
    for i, p_ids in enumerate(prompt_ids):
        if not p_ids:
            raise InputError(f"sample {i}: the prompt tokenizes to nothing; pass non-empty text")
    for i, (s, p_ids, cand_toks) in enumerate(zip(samples, prompt_ids, _candidate_tokens(tok, prompt_ids, samples))):
        candidate_ids.append(tuple(cand_toks))
        if method == "first_token":
            firsts = [t[0] for t in cand_toks]
            if len(set(firsts)) != len(firsts):
                shared = sorted({s.candidates[j] for j, f in enumerate(firsts) if firsts.count(f) > 1})
                raise InputError(f"sample {i}: candidates {shared} share their first token, so first-token "
                                 f"scoring cannot tell them apart; use method='auto'")
            cand_toks = [t[:1] for t in cand_toks]
        longest = max(len(p_ids) + len(t) - (method != "per_candidate") for t in cand_toks)
        if model.n_ctx and longest > model.n_ctx:
            raise InputError(
                f"sample {i}: prompt plus candidate is {longest} tokens but {model.name} has a context of "
                f"{model.n_ctx} tokens; shorten the prompt (fewer dictionary pairs) or pick a longer-context model"
            )
        if method == "per_candidate":
            for j, t in enumerate(cand_toks):
                targets.append(Target(i, j, len(rows), t))
                rows.append(Row(i, tuple(p_ids) + t, len(p_ids)))
            continue
        fed = [t[:-1] for t in cand_toks]
        keep = sorted({f for f in fed if not any(len(g) > len(f) and g[: len(f)] == f for g in fed)})
        base = len(rows)
        rows.extend(Row(i, tuple(p_ids) + f, len(p_ids)) for f in keep)
        for j, (f, t) in enumerate(zip(fed, cand_toks)):
            r = next(k for k, g in enumerate(keep) if g[: len(f)] == f)
            targets.append(Target(i, j, base + r, t))
    return for_model(model, ScoringPlan(samples, tuple(rows), tuple(targets), method,
                                        tuple(tuple(p) for p in prompt_ids), tuple(candidate_ids)))


def for_model(model: Model, plan: ScoringPlan) -> ScoringPlan:
    """``plan`` with how ``model`` lays it out: its pad token, and whether it packs (some sample needs several rows
    and every mixer of ``model`` honours a tree-shaped attention mask for rows this long: attention-only models;
    with a sliding window, rows shorter than it, :meth:`~gna_interp.models.model.Model.packs_rows_up_to`). Every check
    of the plan against ``model`` is made here: the candidates and the prompts for text outside the vocabulary, and
    the rows to fit the context and the vocabulary."""
    for i, (s, cand_ids) in enumerate(zip(plan.samples, plan.candidate_ids)):
        for c, ids in zip(s.candidates, cand_ids):
            model.check_known(ids, c, what=f"sample {i}: candidate {c!r}")
    for s, ids in zip(plan.samples, plan.prompt_ids):
        if s.prompt:  # a plan in token space (the lm-eval harness's) has no text to check
            model.check_known(ids, s.prompt)
    longest = plan.longest_row
    model.check_length(longest)  # every row fits the context, packed or not (a packed sequence may not)
    model.check_ids(torch.tensor([[min(min(r.ids) for r in plan.rows), max(max(r.ids) for r in plan.rows)]]))
    packs = plan.method != "per_candidate" and len(plan.rows) > len(plan.samples) and model.packs_rows_up_to(longest)
    return replace(plan, pad_id=model.pad_id, packs=packs, model=model.name, device=str(model.device))


@dataclass
class CandidateScores:
    """Scores of every candidate of every sample.

    ``scores[i, j]`` is the summed log-prob of candidate ``j`` of sample ``i`` (``-inf`` beyond the
    sample's candidates); ``n_tokens[i, j]`` its token count (0 for padding entries).
    """

    samples: tuple[Scorable, ...]
    scores: Float[Tensor, "sample cand"]
    n_tokens: Int[Tensor, "sample cand"]
    method: str
    n_forwards: int

    @property
    def gold(self) -> Int[Tensor, "sample"]:
        return torch.tensor([s.gold for s in self.samples])

    @property
    def pred(self) -> Int[Tensor, "sample"]:
        return self.scores.argmax(-1)

    @property
    def correct(self) -> Tensor:
        return self.pred == self.gold

    @property
    def gold_score(self) -> Float[Tensor, "sample"]:
        return self.scores.gather(1, self.gold[:, None])[:, 0]

    @property
    def best_other(self) -> Float[Tensor, "sample"]:
        """Best score among the non-gold candidates (``-inf`` when there is a single candidate)."""
        others = self.scores.scatter(1, self.gold[:, None], -math.inf)
        return others.max(-1).values

    @property
    def logit_diff(self) -> Float[Tensor, "sample"]:
        """Gold minus best other score; for single-token candidates exactly the logit difference."""
        return self.gold_score - self.best_other

    @property
    def gold_prob(self) -> Float[Tensor, "sample"]:
        """Probability the model gives the gold continuation (product over its tokens)."""
        return self.gold_score.exp()

    @property
    def metrics(self) -> dict[str, float]:
        """``accuracy``, mean ``logit_diff``, mean ``gold_prob``, ``chance``, ``n_samples``."""
        n_c = (self.n_tokens > 0).sum(-1).float()
        from_scores = raw(self)
        return {"accuracy": ACCURACY.value(from_scores),
                "logit_diff": LOGIT_DIFF.value(from_scores),
                "gold_prob": self.gold_prob.mean().item(),
                "chance": (1 / n_c).mean().item(),
                "n_samples": len(self.samples)}

    def to_frame(self) -> pd.DataFrame:
        """Per-sample table: ``sample, gold, pred, correct, answer, predicted, gold_score, best_other,
        logit_diff, gold_prob, n_candidates`` and the sample's ``meta``."""
        pred, gold = self.pred.tolist(), self.gold.tolist()
        rows = []
        for i, s in enumerate(self.samples):
            rows.append({"sample": i, "gold": gold[i], "pred": pred[i], "correct": pred[i] == gold[i],
                         "answer": s.answer, "predicted": s.candidates[pred[i]],
                         "gold_score": self.gold_score[i].item(), "best_other": self.best_other[i].item(),
                         "logit_diff": self.logit_diff[i].item(), "gold_prob": self.gold_prob[i].item(),
                         "n_candidates": len(s.candidates), **dict(s.meta)})
        return pd.DataFrame(rows)


def plan_of(model: Model, task: Any, method: Method = "auto", who: str = "this") -> ScoringPlan:
    """``task`` itself when it is a :class:`ScoringPlan` (checked against ``model``: :meth:`ScoringPlan.check_model`),
    else the plan of its ``samples`` (a :class:`~gna_interp.tasks.base.Task`: :func:`plan_scoring` with ``method``);
    for anything else an :class:`~gna_interp.errors.InputError` saying that ``who`` needs a task or a plan."""
    if not isinstance(task, ScoringPlan):
        samples = getattr(task, "samples", None)
        if samples is None or not hasattr(task, "name"):
            raise InputError(f"{who} needs a Task (e.g. KVRetrieval(...)) or a ScoringPlan, got {type(task).__name__}")
        task = plan_scoring(model, samples, method)
    task.check_model(model)
    return task
