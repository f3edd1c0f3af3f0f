"""`head_explorer(frame, views)`: the report's click view, any head's pattern and numbers one click away.

The page carries every stored head's compressed pattern (:class:`~gna_interp.circuits.views.HeadPatterns`, base64
inside one ``<script>`` as inert JSON) and every head's row of the circuit frame. A click on a cell of the
heatmap (:func:`~gna_interp.viz.scores.score_heatmap`, whose traces name their cells in ``meta.names``), or a
choice in the head list, decodes that head's pattern in the browser and draws it with circuitsvis's
``AttentionPattern`` on the card sample's tokens, beside its drop with the 95% interval, its control effect and
its role with the reason. Every string reaches the page as JSON data (:func:`~gna_interp.viz.html.script_json`)
and is written into the document with ``textContent`` only, never as markup.
"""

from __future__ import annotations

import base64
import html
import math
from typing import Any

import numpy as np
import pandas as pd

from gna_interp.circuits.views import LEVELS, CardViews
from gna_interp.viz.html import script_json

__all__ = ["HEATMAP_ID", "head_explorer"]

HEATMAP_ID = "gna-heatmap"
_BOX_ID = "gna-head-detail"
_SKIP = {"layer", "head", "kind", "width"}

# Plain ES5-ish script: reads the JSON above it, draws with the page's CircuitsVis bundle, writes text only.
_SCRIPT = r"""
(function () {
  var D = JSON.parse(document.getElementById("gna-head-data").textContent);
  var box = document.getElementById("gna-head-detail"), pick = document.getElementById("gna-head-pick");
  function bytes(b64) {
    var s = atob(b64), out = new Uint8Array(s.length);
    for (var i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
    return out;
  }
  var codes = bytes(D.codes), scales = new Float32Array(bytes(D.scales).buffer), T = D.n_tokens;
  var tri = T * (T + 1) / 2, index = {}, drawn = 0;
  D.stored.forEach(function (n, i) { index[n] = i; });
  function pattern(i) {  // the lower triangle, row by row: value = code / levels * row scale
    var rows = [];
    for (var q = 0; q < T; q++) {
      var row = new Array(T).fill(0), s = scales[i * T + q] / D.levels, off = i * tri + q * (q + 1) / 2;
      for (var k = 0; k <= q; k++) row[k] = codes[off + k] * s;
      rows.push(row);
    }
    return rows;
  }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function num(v) {
    if (v === null || v === undefined) return "n/a";
    if (typeof v !== "number") return String(v);
    return Number.isInteger(v) ? String(v) : Number(v.toPrecision(4)).toString();
  }
  function has(v) { return v !== null && v !== undefined && v !== ""; }
  function show(name) {
    var h = D.rows[name] || {};
    box.replaceChildren();
    box.dataset.head = name;
    box.appendChild(el("h3", name + (has(h.rank) ? "  (rank " + h.rank + " of " + D.n_heads + ")" : ""), "head-name"));
    var lines = [], t = el("table", null, "head-numbers");
    var drop = num(h.drop);
    if (has(h.drop_lo) && has(h.drop_hi)) drop += "  (95% interval " + num(h.drop_lo) + " to " + num(h.drop_hi) + ")";
    else if (has(h.source)) drop += "  (no interval: " + h.source + (h.source === "exact" ? ")" : " estimate)");
    lines.push(["drop", drop]);
    if (has(h.circuit_rank)) lines.push(["circuit rank", num(h.circuit_rank)]);
    if ("control_drop" in h) {
      lines.push(["control effect", num(h.control_drop) + " nats/token on neutral text" +
                  (has(h.control_rel) ? " (" + num(100 * h.control_rel) + "% of the intact loss)" : "")]);
      lines.push(["specificity", num(h.specificity) + (h.generic ? " (generic head)" : "")]);
    } else {
      lines.push(["control effect", "not measured (the circuit was saved without a control task)"]);
    }
    lines.push(["role", (has(h.role) ? h.role : "unscored") + (has(h.role_reason) ? ": " + h.role_reason : "")]);
    if (has(h.pattern_role) && h.pattern_role !== h.role) lines.push(["role from the pattern", h.pattern_role]);
    D.scores.forEach(function (c) {
      if (has(h[c])) lines.push([c.replace(/_/g, " ") + (c === "gather" || c === "aggregate" ? " score" : ""), num(h[c])]);
    });
    if (has(h.offset) && h.offset) lines.push(["offset", "+" + num(h.offset)]);
    lines.forEach(function (r) {
      var tr = el("tr");
      tr.appendChild(el("th", r[0]));
      var td = el("td", r[1]);
      td.style.textAlign = "left";
      tr.appendChild(td);
      t.appendChild(tr);
    });
    box.appendChild(t);
    if (name in index) {
      box.appendChild(el("p", "Pattern on card sample " + D.sample + " (" + T + " tokens): " + D.what, "note"));
      var div = el("div", null, "cv-widget head-pattern");
      div.style.maxWidth = "760px";
      div.id = "gna-head-pattern-" + (drawn++);
      box.appendChild(div);
      var cv = window.CircuitsVis;
      cv.render(div.id, cv.AttentionPattern, {tokens: D.tokens, attention: pattern(index[name]), minValue: 0,
                                               maxValue: 1, showAxisLabels: true});
    } else {
      box.appendChild(el("p", D.omitted.indexOf(name) >= 0 ? "No stored pattern: left out to keep views.pt within " +
        "its size budget (" + D.budget + " bytes); the best-ranked heads were kept." :
        "No stored pattern for this head.", "note no-pattern"));
    }
    if (pick.value !== name) pick.value = name;
  }
  Object.keys(D.rows).forEach(function (n) { pick.appendChild(el("option", n)); });
  pick.addEventListener("change", function () { if (pick.value) show(pick.value); });
  function attach() {
    var gd = document.getElementById(D.heatmap);
    if (!gd || !gd.on) return false;
    gd.on("plotly_click", function (ev) {
      var p = ev && ev.points && ev.points[0];
      if (!p || !p.data || !p.data.meta || !p.data.meta.names) return;
      var ij = Array.isArray(p.pointNumber) ? p.pointNumber : [p.y, p.x];
      var n = (p.data.meta.names[ij[0]] || [])[ij[1]];
      if (n) show(n);
    });
    return true;
  }
  if (!attach()) window.addEventListener("load", attach);
  window.gnaShowHead = show;
  window.gnaHeadPattern = function (name) { return name in index ? pattern(index[name]) : null; };
})();
"""


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
        return '<p class="note">' + html.escape(
            "No click view: this folder's views.pt holds no all-head patterns (it was saved before they existed, "
            "or without views); rerun `gna scan` to get one. Hover the heatmap for each head's numbers.") + "</p>"
    rows = {str(r["name"]): {c: _value(r[c]) for c in frame.columns if c not in _SKIP and c != "name"}
            for _, r in frame.iterrows()}
    scores = [c for c in ("gather", "aggregate", "selectivity", "gold_share", "sharpness", "to_summaries")
              if c in frame.columns]
    data = {"heatmap": heatmap_id, "rows": rows, "n_heads": len(rows), "scores": scores,
            "stored": [h.name for h in every.heads], "omitted": [h.name for h in every.omitted or []],
            "sample": every.sample, "n_tokens": every.n_tokens, "tokens": views.patterns.str_tokens[every.sample],
            "levels": LEVELS, "budget": every.budget,
            "codes": _b64(every.codes.numpy()), "scales": _b64(every.scales.numpy().astype("<f4")),
            "what": "attention heads: softmax pattern; SSM heads: |M| row-normalised. Stored as 8-bit codes "
                    "per row (within 1/510 of the row maximum). Hover a cell for its weight."}
    stored = len(every.heads)
    note = (f"Click any cell of the heatmap, or pick a head here, to see its pattern on card sample {every.sample} "
            f"and its numbers: drop with its 95% interval, control effect, role with the reason. "
            f"{stored} of {len(rows)} heads have a stored pattern ({every.nbytes:,} bytes in views.pt, budget "
            f"{every.budget:,})" + (f"; {len(every.omitted or [])} lower-ranked heads were left out to stay within it."
                                   if every.omitted else "."))
    return (f'<p class="note">{html.escape(note)}</p>'
            f'<p><label>Head: <select id="gna-head-pick"><option value="">(click a cell)</option></select></label></p>'
            f'<div id="{_BOX_ID}" class="head-detail"></div>'
            f'<script type="application/json" id="gna-head-data">{script_json(data)}</script>'
            f"<script>{_SCRIPT}</script>")
