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

**Summary offsets.** An SSM mixer's causal convolution carries a line 1-3 tokens past its end, so an SSM
head (or an attention head behind SSM layers) may read the lines there rather than at their last tokens.
Each head is scored with the lines moved ``d = 0..reach(head)`` tokens later (:func:`offset_scores`,
:mod:`gna_interp.circuits.scan.offsets`; ``reach`` is 0 in an attention-only model) and read at the offset
its role is clearest at (:func:`choose_offset`); the ``offset`` column records it.

Scores are means over samples. :class:`RoleRule` turns them into a label (documented there).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.circuits.scan.offsets import intact_at, offsets_of, pick_offset
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.mixing import PatternOptions, patterns
from gna_interp.mixing.sharpness import row_distribution, sharpness
from gna_interp.models.model import Model, check_model
from gna_interp.options import Options, options
from gna_interp.tasks.base import Task
from gna_interp.tasks.sample import Sample
from gna_interp.engine.plan import plan_scoring
from gna_interp.tasks.segments import Segments, Span, segments_of

SCORE_COLUMNS = ["gather", "gather_prev", "line_tokens", "aggregate", "to_summaries", "to_items", "gold_share",
                 "selectivity", "sharpness"]
SUMMARY_COLUMNS = ["summary_aggregate", "summary_selectivity"]
ROLE_COLUMNS = ["name", *SCORE_COLUMNS, "offset", "role", "role_reason"]
ROLES: tuple[str, ...] = ("gather", "aggregate", "other")

__all__ = ["ROLES", "ROLE_COLUMNS", "SCORE_COLUMNS", "SUMMARY_COLUMNS", "RoleOptions", "RoleRule", "ScoreOptions", "choose_offset", "decision_inputs", "item_masses",
           "offset_scores", "role_scores"]


@dataclass(frozen=True)
class RoleRule:
    """Labelling rule (the thresholds are attributes, so it can be changed and recorded).

    - **aggregate** when ``aggregate >= aggregate_min`` (the decision position puts at least that
      much mass on the gold segment) and ``selectivity >= selectivity_min`` (what it puts on the
      segments goes to the gold one well above chance: it *selects*, it does not spread); for a
      *smooth* head -- one whose pattern is implicit attention (SSM heads, ``smooth=True``), whose rows
      are not softmax distributions -- ``smooth_selectivity_min`` instead: SSMs implement G&A with a
      smoother aggregate (the paper's point), e.g. the zoo Mamba-2's layer-1 aggregate heads put 0.26 of
      their decision row on the gold one of 10 lines, 3x chance, selectivity 0.22; the other heads of that
      model stay below 0.05;
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
    smooth_selectivity_min: float = 0.15

    def _selects(self, scores: dict[str, float] | pd.Series, smooth: bool) -> tuple[bool, float]:
        least = self.smooth_selectivity_min if smooth else self.selectivity_min
        return scores["aggregate"] >= self.aggregate_min and scores["selectivity"] >= least, least

    def label(self, scores: dict[str, float] | pd.Series, smooth: bool = False) -> str:
        """The role of one head from its scores (``smooth``: an SSM head, read as implicit attention)."""
        if self._selects(scores, smooth)[0]:
            return "aggregate"
        short = float(scores.get("line_tokens", math.inf)) <= 2
        spread = scores["gather"] - scores["gather_prev"] >= self.spread_min
        if scores["gather"] >= self.gather_min and (short or spread):
            return "gather"
        return "other"

    def explain(self, scores: dict[str, float] | pd.Series, smooth: bool = False) -> str:
        """Why :meth:`label` gives its role: the numbers that decide it against the rule's thresholds."""
        role = self.label(scores, smooth)
        least = self._selects(scores, smooth)[1]
        agg = f"aggregate {scores['aggregate']:.2f} (min {self.aggregate_min}), selectivity {scores['selectivity']:.2f} " \
              f"(min {least}{' for an SSM head' if smooth else ''})"
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


