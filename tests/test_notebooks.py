"""The notebooks are stored without outputs and run top to bottom offline (nbclient, a fresh kernel)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parent.parent / "notebooks").glob("*.ipynb"))
CELL_TIMEOUT_S = 600  # a cell; 03_paper_claims runs SmolLM2 cells when it is installed (under a minute alone)
PLOTLY_JSON = "application/vnd.plotly.v1+json"
CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]


def _load(path: Path):
    nbformat = pytest.importorskip("nbformat")
    return nbformat.read(path, as_version=4)


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_ssm_vs_attention.ipynb", "03_paper_claims.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path: Path):
    nb = _load(path)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name} has no code cells"
    dirty = [i for i, c in enumerate(code) if c.outputs or c.execution_count is not None]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs; strip them before committing"


def test_notebook_mode_gives_every_plotly_figure_an_offline_html_form():
    """After ``notebook_mode()`` a figure's bundle is the plotly JSON (JupyterLab) plus text/html that needs the
    page's plotly.js only: no CDN, no MathJax script; the bundle it displays once is plotly.js itself, inline."""
    pio = pytest.importorskip("plotly.io")
    import plotly.graph_objects as go

    from gna_interp.viz import notebook_mode
    from gna_interp.viz.notebook import plotly_bundle_html

    before = pio.renderers.default
    try:
        notebook_mode(show=False)
        bundle = pio.renderers._build_mime_bundle(go.Figure(go.Bar(y=[1, 3, 2])).to_dict())
    finally:
        pio.renderers.default = before
    assert set(bundle) == {PLOTLY_JSON, "text/html"}
    html = bundle["text/html"]
    assert "Plotly.newPlot" in html and "<script src" not in html and "https://" not in html
    js = plotly_bundle_html()
    assert len(js) > 1_000_000 and "<script src" not in js


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom(path: Path, tmp_path: Path):
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    nb = _load(path)
    # one thread: beside the other test workers, a kernel whose OpenMP threads fight them for the cores ran
    # 03_paper_claims about 7x slower than alone
    env_threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    old = {k: os.environ.get(k) for k in env_threads}
    os.environ.update(env_threads)
    start = time.perf_counter()
    try:
        client = nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    seconds = time.perf_counter() - start
    print(f"{path.name}: {seconds:.1f}s on {os.cpu_count()} cores, python {sys.version.split()[0]}")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    streams = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                         if o.output_type == "stream")
    assert "TqdmWarning" not in streams and "IProgress not found" not in streams, streams
    if path.stem == "01_quickstart":
        _check_figures_display_themselves(nb)
    if path.stem == "03_paper_claims":
        _check_claims_are_measured(nb)
    _check_export_shows_every_figure(nb, tmp_path / f"{path.stem}.html")  # last: it skips without Chromium


def _check_figures_display_themselves(nb) -> None:
    """Cells whose value is a viz result show the figure: an offline circuitsvis iframe, plotly JSON."""
    def results(marker: str) -> list[dict]:
        cells = [c for c in nb.cells if c.cell_type == "code" and marker in c.source]
        assert cells, f"no cell calls {marker}"
        return [o.get("data", {}) for c in cells for o in c.outputs if o.output_type in ("execute_result", "display_data")]

    view = results("patterns_page(")
    assert view and "text/html" in view[0], view
    html = view[0]["text/html"]
    assert html.startswith("<iframe") and "CircuitsVis.render" in html and "var CircuitsVis" in html
    for marker in ("score_heatmap(", "ablation_curve(", "ga_card("):
        figs = results(marker)
        assert figs and PLOTLY_JSON in figs[0] and "text/html" in figs[0], (marker, list(figs[0]) if figs else None)


def _check_claims_are_measured(nb) -> None:
    """03_paper_claims prints each claim's numbers and shows the sweep and families figures."""
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    for marker in ("Transformer: intact", "dictionary sweep of zoo:transformer-kv", "smoother: gold share",
                   "more redundant: removing one head"):
        assert marker in text, marker
    figs = [c for c in nb.cells if c.cell_type == "code" and ("sw.figure()" in c.source or "fam.figure()" in c.source)]
    assert len(figs) == 2
    for c in figs:
        data = [o.get("data", {}) for o in c.outputs if o.output_type in ("execute_result", "display_data")]
        assert data and PLOTLY_JSON in data[0] and "text/html" in data[0], c.source


