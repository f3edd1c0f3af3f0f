// The head explorer (gna_interp.viz.head_view): reads the JSON in #gna-head-data, draws a head's pattern with the
// page's CircuitsVis bundle on a heatmap click or a pick from the list, and writes text only (textContent).
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