def item_masses(row: Float[Tensor, "heads keys"], items: Sequence[Span]) -> Float[Tensor, "heads items"]:
    """Mass of each head's pattern row ``row`` on each item (line / option) ``[start, stop)``."""
    return torch.stack([row[:, sp.start:sp.stop].sum(-1) for sp in items], dim=-1)


def _sample_scores(p: torch.Tensor, items: Sequence[Any], gold: int, final: int) -> torch.Tensor:
    """Scores of every head on one sample; ``p`` is ``[n_heads, q, k]`` row-normalised."""
    g, prev = [], []
    for sp in items:
        s = sp.summary
        g.append(p[:, s, sp.start:s].sum(-1))
        prev.append(p[:, s, s - 1] if s - 1 >= sp.start else torch.zeros(p.shape[0]))
    per_item = item_masses(p[:, final], items)  # [n, items]
    row = p[:, final]
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


def _summary_scores(p: torch.Tensor, items: Sequence[Any], gold: int, final: int) -> torch.Tensor:
    """``[n_heads, 2]``: mass from ``final`` on the gold item's summary token, and its selectivity among
    the summary tokens; ``p`` is ``[n_heads, q, k]`` row-normalised."""
    per = p[:, final, [sp.summary for sp in items]]
    gold_m = per[:, gold]
    share = torch.where(per.sum(-1) > 0, gold_m / per.sum(-1).clamp_min(1e-12), torch.zeros_like(gold_m))
    n = len(items)
    select = (share - 1 / n) / (1 - 1 / n) if n > 1 else torch.zeros_like(share)
    return torch.stack([gold_m, select], -1)


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


