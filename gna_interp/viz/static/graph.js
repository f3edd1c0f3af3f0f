// The circuit graph's clicks (gna_interp.viz.graph): reads the JSON in #gna-graph-data; a head node goes to the
// head explorer (window.gnaShowHead), an edge's marker draws the sender's and receiver's patterns, an MLP, embeddings
// or logits node lists its edges. Strings are written with textContent only.
(function () {
  var G = JSON.parse(document.getElementById("gna-graph-data").textContent);
  var box = document.getElementById("gna-edge-detail");
  function num(x) { return x === null || x === undefined ? "not measured" : x.toFixed(3); }
  function el(tag, text, cls) {
    var e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function tok(i) { return i + " " + G.tokens[i].replace(/\n/g, "\u23ce").replace(/ /g, "\u00b7"); }
  function heat(div, z, rows, title) {
    // colour runs from 0 to the largest weight shown (hover for each weight)
    window.Plotly.newPlot(div, [{type: "heatmap", z: z, x: G.tokens.map(function (t, i) { return tok(i); }),
                                 y: rows.map(tok), zmin: 0,
                                 zmax: Math.max.apply(null, [].concat.apply([1e-6], z)),
                                 colorscale: [[0, "#ffffff"], [1, "#08306b"]],
                                 hovertemplate: "query %{y}<br>key %{x}<br>weight %{z:.3f}<extra></extra>"}],
                          {title: {text: title, font: {size: 13}}, height: 170 + Math.min(22 * z.length, 640),
                           margin: {l: 110, r: 10, t: 40, b: 90},
                           xaxis: {type: "category", tickfont: {size: 8}},
                           yaxis: {type: "category", autorange: "reversed"}},
                          {displaylogo: false, responsive: true});
  }
  function describe(name) {  // why a node has no pattern to draw
    var n = G.nodes && G.nodes[name];
    if (name === "logits") return "The direct path goes to the answer logits.";
    if (n && n.kind === "mlp") return name + " is an MLP: it has no attention pattern.";
    if (n && n.kind === "embed") return "The edge starts at the embeddings: they have no attention pattern.";
    return "No stored pattern of " + name + " on the card sample.";
  }
  function effect(e) {
    if (e.effect === null || e.effect === undefined)
      return "not measured exactly (screened only" + (e.score === null || e.score === undefined ? "" :
        ": screen score " + num(e.score)) + ")";
    return num(e.effect) + (e.low === null || e.low === undefined ? "" : " (95% interval " + num(e.low) + " to " +
      num(e.high) + ")");
  }
  function showEdge(i) {
    var e = G.edges[i];
    box.replaceChildren();
    delete box.dataset.node;
    box.dataset.edge = e.edge;
    box.appendChild(el("h3", e.edge, "edge-name"));
    box.appendChild(el("p", "effect on the logit difference " + effect(e) +
      ": the drop when only this path is removed", "note"));
    var get = window.gnaHeadPattern;
    var s = get ? get(e.sender) : null, r = e.receiver !== "logits" && get ? get(e.receiver) : null;
    var left = el("div", null, "edge-sender"), right = el("div", null, "edge-receiver");
    left.id = "gna-edge-sender"; right.id = "gna-edge-receiver";
    var wrap = el("div"); wrap.style.display = "flex"; wrap.style.gap = "12px";
    left.style.flex = right.style.flex = "1";
    wrap.appendChild(left); wrap.appendChild(right); box.appendChild(wrap);
    var rows = G.rows[e.positions] || G.rows.all;
    if (s) heat(left, rows.map(function (q) { return s[q]; }), rows,
                e.sender + " at its edge's positions (" + e.positions + ")");
    else left.appendChild(el("p", describe(e.sender), "note"));
    if (r) heat(right, [r[G.final]], [G.final], e.receiver + " at the decision position");
    else right.appendChild(el("p", describe(e.receiver), "note"));
  }
  function showNode(name) {  // a node without a pattern (MLP, embeddings, logits): its edges in and out
    var n = G.nodes[name], t = el("table", null, "node-edges");
    box.replaceChildren();
    delete box.dataset.edge;
    box.dataset.node = name;
    box.appendChild(el("h3", name, "node-name"));
    var kinds = {mlp: "MLP of layer " + n.layer, embed: "the embeddings", logits: "the answer logits"};
    box.appendChild(el("p", (kinds[n.kind] || n.kind + " of layer " + n.layer) +
      (n.role ? ", causal role " + n.role : ""), "note"));
    [["into " + name, "receiver"], ["out of " + name, "sender"]].forEach(function (side) {
      var mine = G.edges.filter(function (e) { return e[side[1]] === name; });
      if (!mine.length && (n.kind === "embed" || n.kind === "logits")) return;  // nothing flows into the embeddings
      function line(tag, a, b) {
        var tr = el("tr");
        tr.appendChild(el(tag, a)); tr.appendChild(el(tag, b));
        tr.firstChild.style.textAlign = tr.lastChild.style.textAlign = "left";
        t.appendChild(tr);
      }
      line("th", side[0] + " (" + mine.length + ")", "effect");
      mine.forEach(function (e) { line("td", e.edge, effect(e)); });
    });
    box.appendChild(t);
  }
  function attach() {
    var gd = document.getElementById(G.graph);
    if (!gd || !gd.on) return false;
    gd.on("plotly_click", function (ev) {
      var p = ev && ev.points && ev.points[0];
      if (!p || !p.data) return;
      if (p.data.name === "edges") showEdge(p.customdata);
      else if (p.data.name === "heads" && p.customdata && window.gnaShowHead) window.gnaShowHead(p.customdata);
      else if (p.data.name === "nodes" && p.customdata && G.nodes) showNode(p.customdata);
    });
    return true;
  }
  if (!attach()) window.addEventListener("load", attach);
  window.gnaShowEdge = showEdge;
  window.gnaShowNode = showNode;
})();
