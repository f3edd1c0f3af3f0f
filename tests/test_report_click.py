"""Any head, one click: views.pt keeps every head's pattern on a card sample, compressed within
a stated budget, and a click on any heatmap cell of report.html draws that head's pattern and numbers."""

from __future__ import annotations

import json
import os
import shutil
from types import SimpleNamespace

import pytest
import torch

from gna_interp.circuits import Circuit
from gna_interp.circuits.search.views import (ALL_HEADS_BUDGET, LEVELS, CardViews, HeadPatterns, card_views, head_patterns,
                                       row_normalised)
from gna_interp.mixing import patterns
from gna_interp.models.heads import HeadRef
from gna_interp.report import build_report
from gna_interp.tasks import KVRetrieval
from gna_interp.viz.html import display_tokens
from browser import GRAPH_POINT
from made_up import made_up_scan, write_scan_folder

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]


def _ranked(frame):
    return [HeadRef.parse(n) for n in frame.sort_values("rank")["name"]]


@pytest.mark.parametrize("family", ["llama", "bamba"])
def test_all_head_patterns_decode_to_the_model_patterns_within_the_stated_error(family, tiny_models, tmp_path):
    """Every head is stored; decoded from views.pt, each value is within row max / 510 of the pattern that
    ``mixing.patterns`` reads from the model (SSM heads row-normalised, |M| / sum |M|), and the upper triangle that
    is not stored is zero in the model too."""
    model = tiny_models[family]
    task = KVRetrieval(n_pairs=4, n_samples=2, seed=3)
    frame = made_up_scan(model.heads()).sort_values("rank")
    views = card_views(model, task, _ranked(frame), frame, None, n_cards=2)
    views.save(tmp_path / "views.pt")
    every = CardViews.load(tmp_path / "views.pt").all_heads
    assert every is not None and every.heads == _ranked(frame) and not every.omitted  # all heads, best first
    t = every.n_tokens
    assert t == len(views.patterns.str_tokens[0]) and t > 20
    assert every.nbytes == len(every.heads) * HeadPatterns.bytes_per_head(t) <= ALL_HEADS_BUDGET
    assert every.codes.dtype == torch.uint8 and every.codes.shape == (len(every.heads), t * (t + 1) // 2)

    direct = patterns(model, task[0].prompt, heads=every.heads)
    exact = row_normalised(direct.sample(0), every.heads)
    assert exact.triu(1).abs().max() < 1e-6  # causal: nothing lost above the diagonal
    decoded = every.decode()
    err = (decoded - exact).abs()
    bound = every.max_error()[:, :, None]
    assert bool((err <= bound + 1e-6).all()), float((err - bound).max())
    assert float(err.max()) <= 1 / (2 * LEVELS) + 1e-6
    assert float(err.max()) > 0  # 8-bit codes really are lossy: the bound is what the test checks
    kinds = {h.kind for h in every.heads}
    assert kinds == ({"attn", "ssm2"} if family == "bamba" else {"attn"})
    one = every.heads[-1]
    assert torch.equal(every.decode([one.name])[0], decoded[-1])


def test_the_budget_keeps_the_best_ranked_heads_and_names_the_rest(tiny_models):
    model = tiny_models["llama"]
    prompt = KVRetrieval(n_pairs=3, n_samples=1, seed=0)[0].prompt
    ranked = list(reversed(model.heads()))
    t = int(model.as_batch(prompt).ids.shape[1])
    budget = 3 * HeadPatterns.bytes_per_head(t) + HeadPatterns.bytes_per_head(t) // 2
    kept = head_patterns(model, prompt, ranked, budget=budget)
    assert kept.heads == ranked[:3] and kept.omitted == ranked[3:] and kept.nbytes <= budget
    with pytest.raises(Exception, match="left out to stay within the size budget"):
        kept.index(ranked[5])


def test_views_refuse_all_head_patterns_of_another_shape(tiny_models, tmp_path):
    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path / "run", model, model.heads())
    run = json.loads((folder / "circuit.json").read_text())["run_id"]
    bundle = torch.load(folder / "views.pt", weights_only=True)
    bundle["all_heads"]["codes"] = bundle["all_heads"]["codes"][:, :-1]
    torch.save(bundle, folder / "views.pt")
    with pytest.raises(Exception, match=r"codes must be uint8"):
        CardViews.load(folder / "views.pt", run)
    bundle["all_heads"]["extra"] = 1
    torch.save(bundle, folder / "views.pt")
    with pytest.raises(Exception, match="all_heads"):
        CardViews.load(folder / "views.pt", run)


