"""What a report draws of a circuit, computed once beside the model and saved with the circuit.

:func:`card_views` runs the model once over the first few task samples and keeps the patterns of the
gather/aggregate pair and of the best-ranked heads, each sample's segments, gold and predicted answers.
:class:`CardViews` saves and loads them (``views.pt``), so ``gna report DIR`` draws the G&A cards and
pattern views on a machine without the model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import pandas as pd

from gna_interp.mixing import PatternOptions, PatternSet, patterns
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.store import read_tensors, write_tensors
from gna_interp.tasks.base import Task
from gna_interp.tasks.scoring import score_candidates
from gna_interp.tasks.segments import Segments

N_VIEW = 6

__all__ = ["N_VIEW", "CardViews", "card_heads", "card_views"]


@dataclass
class CardViews:
    """Patterns and annotations of a few task samples for the report's G&A cards and pattern views.

    Attributes:
        patterns: patterns of ``pair`` and ``view`` heads on the samples (one batch).
        segments: each sample's token segments (lines / options, final position).
        gold, pred: gold and predicted candidate index per sample; ``candidates`` their texts.
        pair: the (gather, aggregate) heads drawn on the cards, or None; ``why`` says how they were chosen.
        view: the best-ranked heads shown in the pattern view.
    """

    patterns: PatternSet
    segments: list[Segments]
    gold: list[int]
    pred: list[int]
    candidates: list[tuple[str, ...]]
    pair: tuple[HeadRef, HeadRef] | None
    why: str
    view: list[HeadRef]

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

    def save(self, path: str | os.PathLike, run_id: str | None = None) -> Path:
        """Write the views to ``path`` (a ``views`` tensor bundle; ``run_id``: the saved result it belongs to)."""
        return write_tensors(path, "views", {**({"run_id": run_id} if run_id else {}),
            "patterns": self.patterns.to_state(), "segments": [s.to_dict() for s in self.segments],
            "gold": list(self.gold), "pred": list(self.pred), "candidates": [list(c) for c in self.candidates],
            "pair": [h.name for h in self.pair] if self.pair else None, "why": self.why,
            "view": [h.name for h in self.view]})

    @classmethod
    def load(cls, path: str | os.PathLike, run_id: str | None = None) -> "CardViews":
        """Read views written by :meth:`save` (given ``run_id``, the bundle must carry that id)."""
        d = read_tensors(path, "views", run_id)
        pair = d["pair"]
        return cls(PatternSet.from_state(d["patterns"]), [Segments.from_dict(s) for s in d["segments"]],
                   list(d["gold"]), list(d["pred"]), [tuple(c) for c in d["candidates"]],
                   (HeadRef.parse(pair[0]), HeadRef.parse(pair[1])) if pair else None, d["why"],
                   [HeadRef.parse(n) for n in d["view"]])


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


def card_views(model: Model, task: Task, ranked: Sequence[HeadRef], frame: pd.DataFrame,
               pair: tuple[HeadRef, HeadRef] | None, n_cards: int = 2, form: str = "exact") -> CardViews:
    """One forward over the first ``n_cards`` samples of ``task`` for the patterns of the card heads
    (:func:`card_heads` of ``frame`` and ``pair``) and the :data:`N_VIEW` best of ``ranked``, plus one
    scoring pass over the same samples for the predicted answers. SSM heads are read in ``form``."""
    chosen, why = card_heads(frame, pair)
    samples = list(task.samples[:max(1, n_cards)])
    view = list(ranked[:N_VIEW])
    wanted = list(dict.fromkeys((list(chosen) if chosen else []) + view))
    ps = patterns(model, [s.prompt for s in samples], heads=wanted, options=PatternOptions(form=form))  # type: ignore[arg-type]
    preds = score_candidates(model, samples).pred.tolist()
    return CardViews(ps, [s.segments(model.tokenizer) for s in samples], [s.gold for s in samples], preds,
                     [tuple(s.candidates) for s in samples], chosen, why, view)
