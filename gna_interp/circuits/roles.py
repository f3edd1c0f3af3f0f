"""G&A role scores: how much each head's pattern looks like a Gather or an Aggregate head.

Every pattern row is read as a distribution over its keys, ``p = |A[q, :]| / Σ |A[q, :]|``
(:func:`gna_interp.mixing.sharpness.row_distribution`): softmax rows of attention heads as they
are, SSM implicit attention (``form="exact"`` by default, the matrix that reproduces the scan) as the
share of absolute weight. On each sample, with its segments (dictionary lines / options) ``S_j``,
their summary tokens ``s_j`` (last token of the line) and the *decision position* ``f``:

- ``gather`` -- mean over segments of the mass from ``s_j`` onto the rest of its own segment,
  ``Σ_{k ∈ S_j, k < s_j} p[s_j, k]``; ``gather_prev`` -- the part of it on the token right before
  ``s_j`` (what a previous-token head puts there anyway); ``line_tokens`` -- mean tokens per segment,
  its summary included (2 for a line that is just ``key``, ``value``);
- ``aggregate`` -- mass from ``f`` onto the gold segment ``Σ_{k ∈ S_gold} p[f, k]``;
  ``to_summaries`` -- mass from ``f`` onto all summary tokens; ``to_items`` -- onto all segments;
  ``gold_share`` -- ``aggregate / to_items`` (chance: ``1 / n`` for ``n`` segments);
  ``selectivity`` -- ``(gold_share − 1/n) / (1 − 1/n)``: 0 at chance, 1 when all of it is on the gold one;
- ``sharpness`` -- ``1 − H(q) / log n`` of the per-segment distribution ``q_j ∝`` mass from ``f`` on
  ``S_j`` (1: all on one segment, 0: uniform over segments).

The decision position is where the candidates part: the prompt is fed together with the tokens that
all candidates share (``" 7"`` is ``" "`` + ``"7"`` for digit-splitting tokenizers, so the digit is
predicted at the ``" "`` token, not at ``" is"``), and ``f`` is the last of them -- the very position
whose logits the task is scored on. Without a shared prefix, ``f`` is the prompt's last token.

Scores are means over samples. :class:`RoleRule` turns them into a label (documented there).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import pandas as pd
import torch

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.mixing import PatternOptions, patterns
from gna_interp.mixing.sharpness import row_distribution, sharpness
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.tasks.sample import Sample
from gna_interp.tasks.scoring import plan_scoring

ROLE_COLUMNS = ["name", "gather", "gather_prev", "line_tokens", "aggregate", "to_summaries", "to_items", "gold_share",
                "selectivity", "sharpness", "role", "role_reason"]
ROLES: tuple[str, ...] = ("gather", "aggregate", "other")

__all__ = ["ROLES", "ROLE_COLUMNS", "RoleRule", "decision_inputs", "role_scores"]


@dataclass(frozen=True)
class RoleRule:
    """Labelling rule (the thresholds are attributes, so it can be changed and recorded).

    - **aggregate** when ``aggregate >= aggregate_min`` (the decision position puts at least that
      much mass on the gold segment) and ``selectivity >= selectivity_min`` (what it puts on the
      segments goes to the gold one well above chance: it *selects*, it does not spread);
    - else **gather** when ``gather >= gather_min`` (summary tokens read their own segment) and
      ``gather - gather_prev >= spread_min`` (beyond the adjacent token: not a previous-token head);
      when the lines are two tokens (``line_tokens <= 2``, e.g. the zoo tokenizer's ``key``, ``value``),
      the adjacent token is the whole rest of the line, reading it is all the gathering there is, and
      the spread test is skipped (scores without ``line_tokens`` count as longer lines);
    - else **other**.
    """

    aggregate_min: float = 0.2
    selectivity_min: float = 0.3
    gather_min: float = 0.3
    spread_min: float = 0.15

    def label(self, scores: dict[str, float] | pd.Series) -> str:
        """The role of one head from its scores."""
        if scores["aggregate"] >= self.aggregate_min and scores["selectivity"] >= self.selectivity_min:
            return "aggregate"
        short = float(scores.get("line_tokens", math.inf)) <= 2
        spread = scores["gather"] - scores["gather_prev"] >= self.spread_min
        if scores["gather"] >= self.gather_min and (short or spread):
            return "gather"
        return "other"

    def explain(self, scores: dict[str, float] | pd.Series) -> str:
        """Why :meth:`label` gives its role: the numbers that decide it against the rule's thresholds."""
        role = self.label(scores)
        agg = f"aggregate {scores['aggregate']:.2f} (min {self.aggregate_min}), selectivity {scores['selectivity']:.2f} " \
              f"(min {self.selectivity_min})"
        gat = f"gather {scores['gather']:.2f} (min {self.gather_min}), beyond the previous token " \
              f"{scores['gather'] - scores['gather_prev']:.2f} (min {self.spread_min})"
        if role == "aggregate":
            return f"final token selects the gold segment: {agg}"
        if role == "gather":
            return f"summary tokens read their own segment: {gat}"
        if scores["aggregate"] >= self.aggregate_min:
            return f"weak pattern: reads the segments from the final token but does not select the gold one ({agg})"
        if scores["gather"] >= self.gather_min:
            return f"weak pattern: summary tokens read only the previous token ({gat})"
        return f"weak pattern: neither role ({agg}; {gat})"

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def _sample_scores(p: torch.Tensor, items: Sequence[Any], gold: int, final: int) -> torch.Tensor:
    """Scores of every head on one sample; ``p`` is ``[n_heads, q, k]`` row-normalised."""
    g, prev = [], []
    for sp in items:
        s = sp.summary
        g.append(p[:, s, sp.start:s].sum(-1))
        prev.append(p[:, s, s - 1] if s - 1 >= sp.start else torch.zeros(p.shape[0]))
    row = p[:, final]
    per_item = torch.stack([row[:, sp.start:sp.stop].sum(-1) for sp in items], dim=-1)  # [n, items]
    to_items = per_item.sum(-1)
    to_gold = per_item[:, gold]
    to_summ = row[:, [sp.summary for sp in items]].sum(-1)
    share = torch.where(to_items > 0, to_gold / to_items.clamp_min(1e-12), torch.zeros_like(to_items))
    chance = 1.0 / len(items)
    select = (share - chance) / (1 - chance) if len(items) > 1 else torch.zeros_like(share)
    if len(items) > 1:
        sharp = 1 - sharpness(per_item[:, None, :], causal=False).normalized_entropy[:, 0]
        sharp = torch.nan_to_num(sharp, nan=0.0)
    else:
        sharp = torch.ones(p.shape[0])
    width = torch.full_like(to_gold, sum(len(sp) for sp in items) / len(items))
    return torch.stack([torch.stack(g, -1).mean(-1), torch.stack(prev, -1).mean(-1), width, to_gold, to_summ,
                        to_items, share, select, sharp], dim=-1)


def decision_inputs(model: Model, samples: Sequence[Sample]) -> list[list[int]]:
    """Per sample, the prompt's token ids followed by the tokens all its candidates share (their last
    one is the decision position)."""
    plan = plan_scoring(model, samples)
    cands: dict[int, list[tuple[int, ...]]] = {}
    for t in plan.targets:
        cands.setdefault(t.sample, []).append(t.tokens)
    out = []
    for i, prompt in enumerate(plan.prompt_ids):
        toks = cands[i]
        shared = 0
        while shared < min(len(t) for t in toks) - 1 and len({t[shared] for t in toks}) == 1:
            shared += 1
        out.append(list(prompt) + list(toks[0][:shared]))
    return out


def role_scores(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None = None,
                n_samples: int | None = 8, batch_size: int = 8, form: str = "exact",
                rule: RoleRule | None = None) -> pd.DataFrame:
    """G&A scores and role of each head (default: every head of kinds that are not grouped by default --
    attention and Mamba-2 heads; Mamba-1 channels only when listed, else as 64-channel groups) over
    the first ``n_samples`` samples of ``task`` (all when ``None``); SSM heads read in ``form``.

    Returns one row per head with columns ``layer, head, kind`` + :data:`ROLE_COLUMNS`.
    """
    if not isinstance(task, Task):
        raise InputError(f"role_scores needs a Task with segment spans (e.g. KVRetrieval), got {type(task).__name__}")
    rule = rule or RoleRule()
    if heads is None:
        chosen = [h for h in model.heads() if not h.adapter.default_groups] or model.heads(channel_group=64)
    else:
        chosen = list(dict.fromkeys(model.check_heads(heads)))
    if not chosen:
        raise InputError("no heads to score")
    if n_samples is not None and n_samples < 1:
        raise InputError(f"n_samples must be >= 1 (or None for all), got {n_samples}")
    samples = list(task.samples[: n_samples or len(task)])
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    segs = [s.segments(model.tokenizer) for s in samples]
    bad = [i for i, sg in enumerate(segs) if not sg.items]
    if bad:
        raise InputError(f"samples {bad[:5]} have no segments (lines / options) to score gather and aggregate on")
    total = torch.zeros(len(chosen), len(ROLE_COLUMNS) - 3, dtype=torch.float64)
    options = PatternOptions(form=form)  # type: ignore[arg-type]
    fed = decision_inputs(model, samples)
    for b0 in range(0, len(samples), batch_size):
        part = samples[b0:b0 + batch_size]
        ps = patterns(model, model.pad_ids(fed[b0:b0 + batch_size]), heads=chosen, options=options)
        for j, s in enumerate(part):
            sg = segs[b0 + j]
            pat = ps.sample(j, chosen)
            if pat.shape[-1] < sg.n_tokens:
                raise InputError(f"sample {b0 + j}: the model's tokenization ({pat.shape[-1]} tokens) differs from "
                                 f"the segment annotation ({sg.n_tokens}); cannot place the segments")
            p = row_distribution(pat.float())
            total += _sample_scores(p.cpu(), sg.items, s.gold, pat.shape[-1] - 1).double()
    mean = total / len(samples)
    cols = ROLE_COLUMNS[1:-2]
    rows = []
    for h, vals in zip(chosen, mean.tolist()):
        sc = dict(zip(cols, vals))
        nan = any(math.isnan(v) for v in vals)
        rows.append({"layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, **sc,
                     "role": "other" if nan else rule.label(sc),
                     "role_reason": "no segment structure to score (empty pattern rows)" if nan else rule.explain(sc)})
    return pd.DataFrame(rows, columns=["layer", "head", "kind"] + ROLE_COLUMNS)