def test_a_folder_without_all_head_patterns_still_renders_with_a_note(tiny_models, tmp_path):
    """Views saved before the field existed (no ``all_heads`` in views.pt) load, and the report says why there is
    no click view; no views at all says so too."""
    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path / "run", model, model.heads())
    run = json.loads((folder / "circuit.json").read_text())["run_id"]
    views = CardViews.load(folder / "views.pt", run)
    views.all_heads = None
    views.save(folder / "views.pt", run)
    assert "all_heads" not in torch.load(folder / "views.pt", weights_only=True)
    html = build_report(folder, png=False).read_text(encoding="utf-8")
    assert "No click view: this folder&#x27;s views.pt holds no all-head patterns" in html
    assert "gna-head-data" not in html and "CircuitsVis.render(" in html  # the rest of the report is drawn
    bare = write_scan_folder(tmp_path / "bare", model, model.heads(), n_cards=0)
    assert "No click view" in build_report(bare, png=False).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def report(tiny_models, tmp_path_factory):
    """The report the page tests open: a made-up circuit of the tiny Llama whose card tokens and role reasons try
    to become markup, with a real edge table (path patching among its top 4 heads)."""
    from gna_interp.circuits.edges.causal import measure_edges
    from made_up import made_up_circuit
    from test_hostile import HOSTILE

    model = tiny_models["llama"]
    circuit = made_up_circuit(model, model.heads())
    circuit.roles["role_reason"] = [HOSTILE[i % len(HOSTILE)] for i in range(len(circuit.roles))]
    for tokens in circuit.views.patterns.str_tokens:
        tokens[:] = [HOSTILE[i % len(HOSTILE)] for i in range(len(tokens))]
    circuit.edges = measure_edges(model, circuit.load_task(), circuit.heads[:4])
    return build_report(circuit.save(tmp_path_factory.mktemp("report") / "run"), png=False)


# an init script: every CircuitsVis.render call's arguments are kept in window.__props
RECORD_RENDERS = """(() => { window.__props = []; let cv;
  Object.defineProperty(window, 'CircuitsVis', {configurable: true, get() { return cv; }, set(v) {
    cv = new Proxy(v, {get(t, k) { return k !== 'render' ? t[k]
      : (id, el, props) => { window.__props.push([id, props]); return t.render(id, el, props); }; }}); }});
})();"""


@pytest.fixture(scope="module")
def page(report):
    """``report`` open in one Chromium page (1280 x 900) for the module's browser tests, each of which waits for
    what its own action draws: ``errors`` (script errors), ``dialogs`` and ``requests`` collect what the page did,
    ``at_load`` what it had drawn once loaded."""
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium); .ci/run installs it")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    errors, dialogs, requests = [], [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1280, "height": 900})
            pg.add_init_script(RECORD_RENDERS)
            pg.on("pageerror", lambda e: errors.append(str(e)))
            pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            pg.on("request", lambda r: requests.append(r.url))
            pg.goto(report.as_uri(), wait_until="load", timeout=120_000)
            pg.wait_for_function("document.querySelector('#gna-heatmap .hm image') !== null"
                                 " && typeof window.gnaShowHead === 'function'"
                                 " && document.querySelector('#gna-graph .scatterlayer') !== null", timeout=120_000)
            at_load = pg.evaluate("({renders: window.__props.length, "
                                  "canvases: document.querySelectorAll('#gna-head-detail canvas').length})")
            yield SimpleNamespace(page=pg, errors=errors, dialogs=dialogs, requests=requests, at_load=at_load)
        finally:
            browser.close()


def test_the_report_embeds_the_click_data_once_as_inert_json(report):
    html = report.read_text(encoding="utf-8")
    assert html.count('id="gna-head-data"') == 1 and html.count("var CircuitsVis") == 1
    assert html.count("* plotly.js v") == 1
    start = html.index('id="gna-head-data">') + len('id="gna-head-data">')
    data = json.loads(html[start:html.index("</script>", start)])
    circuit = Circuit.load(report.parent)
    assert set(data["rows"]) == {h.name for h in circuit.scan.heads} and len(data["stored"]) == 12


