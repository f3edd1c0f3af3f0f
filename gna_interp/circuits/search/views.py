"""What a report draws of a circuit, computed once beside the model and saved with the circuit.

:func:`card_views` runs the model once over the first few task samples and keeps the patterns of the
gather/aggregate pair and of the best-ranked heads, each sample's segments, gold and predicted answers,
plus (:func:`head_patterns`) the pattern of *every* scanned head on the first sample, compressed
(:class:`HeadPatterns`: row-normalised, lower triangle only, 8-bit codes scaled per row, within
:data:`ALL_HEADS_BUDGET` bytes) for the report's click view.
:class:`CardViews` saves and loads them (``views.pt``), so ``gna report DIR`` draws the G&A cards and
pattern views on a machine without the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd
import torch
from jaxtyping import Float, UInt8
from torch import Tensor

from gna_interp.constants import VIEWS_PT
from gna_interp.errors import InputError
from gna_interp.mixing import PatternOptions, PatternSet, patterns
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.options import Options, check_int, options
from gna_interp.results import Result
from gna_interp.store import file_in, read_tensors, write_tensors
from gna_interp.tasks.base import Task
from gna_interp.engine.forward import score_candidates
from gna_interp.tasks.segments import Segments, segments_of

N_VIEW = 6
ALL_HEADS_BUDGET = 4_000_000
"""Bytes that :class:`HeadPatterns` may take in ``views.pt`` (codes + row scales): every head of a model fits
when ``n_heads * (T (T + 1) / 2 + 4 T) <= 4e6`` for a first card sample of ``T`` tokens (SmolLM2's 270 heads up to
T = 160); beyond it the best-ranked heads are kept and the others listed as omitted. The report embeds these bytes
base64-encoded (x 4/3)."""
LEVELS = 255  # 8-bit codes: value = code / LEVELS * row scale

__all__ = ["ALL_HEADS_BUDGET", "LEVELS", "N_VIEW", "CardViews", "HeadPatterns", "card_heads", "card_views",
           "head_patterns", "row_normalised"]


def row_normalised(pattern: Float[Tensor, "n q k"], heads: Sequence[HeadRef]) -> Float[Tensor, "n q k"]:
    """Patterns as drawn: attention heads as they are (rows sum to 1); SSM heads' implicit attention as
    ``|M| / sum_k |M|`` per row, so every head is on the same 0..1 scale."""
    out = pattern.clone().float()
    for i, h in enumerate(heads):
        if not h.adapter.normalized_rows:
            a = out[i].abs()
            out[i] = a / a.sum(-1, keepdim=True).clamp_min(1e-12)
    return out


def _tril(t: int) -> tuple[Tensor, Tensor]:
    return torch.tril_indices(t, t)


@dataclass
class HeadPatterns:
    """Every head's row-normalised pattern (:func:`row_normalised`) on one sample, compressed.

    Only the lower triangle ``k <= q`` is kept (a causal mixer writes nothing above it), row by row:
    ``codes[i]`` holds head ``i``'s ``T (T + 1) / 2`` values as 8-bit codes, ``scales[i, q]`` the maximum of row
    ``q``, and a value decodes as ``code / 255 * scale``, within ``scale / 510 <= 1/510`` of the pattern read
    from the model. ``omitted`` names the heads left out to stay within ``budget`` bytes (the worst-ranked).

    Attributes:
        heads: the stored heads, best-ranked first.
        sample: the card sample the patterns are read on (its tokens are the views' ``str_tokens[sample]``).
        n_tokens: ``T``, the sample's real tokens.
        codes: ``[n_heads, T (T + 1) / 2]`` uint8.
        scales: ``[n_heads, T]`` float32, each row's maximum.
        budget: the byte budget the set was made within; ``omitted`` the heads that did not fit.
    """

    heads: list[HeadRef]
    sample: int
    n_tokens: int
    codes: UInt8[Tensor, "n tri"]
    scales: Float[Tensor, "n q"]
    budget: int = ALL_HEADS_BUDGET
    omitted: list[HeadRef] | None = None

    def __post_init__(self) -> None:
        t, n = self.n_tokens, len(self.heads)
        if self.codes.dtype != torch.uint8 or tuple(self.codes.shape) != (n, t * (t + 1) // 2):
            raise InputError(f"all-head pattern codes must be uint8 [{n}, {t * (t + 1) // 2}] for {n} heads of "
                             f"{t} tokens, got {self.codes.dtype} {list(self.codes.shape)}")
        if self.scales.dtype != torch.float32 or tuple(self.scales.shape) != (n, t):
            raise InputError(f"all-head pattern scales must be float32 [{n}, {t}], got {self.scales.dtype} "
                             f"{list(self.scales.shape)}")
        if not bool(torch.isfinite(self.scales).all()) or bool((self.scales < 0).any()):
            raise InputError("all-head pattern scales must be finite and >= 0")
        self.omitted = list(self.omitted or [])

    @classmethod
    def encode(cls, rows: Float[Tensor, "n q k"], heads: Sequence[HeadRef], sample: int = 0,
               budget: int = ALL_HEADS_BUDGET, omitted: Sequence[HeadRef] = ()) -> "HeadPatterns":
        """Compress row-normalised patterns ``rows`` (values in 0..1) of ``heads`` on one sample."""
        t = rows.shape[-1]
        q, k = _tril(t)
        rows = rows.detach().float().cpu().clamp_min(0)
        scales = rows.amax(-1)  # [n, T]
        safe = torch.where(scales > 0, scales, torch.ones_like(scales))
        codes = torch.round(rows[:, q, k] / safe[:, q] * LEVELS).clamp(0, LEVELS).to(torch.uint8)
        return cls(list(heads), sample, t, codes.contiguous(), scales.contiguous(), budget, list(omitted))

    @staticmethod
    def bytes_per_head(n_tokens: int) -> int:
        """Bytes one head takes on ``n_tokens`` tokens: its codes plus its float32 row scales."""
        return n_tokens * (n_tokens + 1) // 2 + 4 * n_tokens

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales (what the budget counts)."""
        return self.codes.numel() + 4 * self.scales.numel()

    def decode(self, heads: Sequence[HeadRef | str] | None = None) -> Float[Tensor, "n q k"]:
        """The stored patterns ``[n, T, T]`` of ``heads`` (default all), zero above the diagonal."""
        idx = [self.index(h) for h in heads] if heads is not None else list(range(len(self.heads)))
        t = self.n_tokens
        q, k = _tril(t)
        out = torch.zeros(len(idx), t, t)
        out[:, q, k] = self.codes[idx].float() / LEVELS * self.scales[idx][:, q]
        return out

    def max_error(self) -> Float[Tensor, "n q"]:
        """The quantisation bound per head and row: ``scale / 510``."""
        return self.scales / (2 * LEVELS)

    def index(self, head: HeadRef | str) -> int:
        """Position of ``head`` in :attr:`heads` (an :class:`InputError` when it is not stored)."""
        h = HeadRef.parse(head)
        if h not in self.heads:
            raise InputError(f"{h.name} has no stored pattern"
                             + (" (left out to stay within the size budget)" if h in (self.omitted or []) else ""))
        return self.heads.index(h)

    def to_state(self) -> dict[str, Any]:
        """Plain values and tensors for ``views.pt`` (see :meth:`from_state`)."""
        return {"heads": [h.name for h in self.heads], "sample": self.sample, "n_tokens": self.n_tokens,
                "codes": self.codes, "scales": self.scales, "budget": self.budget,
                "omitted": [h.name for h in self.omitted or []]}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "HeadPatterns":
        """The set :meth:`to_state` described (shapes and dtypes checked)."""
        return cls([HeadRef.parse(n) for n in d["heads"]], int(d["sample"]), int(d["n_tokens"]), d["codes"],
                   d["scales"], int(d["budget"]), [HeadRef.parse(n) for n in d["omitted"]])


def head_patterns(model: Model, prompt: str, ranked: Sequence[HeadRef], sample: int = 0,
                  budget: int = ALL_HEADS_BUDGET, form: str = "exact") -> HeadPatterns:
    """The patterns of every head of ``ranked`` (best first) on ``prompt``, compressed as :class:`HeadPatterns`:
    as many of the best-ranked heads as fit in ``budget`` bytes (all of them unless the prompt is long), read in
    one forward. SSM heads are read in ``form``."""
    t = int(model.as_batch(prompt).ids.shape[1])
    fit = max(0, budget // HeadPatterns.bytes_per_head(t))
    keep, left = list(ranked[:fit]), list(ranked[fit:])
    if not keep:
        return HeadPatterns([], sample, t, torch.zeros(0, t * (t + 1) // 2, dtype=torch.uint8),
                            torch.zeros(0, t), budget, left)
    ps = patterns(model, prompt, heads=keep, options=PatternOptions(form=form))  # type: ignore[arg-type]
    return HeadPatterns.encode(row_normalised(ps.sample(0), keep), keep, sample, budget, left)


@dataclass
class CardViews(Result):
    """Patterns and annotations of a few task samples for the report's G&A cards and pattern views.

    Attributes:
        patterns: patterns of ``pair`` and ``view`` heads on the samples (one batch).
        segments: each sample's token segments (lines / options, final position).
        gold, pred: gold and predicted candidate index per sample; ``candidates`` their texts.
        pair: the (gather, aggregate) heads drawn on the cards, or None; ``why`` says how they were chosen.
        view: the best-ranked heads shown in the pattern view.
        all_heads: every scanned head's pattern on sample ``all_heads.sample``, compressed (the report's click
            view), or None (views saved before it existed, or made with ``budget=0``).

    Saves to one ``views`` tensor bundle (:meth:`save` / :meth:`load`, a folder's ``views.pt``); its tensors make it
    no JSON document (no :meth:`to_dict`), and it has no plotly figure (:func:`gna_interp.viz.ga_card` draws a card).
    """

    FORMAT = "views"
    FILE = VIEWS_PT
    DRAWN_BY = "gna_interp.viz.ga_card(views.patterns, gather, aggregate, views.segments[i])"

    patterns: PatternSet
    segments: list[Segments]
    gold: list[int]
    pred: list[int]
    candidates: list[tuple[str, ...]]
    pair: tuple[HeadRef, HeadRef] | None
    why: str
    view: list[HeadRef]
    all_heads: HeadPatterns | None = None

    def __post_init__(self) -> None:
        a = self.all_heads
        if a is not None and (a.sample >= len(self.patterns.str_tokens)
                              or a.n_tokens != len(self.patterns.str_tokens[a.sample])):
            raise InputError(f"the all-head patterns are for sample {a.sample} with {a.n_tokens} tokens, but the views "
                             f"have {len(self.patterns.str_tokens)} samples"
                             + (f" and sample {a.sample} has {len(self.patterns.str_tokens[a.sample])} tokens"
                                if a.sample < len(self.patterns.str_tokens) else ""))

    @property
    def heads(self) -> list[HeadRef]:
        return list(self.patterns.heads)

    @property
    def metrics(self) -> dict[str, Any]:
        return {"n_samples": len(self.segments), "n_heads": len(self.heads),
                "correct": sum(g == p for g, p in zip(self.gold, self.pred))}

    def to_frame(self) -> pd.DataFrame:
        """One row per sample: ``sample, gold, pred, answer, predicted, n_tokens``."""
        return pd.DataFrame([{"sample": i, "gold": g, "pred": p, "answer": c[g], "predicted": c[p],
                              "n_tokens": s.n_tokens}
                             for i, (g, p, c, s) in enumerate(zip(self.gold, self.pred, self.candidates, self.segments))])

    def _repr_facts(self) -> list[tuple[str, Any]]:
        return [*self.metrics.items(), ("pair", " -> ".join(h.name for h in self.pair) if self.pair else "–"),
                ("why", self.why), ("view", ", ".join(h.name for h in self.view) or "–")]

    def save(self, path: str | os.PathLike, run_id: str | None = None) -> Path:
        """Write the views to ``path`` (a file, or a folder: its ``views.pt``) as a ``views`` tensor bundle
        (``run_id``: the saved result it belongs to); return the file."""
        return write_tensors(file_in(path, self.FILE), self.FORMAT, {**({"run_id": run_id} if run_id else {}),
            "patterns": self.patterns.to_state(), "segments": [s.to_dict() for s in self.segments],
            "gold": list(self.gold), "pred": list(self.pred), "candidates": [list(c) for c in self.candidates],
            "pair": [h.name for h in self.pair] if self.pair else None, "why": self.why,
            "view": [h.name for h in self.view],
            **({"all_heads": self.all_heads.to_state()} if self.all_heads is not None else {})})

    @classmethod
    def load(cls, path: str | os.PathLike, run_id: str | None = None) -> "CardViews":
        """Read views written by :meth:`save` (the file, or the folder holding its ``views.pt``; given ``run_id``,
        the bundle must carry that id)."""
        path = file_in(path, cls.FILE)
        d = read_tensors(path, cls.FORMAT, run_id)
        pair = d["pair"]
        try:
            ps = PatternSet.from_state(d["patterns"])
            _check_views(d, ps)
        except InputError as e:
            raise InputError(f"{str(path)!r}: {e}") from None
        return cls(ps, [Segments.from_dict(s) for s in d["segments"]],
                   list(d["gold"]), list(d["pred"]), [tuple(c) for c in d["candidates"]],
                   (HeadRef.parse(pair[0]), HeadRef.parse(pair[1])) if pair else None, d["why"],
                   [HeadRef.parse(n) for n in d["view"]],
                   HeadPatterns.from_state(d["all_heads"]) if d.get("all_heads") is not None else None)


def _check_views(d: dict[str, Any], ps: PatternSet) -> None:
    """What the schema cannot say of a views bundle: one segment list, answer and candidate list per sample,
    answers inside their candidates, segments inside the sequence, and card and view heads among the patterns."""
    b, t = ps.batch.ids.shape
    if not len(d["segments"]) == len(d["gold"]) == len(d["pred"]) == len(d["candidates"]) == b:
        raise InputError(f"it has {b} sequences but {len(d['segments'])} segment lists, {len(d['gold'])} answers, "
                         f"{len(d['pred'])} predictions and {len(d['candidates'])} candidate lists")
    for i, (g, p, c, seg) in enumerate(zip(d["gold"], d["pred"], d["candidates"], d["segments"])):
        if g >= len(c) or p >= len(c):
            raise InputError(f"sample {i}'s answer {g} or prediction {p} is not among its {len(c)} candidates")
        spans = [*seg["items"], *([seg["query"]] if seg.get("query") else [])]
        if seg["final"] >= t or seg["n_tokens"] > t or any(a > e or e > t for a, e in spans):
            raise InputError(f"sample {i}'s segments reach beyond its {t} positions")
    have = {h.name for h in ps.heads}
    named = [*(d["pair"] or []), *d["view"]]
    stray = [n for n in named if n not in have]
    if stray:
        raise InputError(f"it names {stray[0]} as a card or view head but holds no pattern of it")


def card_heads(heads: pd.DataFrame, pair: tuple[HeadRef, HeadRef] | None = None
               ) -> tuple[tuple[HeadRef, HeadRef] | None, str]:
    """The (gather, aggregate) heads for G&A cards and a sentence saying why: the discovered ``pair``
    when there is one, else (no head passes the role rule) the heads of ``heads`` (a frame with
    ``name, gather, aggregate`` columns, e.g. ``circuit.to_frame()``) with the highest gather and
    aggregate scores, as candidates."""
    if pair:
        g, a = pair
        return pair, (f"Discovered pair: gather head {g.name} reads each line from the line's last token; "
                      f"aggregate head {a.name} reads the lines' last tokens from the final token.")
    if not {"gather", "aggregate"} <= set(heads.columns) or heads[["gather", "aggregate"]].isna().all().any():
        return None, "No role scores in the circuit, so no head to draw a card for."
    a = heads.loc[heads["aggregate"].idxmax(), "name"]
    rest = heads[heads["name"] != a]
    if rest.empty or rest["gather"].isna().all():
        return None, "Only one scored head, so no gather/aggregate pair to draw."
    g = rest.loc[rest["gather"].idxmax(), "name"]
    return (HeadRef.parse(g), HeadRef.parse(a)), (
        f"No head passes the role rule (circuit.json's pair is empty): the cards show the heads with the highest "
        f"gather score ({g}) and aggregate score ({a}) as candidates.")


@options
class ViewOptions(Options):
    """What :func:`card_views` keeps.

    Attributes:
        n_cards: the samples whose patterns are kept (at least 1 is read).
        form: how SSM heads are read (``exact``, ...; :class:`~gna_interp.mixing.PatternOptions`).
        budget: bytes for every head's pattern on the first sample (0: none).
    """

    n_cards: int = 2
    form: str = "exact"
    budget: int = ALL_HEADS_BUDGET

    def validate(self) -> None:
        check_int("n_cards", self.n_cards, 0)
        check_int("budget", self.budget, 0)


def card_views(model: Model, task: Task, ranked: Sequence[HeadRef], frame: pd.DataFrame,
               pair: tuple[HeadRef, HeadRef] | None, config: ViewOptions | None = None, **overrides: Any) -> CardViews:
    """One forward over the first ``n_cards`` samples of ``task`` for the patterns of the card heads
    (:func:`card_heads` of ``frame`` and ``pair``) and the :data:`N_VIEW` best of ``ranked``, plus one
    scoring pass over the same samples for the predicted answers. SSM heads are read in ``form``.
    With a ``budget`` (bytes; 0: none), one more forward on the first sample keeps every head of ``frame`` (in
    its order: a circuit frame is ranked) within it (:func:`head_patterns`). ``config``: a :class:`ViewOptions`
    (or keyword overrides of ``n_cards``, ``form``, ``budget``)."""
    cfg = ViewOptions.build(config, **overrides)
    n_cards, form, budget = cfg.n_cards, cfg.form, cfg.budget
    chosen, why = card_heads(frame, pair)
    samples = list(task.samples[:max(1, n_cards)])
    view = list(ranked[:N_VIEW])
    wanted = list(dict.fromkeys((list(chosen) if chosen else []) + view))
    ps = patterns(model, [s.prompt for s in samples], heads=wanted, options=PatternOptions(form=form))  # type: ignore[arg-type]
    preds = score_candidates(model, samples).pred.tolist()
    every = head_patterns(model, samples[0].prompt, [HeadRef.parse(n) for n in frame["name"]], 0, budget, form) \
        if budget and "name" in frame else None
    return CardViews(ps, segments_of(model.tokenizer, samples), [s.gold for s in samples], preds,
                     [tuple(s.candidates) for s in samples], chosen, why, view, every)