def _check_inputs(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None, n_samples: int | None,
                  batch_size: int) -> tuple[list[HeadRef], list[Sample], list[Segments]]:
    """The heads (default: every head of kinds not grouped by default, else 64-channel groups), the samples and
    their segments, with the input checks :func:`role_scores` and :func:`offset_scores` share."""
    if not isinstance(task, Task):
        raise InputError(f"role_scores needs a Task with segment spans (e.g. KVRetrieval), got {type(task).__name__}")
    if heads is None:
        chosen = [h for h in model.heads() if not h.adapter.default_groups] or model.heads(channel_group=64)
    else:
        chosen = list(dict.fromkeys(model.check_heads(heads)))
    if not chosen:
        raise InputError("no heads to score")
    if n_samples is not None and (isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1):
        raise InputError(f"n_samples must be >= 1 (or None for all), got {n_samples}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    samples = list(task.samples[: n_samples or len(task)])
    segs = segments_of(model.tokenizer, samples)
    bad = [i for i, sg in enumerate(segs) if not sg.items]
    if bad:
        raise InputError(f"samples {bad[:5]} have no segments (lines / options) to score gather and aggregate on")
    return chosen, samples, segs


@options
class ScoreOptions(Options):
    """How :func:`offset_scores` reads the heads.

    Attributes:
        n_samples: the first samples of the task scored (None: all).
        batch_size: prompts a forward.
        form: the SSM implicit-attention form (:class:`~gna_interp.mixing.PatternOptions`).
    """

    n_samples: int | None = 8
    batch_size: int = 8
    form: str = "exact"


@options
class RoleOptions(ScoreOptions):
    """How :func:`role_scores` reads and labels the heads: :class:`ScoreOptions` plus the role ``rule`` (None:
    ``RoleRule()``) and the summary ``offset`` (``"auto"`` or an integer for every head)."""

    rule: "RoleRule | None" = None
    offset: int | str = "auto"


def offset_scores(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None = None,
                  offsets: Sequence[int] | None = None, config: ScoreOptions | None = None,
                  **overrides: Any) -> pd.DataFrame:
    """The G&A scores of each head with the lines read at each summary offset (default: ``0..reach(head)``,
    :func:`~gna_interp.circuits.scan.offsets.reach`; given ``offsets``: those, for every head), means over the
    first ``n_samples`` samples of ``task``. An offset that pushes a line past the prompt's end on some
    sample is not scored on that sample. ``config`` (:class:`ScoreOptions`) or keyword ``overrides`` of its
    fields: ``n_samples``, ``batch_size``, ``form``.

    Columns: ``layer, head, kind, name, offset``, :data:`SCORE_COLUMNS` (the module's formulas on the shifted
    lines), ``summary_aggregate`` (mass from the decision position on the gold line's summary token alone),
    ``summary_selectivity`` (``(share - 1/n) / (1 - 1/n)``, ``share`` the gold summary's part of the mass on
    all ``n`` summary tokens) and ``n_scored`` (samples scored at that offset).
    """
    cfg = ScoreOptions.build(config, **overrides)
    n_samples, batch_size, form = cfg.n_samples, cfg.batch_size, cfg.form
    chosen, samples, segs = _check_inputs(model, task, heads, n_samples, batch_size)
    if offsets is not None:
        offsets = list(offsets)
        for d in offsets:
            if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                raise InputError(f"offsets must be integers >= 0, got {offsets}")
    mixer_offsets: dict[tuple[int, str], list[int]] = {}  # the reach is a property of the head's mixer
    for h in chosen:
        if offsets is None and (h.layer, h.kind) not in mixer_offsets:
            mixer_offsets[(h.layer, h.kind)] = offsets_of(model, h)
    ranges = [list(offsets) if offsets is not None else mixer_offsets[(h.layer, h.kind)] for h in chosen]
    all_d = sorted({d for r in ranges for d in r})
    width = len(SCORE_COLUMNS) + len(SUMMARY_COLUMNS)
    total = torch.zeros(len(chosen), len(all_d), width, dtype=torch.float64)
    count = torch.zeros(len(all_d), dtype=torch.float64)
    pattern_options = PatternOptions(form=form)  # type: ignore[arg-type]
    fed = decision_inputs(model, samples)
    for b0 in range(0, len(samples), batch_size):
        ps = patterns(model, model.pad_ids(fed[b0:b0 + batch_size]), heads=chosen, options=pattern_options)
        for j, s in enumerate(samples[b0:b0 + batch_size]):
            sg = segs[b0 + j]
            pat = ps.sample(j, chosen)
            if pat.shape[-1] < sg.n_tokens:
                raise InputError(f"sample {b0 + j}: the model's tokenization ({pat.shape[-1]} tokens) differs from "
                                 f"the segment annotation ({sg.n_tokens}); cannot place the segments")
            p = row_distribution(pat.float()).cpu()
            final = p.shape[-1] - 1
            for di, d in enumerate(all_d):
                items = intact_at(sg, d)
                if items is None:
                    continue
                total[:, di] += torch.cat([_sample_scores(p, items, s.gold, final),
                                           _summary_scores(p, items, s.gold, final)], -1).double()
                count[di] += 1
    rows = []
    for i, h in enumerate(chosen):
        for di, d in enumerate(all_d):
            if d in ranges[i] and count[di] > 0:
                vals = (total[i, di] / count[di]).tolist()
                rows.append({"layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, "offset": d,
                             **dict(zip(SCORE_COLUMNS + SUMMARY_COLUMNS, vals)), "n_scored": int(count[di])})
    return pd.DataFrame(rows, columns=["layer", "head", "kind", "name", "offset"] + SCORE_COLUMNS + SUMMARY_COLUMNS
                        + ["n_scored"])


def choose_offset(per_offset: pd.DataFrame, rule: RoleRule, smooth: bool = False) -> int:
    """The summary offset one head is read at, from its rows of :func:`offset_scores`: among the offsets
    where ``rule`` labels it ``aggregate`` the one whose selectivity is best (the smallest within
    :data:`~gna_interp.circuits.scan.offsets.OFFSET_TOLERANCE`, :func:`~gna_interp.circuits.scan.offsets.pick_offset`);
    else among those labelling it ``gather`` the best gather score; else the literal offset 0 (or the
    smallest scored one). ``smooth``: the head is an SSM head (:meth:`RoleRule.label`)."""
    return _choose(per_offset.to_dict(orient="records"), rule, smooth)


def _choose(rows: Sequence[dict[str, Any]], rule: RoleRule, smooth: bool) -> int:
    """:func:`choose_offset` on one head's rows as dicts."""
    if len(rows) == 1:  # one offset scored (always in an attention-only model)
        return int(rows[0]["offset"])
    rows = sorted(rows, key=lambda r: r["offset"])
    labels = ["other" if any(math.isnan(r[c]) for c in SCORE_COLUMNS) else rule.label(r, smooth) for r in rows]
    for role, col in (("aggregate", "selectivity"), ("gather", "gather")):
        mine = {int(r["offset"]): r[col] for r, lab in zip(rows, labels) if lab == role}
        if mine:
            return pick_offset(mine)
    return int(rows[0]["offset"]) if rows else 0


def role_scores(model: Model, task: Task, heads: Sequence[HeadRef | str] | str | None = None,
                config: RoleOptions | None = None, **overrides: Any) -> pd.DataFrame:
    """G&A scores and role of each head (default: every head of kinds that are not grouped by default --
    attention and Mamba-2 heads; Mamba-1 channels only when listed, else as 64-channel groups) over
    the first ``n_samples`` samples of ``task`` (all when ``None``); SSM heads read in ``form``.

    Each head is read at its summary offset (``offset="auto"``: scored at ``0..reach(head)`` by
    :func:`offset_scores`, then :func:`choose_offset`; an integer: that offset for every head). In an
    attention-only model the reach is 0 and every head is read at its lines' literal summary tokens.

    ``config`` (:class:`RoleOptions`) or keyword ``overrides`` of its fields: ``n_samples``, ``batch_size``,
    ``form``, ``rule``, ``offset``.

    Returns one row per head with columns ``layer, head, kind`` + :data:`ROLE_COLUMNS`.
    """
    check_model(model)
    cfg = RoleOptions.build(config, **overrides)
    rule, offset = cfg.rule or RoleRule(), cfg.offset
    if offset != "auto" and (isinstance(offset, bool) or not isinstance(offset, int) or offset < 0):
        raise InputError(f"offset must be 'auto' or an integer >= 0, got {offset!r}")
    per = offset_scores(model, task, heads, None if offset == "auto" else [offset], n_samples=cfg.n_samples,
                        batch_size=cfg.batch_size, form=cfg.form)
    if per.empty:  # an offset is scored on every head or on none
        raise InputError(f"offset {offset} moves some line past the prompt's end on every sample; use a smaller "
                         f"offset or 'auto'")
    rows = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in per.to_dict(orient="records"):
        groups.setdefault(rec["name"], []).append(rec)
    for h in model.check_heads(list(groups)):
        name, smooth = h.name, not h.adapter.normalized_rows
        d = _choose(groups[name], rule, smooth)
        r = next(x for x in groups[name] if x["offset"] == d)
        sc = {c: float(r[c]) for c in SCORE_COLUMNS}
        nan = any(math.isnan(v) for v in sc.values())
        rows.append({"layer": int(r["layer"]), "head": int(r["head"]), "kind": r["kind"], "name": name, **sc,
                     "offset": d, "role": "other" if nan else rule.label(sc, smooth),
                     "role_reason": "no segment structure to score (empty pattern rows)" if nan else
                     rule.explain(sc, smooth) + (f"; lines read {d} token{'s' if d > 1 else ''} after their end" if d else "")})
    return pd.DataFrame(rows, columns=["layer", "head", "kind"] + ROLE_COLUMNS)