# before an action that shows a head, the head box forgets which head it showed, so the wait sees the action's own
FORGET_HEAD = "delete document.getElementById('gna-head-detail').dataset.head"


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_clicking_a_heatmap_cell_outside_the_top_6_draws_that_heads_pattern(report, page):
    """A real mouse click on the heatmap cell of a head ranked below 6 (no pattern of it anywhere else on the page)
    draws its circuitsvis pattern, decoded in the browser equal to views.pt's, with its name and numbers."""
    circuit = Circuit.load(report.parent)
    frame = circuit.to_frame()
    row = frame[frame["rank"] == 9].iloc[0]
    name = str(row["name"])
    assert name not in {h.name for h in circuit.views.view}  # outside the top-6 pattern view
    every = circuit.views.all_heads
    shot = report.parent / "click.png"
    pg = page.page
    assert page.at_load == {"renders": 1, "canvases": 0}  # the top-heads widget at load, no head shown yet
    pg.evaluate("document.getElementById('gna-heatmap').scrollIntoView()")
    cell = pg.evaluate("""(name) => {
        const gd = document.getElementById('gna-heatmap');
        for (let t = 0; t < gd.data.length; t++) {
          const names = gd.data[t].meta.names, tr = gd._fullData[t], fl = gd._fullLayout;
          const xa = fl['xaxis' + tr.xaxis.slice(1)], ya = fl['yaxis' + tr.yaxis.slice(1)];
          for (let y = 0; y < names.length; y++) for (let x = 0; x < names[y].length; x++)
            if (names[y][x] === name) {
              const box = gd.getBoundingClientRect();
              return {x: box.left + xa._offset + xa.d2p(x), y: box.top + ya._offset + ya.d2p(y)};
            }
        }
        return null; }""", name)
    assert cell is not None, name
    before = pg.evaluate(f"{FORGET_HEAD}; window.__props.length")
    pg.mouse.click(cell["x"], cell["y"])
    pg.wait_for_function("(n) => document.getElementById('gna-head-detail').dataset.head === n"
                         " && document.querySelectorAll('#gna-head-detail canvas').length >= 1", arg=name,
                         timeout=60_000)
    pg.wait_for_timeout(500)
    seen = pg.evaluate("""() => {
        const box = document.getElementById('gna-head-detail');
        const c = box.querySelector('canvas');
        const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let inked = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i + 3] > 0 && (px[i] < 240 || px[i + 1] < 240)) inked++;
        const last = window.__props[window.__props.length - 1];
        return {head: box.dataset.head, text: box.innerText, inked, w: c.width, h: c.height,
                renders: window.__props.length, id: last[0], props: last[1],
                pick: document.getElementById('gna-head-pick').value};
    }""")
    pg.screenshot(path=str(shot))
    assert not page.errors, page.errors
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in page.requests), page.requests
    assert seen["head"] == name == seen["pick"] and seen["id"].startswith("gna-head-pattern-")
    assert seen["renders"] == before + 1  # the click drew one pattern
    text = seen["text"]
    assert name in text and "(rank 9 of 12)" in text and "95% interval" in text and "role" in text
    assert f"{row['drop']:.4g}"[:5] in text
    assert seen["w"] > 100 and seen["h"] > 100 and seen["inked"] > 500, seen
    assert seen["props"]["tokens"] == display_tokens(circuit.views.patterns.str_tokens[every.sample])
    drawn = torch.tensor(seen["props"]["attention"])
    assert torch.allclose(drawn, every.decode([name])[0], atol=1e-6)
    print(f"screenshot: {shot}")


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_every_head_shows_with_hostile_tokens_and_reasons_as_text_only(report, page):
    """Each head of the page, shown in turn, draws its pattern; tokens and role reasons that try to become markup
    reach circuitsvis unchanged and the detail box as text, and run nothing."""
    from test_hostile import HOSTILE

    names = [h.name for h in Circuit.load(report.parent).scan.heads]
    pg = page.page
    shown = []
    for name in names:
        pg.evaluate(FORGET_HEAD)
        pg.evaluate("(n) => window.gnaShowHead(n)", name)
        pg.wait_for_function("(n) => document.getElementById('gna-head-detail').dataset.head === n"
                             " && document.querySelector('#gna-head-detail canvas') !== null", arg=name,
                             timeout=30_000)
        shown.append(pg.evaluate("""() => { const b = document.getElementById('gna-head-detail');
            return [b.dataset.head, b.querySelector('h3').textContent, b.innerText]; }"""))
    pg.wait_for_timeout(300)
    pwned = pg.evaluate("window.__pwned === undefined ? null : String(window.__pwned)")
    injected = pg.evaluate("document.querySelectorAll('img, [onload], [onerror]').length")
    assert not page.errors and pwned is None and not page.dialogs and injected == 0, (page.errors, pwned, page.dialogs)
    assert [s[0] for s in shown] == names and all(s[1].startswith(n) for s, n in zip(shown, names))
    assert any(HOSTILE[0] in s[2] for s in shown)  # a reason shown literally, as text


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_clicking_an_edge_draws_both_patterns_and_a_node_its_head(report, page):
    """Real mouse clicks on the circuit graph: an edge's marker draws the sender's pattern at the edge's positions on
    the card sample (equal to views.pt's, decoded in the browser) beside the receiver's row at the decision position; a node
    shows that head in the head box."""
    circuit = Circuit.load(report.parent)
    edges = circuit.edges
    drawn = edges[(edges["receiver"] != "logits") & (edges["effect"] > 0)]  # edges with a positive effect are drawn
    assert len(drawn), edges
    target = int(drawn["effect"].idxmax())
    row = edges.loc[target]
    every, seg = circuit.views.all_heads, circuit.views.segments[circuit.views.all_heads.sample]
    rows = {"summary": seg.summaries, "items": [q for sp in seg.items for q in range(sp.start, sp.stop)],
            "decision": list(range(seg.final, seg.n_tokens))}[row["positions"]]
    want_s = every.decode([row["sender"]])[0][rows]
    want_r = every.decode([row["receiver"]])[0][seg.final]
    pg = page.page
    pg.evaluate("document.getElementById('gna-graph').scrollIntoView()")
    at = pg.evaluate(GRAPH_POINT, ["edges", target])
    pg.mouse.click(at["x"], at["y"])
    pg.wait_for_function("document.querySelectorAll('#gna-edge-detail .js-plotly-plot').length >= 1", timeout=60_000)
    seen = pg.evaluate("""() => {
        const box = document.getElementById('gna-edge-detail');
        const s = document.getElementById('gna-edge-sender'), r = document.getElementById('gna-edge-receiver');
        return {edge: box.dataset.edge, text: box.innerText, s: s.data[0].z, r: r.data ? r.data[0].z : null}; }""")
    at = pg.evaluate(GRAPH_POINT, ["heads", str(row["receiver"])])
    pg.evaluate(FORGET_HEAD)
    pg.mouse.click(at["x"], at["y"])
    pg.wait_for_function("document.getElementById('gna-head-detail').dataset.head !== undefined", timeout=60_000)
    head = pg.evaluate("document.getElementById('gna-head-detail').dataset.head")
    pg.screenshot(path=str(report.parent / "graph.png"))
    assert not page.errors, page.errors
    assert seen["edge"] == row["edge"] and f"{float(row['effect']):.3f}" in seen["text"]
    assert torch.allclose(torch.tensor(seen["s"]), want_s, atol=1e-6)
    assert seen["r"] is not None and torch.allclose(torch.tensor(seen["r"][0]), want_r, atol=1e-6)
    assert head == row["receiver"]


def test_circuit_graph_displays_itself_and_says_when_there_are_no_edges(report):
    from gna_interp.viz import circuit_graph

    circuit = Circuit.load(report.parent)
    view = circuit_graph(circuit)
    page = view.page()
    assert page.count('id="gna-graph-data"') == 1 and page.count('id="gna-head-data"') == 1
    assert page.count("* plotly.js v") == 1 and page.count("var CircuitsVis") == 1
    assert view._repr_html_().startswith("<iframe")
    start = page.index('id="gna-graph-data">') + len('id="gna-graph-data">')
    data = json.loads(page[start:page.index("</script>", start)])
    assert [e["edge"] for e in data["edges"]] == list(circuit.edges["edge"])
    circuit.edges = None
    assert "No circuit graph: this circuit has no edge table" in circuit_graph(circuit).page()
