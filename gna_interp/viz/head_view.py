"""`head_explorer(frame, views)`: the report's click view, any head's pattern and numbers one click away.

The page carries every stored head's compressed pattern (:class:`~gna_interp.circuits.search.views.HeadPatterns`, base64
inside one ``<script>`` as inert JSON) and every head's row of the circuit frame. A click on a cell of the
heatmap (:func:`~gna_interp.viz.scores.score_heatmap`, whose traces name their cells in ``meta.names``), or a
choice in the head list, decodes that head's pattern in the browser and draws it with circuitsvis's
``AttentionPattern`` on the card sample's tokens, beside its drop with the 95% interval, its control effect and
its role with the reason. Every string reaches the page as JSON data (:func:`~gna_interp.viz.html.script_json`)
and is written into the document with ``textContent`` only, never as markup.
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np
import pandas as pd

from gna_interp.circuits.search.views import LEVELS, CardViews
from gna_interp.viz.html import asset, display_tokens, part, render
from gna_interp.viz.text import counted

__all__ = ["HEATMAP_ID", "head_explorer"]

HEATMAP_ID = "gna-heatmap"
_BOX_ID = "gna-head-detail"
_SKIP = {"layer", "head", "kind", "width"}

def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _value(v: Any) -> Any:
    """A frame cell as JSON data: NaN and missing values become null, numpy scalars plain numbers."""
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, (list, tuple, dict, np.ndarray)):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or (not isinstance(v, (str, bool, int, float)) and pd.isna(v)):
        return None
    return v


def head_explorer(frame: pd.DataFrame, views: CardViews | None, heatmap_id: str = HEATMAP_ID) -> str:
    """The click view below the heatmap (plotly ``<div id=heatmap_id>``): a head list, a detail box and the
    script that fills it with a head's numbers (every row of ``frame``, e.g. ``circuit.to_frame()``) and its
    pattern from ``views.all_heads``. Needs the page's circuitsvis and plotly bundles. Without stored
    all-head patterns it returns a note saying so (the numbers stay in the heatmap's hover)."""
    every = views.all_heads if views is not None else None
    if every is None:
        return part("note", "No click view: this folder's views.pt holds no all-head patterns (it was saved before "
                            "they existed, or without views); rerun `gna scan` to get one. Hover the heatmap for each "
                            "head's numbers.")
    rows = {str(r["name"]): {c: _value(r[c]) for c in frame.columns if c not in _SKIP and c != "name"}
            for _, r in frame.iterrows()}
    scores = [c for c in ("gather", "aggregate", "selectivity", "gold_share", "sharpness", "to_summaries")
              if c in frame.columns]
    data = {"heatmap": heatmap_id, "rows": rows, "n_heads": len(rows), "scores": scores,
            "stored": [h.name for h in every.heads], "omitted": [h.name for h in every.omitted or []],
            "sample": every.sample, "n_tokens": every.n_tokens,
            "tokens": display_tokens(views.patterns.str_tokens[every.sample]),
            "levels": LEVELS, "budget": every.budget,
            "codes": _b64(every.codes.numpy()), "scales": _b64(every.scales.numpy().astype("<f4")),
            "what": "attention heads: softmax pattern; SSM heads: |M| row-normalised. Stored as 8-bit codes "
                    "per row (within 1/510 of the row maximum). Hover a cell for its weight."}
    stored = len(every.heads)
    note = (f"Click any cell of the heatmap, or pick a head here, to see its pattern on card sample {every.sample} "
            f"and its numbers: drop with its 95% interval, control effect, role with the reason. "
            f"{stored} of {counted(len(rows), 'head')} {'has' if stored == 1 else 'have'} a stored pattern "
            f"({every.nbytes:,} bytes in views.pt, budget {every.budget:,})"
            + (f"; {counted(len(every.omitted or []), 'lower-ranked head')} "
               f"{'was' if len(every.omitted or []) == 1 else 'were'} left out to stay within it."
               if every.omitted else "."))
    return render("head_explorer.html", note=note, box_id=_BOX_ID, data=data, script=asset("head_view.js"))