# What a reader would call broken on the exported page, listed by the browser: tables with a multi-level header, an
# empty row or wider than their output area; subplot titles that repeat themselves ("a · a"); legend entries of one
# figure that share a swatch (same trace type, colour, pattern, line and symbol: opacity alone does not tell them apart).
PAGE_DEFECTS = """
() => {
  const out = [];
  // tables: one header row (a flat index), no row without any text, none wider than its output area
  document.querySelectorAll('table.dataframe').forEach((t, i) => {
    const head = t.querySelectorAll('thead tr').length;
    if (head > 1) out.push(`table ${i}: ${head} header rows (a multi-level index or columns)`);
    t.querySelectorAll('tbody tr').forEach((r, j) => {
      if (![...r.cells].some(c => c.textContent.trim())) out.push(`table ${i}: row ${j} is empty`);
    });
    const box = t.closest('.jp-OutputArea-output') || t.parentElement;
    if (t.getBoundingClientRect().width > box.getBoundingClientRect().width + 1)
      out.push(`table ${i}: ${Math.round(t.getBoundingClientRect().width)} px wide in a ${Math.round(box.getBoundingClientRect().width)} px output`);
  });
  document.querySelectorAll('.js-plotly-plot').forEach((gd, i) => {
    const L = gd._fullLayout || {};
    (L.annotations || []).forEach(a => {
      const parts = String(a.text || '').split(' · ');
      if (new Set(parts).size < parts.length) out.push(`figure ${i}: title '${a.text}' repeats itself`);
    });
    const seen = {};
    (gd._fullData || []).filter(t => t.showlegend && t.visible === true).forEach(t => {
      const m = t.marker || {}, l = t.line || {};
      const key = JSON.stringify([t.type, m.color, (m.pattern || {}).shape, l.color, l.dash,
                                  t.mode, t.fillcolor, m.symbol]);
      if (key in seen) out.push(`figure ${i}: legend entries '${seen[key]}' and '${t.name}' share one swatch`);
      else seen[key] = t.name;
    });
  });
  return out;
}
"""


def _figure_outputs(nb) -> tuple[int, int]:
    """(plotly figures, gna HTML views) among the executed notebook's displayed outputs."""
    data = [o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type in ("execute_result", "display_data")]
    figures = [d for d in data if PLOTLY_JSON in d]
    blank = [i for i, d in enumerate(figures) if "text/html" not in d]
    assert not blank, f"figures {blank} carry no text/html form: call gna_interp.viz.notebook_mode() first"
    views = sum(1 for d in data if str(d.get("text/html", "")).startswith('<iframe class="gna-view"'))
    return len(figures), views


def _check_export_shows_every_figure(nb, out: Path) -> None:
    """nbconvert's HTML of the executed notebook shows no error and no unknown token, and, opened in headless Chromium
    with every request off this machine refused (no network, no kernel), draws each plotly figure the notebook showed,
    fills each gna view frame and has none of the :data:`PAGE_DEFECTS`."""
    nbconvert = pytest.importorskip("nbconvert")
    n_figures, n_views = _figure_outputs(nb)
    assert n_figures + n_views > 0, "the notebook shows no figure"
    body, _ = nbconvert.HTMLExporter().from_notebook_node(nb)
    out.write_text(body, encoding="utf-8")
    assert "Traceback (most recent call last)" not in body, "the exported page shows an error"
    assert '"[UNK]"' not in body and ">[UNK]<" not in body, "a figure or table shows the unknown token [UNK]"
    assert body.count("Plotly.newPlot(") >= n_figures
    if CHROMIUM is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium) to check the exported HTML: .ci/run has it")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    errors: list[str] = []
    shot = out.with_suffix(".png")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            local = ("file:", "data:", "blob:", "about:")
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(local) else r.abort())
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(out.as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function(
                """([nf, nv]) => [...document.querySelectorAll('.js-plotly-plot')].filter(
                       gd => gd._fullLayout && gd.querySelector('svg.main-svg')).length >= nf
                     && [...document.querySelectorAll('iframe.gna-view')].filter(f => f.contentDocument
                          && f.contentDocument.querySelector('.cv-widget > *, .js-plotly-plot')).length >= nv""",
                arg=[n_figures, n_views], timeout=60_000)
            seen = page.evaluate("""() => ({
                plots: document.querySelectorAll('.js-plotly-plot').length,
                drawn: [...document.querySelectorAll('.js-plotly-plot')].filter(
                    gd => gd.querySelector('svg.main-svg') && gd._fullData && gd._fullData.length > 0
                          && gd.getBoundingClientRect().height > 100).length,
                views: document.querySelectorAll('iframe.gna-view').length})""")
            defects = page.evaluate(PAGE_DEFECTS)
            page.screenshot(path=str(shot))
        finally:
            browser.close()
    print(f"{out.name}: {seen}; screenshot {shot}")
    assert seen == {"plots": n_figures, "drawn": n_figures, "views": n_views}, (seen, n_figures, n_views)
    assert not defects, defects
    assert not [e for e in errors if "Plotly" in e or "CircuitsVis" in e], errors
