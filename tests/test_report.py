"""The report: built from a scan folder, rendered in real headless Chromium, offline, with every plot drawn."""

from __future__ import annotations

import os
import re
import shutil
from html import escape
from pathlib import Path

import pytest

from gna_interp.cli import main
from gna_interp.circuits import Circuit, card_heads
from gna_interp.errors import InputError
from gna_interp.report import build_report
from gna_interp.viz.export import png_export_problem
from made_up import write_scan_folder

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def hybrid_report(tiny_dirs, tiny_models, tmp_path_factory) -> Path:
    """report.html of a made-up scan of the tiny Bamba hybrid (attention + Mamba-2 heads), PNGs included."""
    folder = write_scan_folder(tmp_path_factory.mktemp("scan"), tiny_models["bamba"], tiny_models["bamba"].heads())
    return build_report(folder, png=png_export_problem() is None)


def test_report_reads_roles_and_embeds_each_bundle_once(hybrid_report):
    html = hybrid_report.read_text(encoding="utf-8")
    assert html.count("var CircuitsVis") == 1 and html.count("CircuitsVis.render(") == 1
    assert html.count("* plotly.js v") == 1  # the library's banner: plotly.js embedded once
    assert html.count("Plotly.newPlot") == 6  # heatmap, curve, stability, two cards, attention-vs-SSM
    for section in ("Model and task", "Where the heads are", "Top heads and their roles", "Ablation curve",
                    "Rank stability", "G&amp;A cards", "Patterns of the top heads", "Attention vs SSM"):
        assert f"<h2>{section}</h2>" in html
    gather, aggregate = Circuit.load(hybrid_report.parent).pair()
    assert f"gather {gather.name}" in html and f"aggregate {aggregate.name}" in html
    assert "accuracy=0.9" in html and "bamba" in html


def test_report_writes_pngs_when_kaleido_works(hybrid_report):
    problem = png_export_problem()
    if problem:
        pytest.skip(f"PNG export unavailable here: {problem}")
    pngs = sorted((hybrid_report.parent / "figures").glob("*.png"))
    assert [p.stem for p in pngs] == ["ablation_curve", "compare", "ga_card_0", "ga_card_1", "heatmap", "stability"]
    for p in pngs:
        assert p.read_bytes()[:8] == PNG_MAGIC and p.stat().st_size > 20_000, p


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_report_renders_offline_in_headless_chromium(hybrid_report):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    console, errors, requests = [], [], []
    shot = hybrid_report.parent / "report.png"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("request", lambda r: requests.append(r.url))
            page.goto(hybrid_report.as_uri(), wait_until="load", timeout=120_000)
            page.wait_for_function(
                "document.querySelectorAll('.js-plotly-plot .main-svg').length >= 10"
                " && document.querySelectorAll('.cv-widget canvas').length >= 1", timeout=120_000)
            drawn = page.evaluate("""() => {
                const plots = [...document.querySelectorAll('.js-plotly-plot')];
                return {
                  plots: plots.length,
                  sized: plots.filter(p => p.getBoundingClientRect().height > 200).length,
                  heatmaps: document.querySelectorAll('.js-plotly-plot .hm image').length,
                  bars: document.querySelectorAll('.js-plotly-plot .bars path').length,
                  lines: document.querySelectorAll('.js-plotly-plot .scatterlayer path.js-line').length,
                  titles: [...document.querySelectorAll('.js-plotly-plot .gtitle')].map(t => t.textContent),
                  canvases: document.querySelectorAll('.cv-widget canvas').length,
                  heads: document.querySelector('.cv-widget').innerText,
                };
            }""")
            page.screenshot(path=str(shot), full_page=True)
        finally:
            browser.close()
    print(f"screenshot: {shot}")
    assert not errors, errors
    assert not [c for c in console if c.startswith("error")], console
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
    assert drawn["plots"] == drawn["sized"] == 6, drawn
    assert drawn["heatmaps"] >= 2 + 2 + 2 and drawn["bars"] >= 8 and drawn["lines"] >= 3, drawn
    assert len(drawn["titles"]) == 6 and all(drawn["titles"]), drawn
    assert drawn["canvases"] >= 1 and "L" in drawn["heads"], drawn
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > 100_000


def test_report_command_rebuilds_everything_with_the_model_out_of_reach(tiny_dirs, tmp_path, capsys):
    """`gna report DIR` draws the full report, cards included, after the model's files are gone."""
    from gna_interp import load_model
    from gna_interp.models.tiny import build_tiny

    model_dir = build_tiny("llama", tmp_path / "llama-copy")
    model = load_model(model_dir, device="cpu")
    folder = write_scan_folder(tmp_path / "scan", model, model.heads())
    shutil.rmtree(model_dir)
    assert main(["report", str(folder), "--no-png"]) == 0
    html = (folder / "report.html").read_text(encoding="utf-8")
    assert "CircuitsVis.render(" in html and html.count("Plotly.newPlot") == 5  # heatmap, curve, stability, 2 cards
    assert "Not drawn" not in html and "G&amp;A card" in html
    bare = write_scan_folder(tmp_path / "bare", model, model.heads(), n_cards=0)
    assert main(["report", str(bare), "--no-png"]) == 0
    assert "Not drawn:" in (bare / "report.html").read_text(encoding="utf-8")


def test_report_needs_a_scan(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "has no scan.csv" in capsys.readouterr().err


@pytest.mark.slow
def test_report_from_a_real_discovery(tiny_models, tmp_path):
    """The files discovery writes (scan.csv with roles, circuit.json) make a full report."""
    from gna_interp.circuits.search.discovery import discover
    from gna_interp.tasks import KVRetrieval

    model, task = tiny_models["llama"], KVRetrieval(n_pairs=4, n_samples=4, seed=1)
    circuit = discover(model, task, strategy="exact", allow_chance=True, k=2, seeds=2, role_samples=2, progress=False)
    folder = circuit.save(tmp_path / "run")
    html = build_report(folder, png=False).read_text(encoding="utf-8")
    assert html.count("Plotly.newPlot") >= 2 and html.count("CircuitsVis.render(") == 1
    best = circuit.to_frame()["name"].iloc[0]
    assert f"<td>{best}</td>" in html and "gold_share" in html
    pair, why = card_heads(circuit.to_frame(), circuit.pair())
    # heatmap, curve, stability, a card per sample, the circuit graph and the graph's edge-click call
    assert escape(why) in html and html.count("Plotly.newPlot") == 7
    assert 'id="gna-graph"' in html and circuit.edges is not None and len(circuit.edges)
    assert f"gather {pair[0].name}, aggregate {pair[1].name}" in html
    # the circuit in hand (as gna scan passes it) draws the same page as the one read back from the folder
    # fresh div ids, and the minute each page was written (the two builds may straddle one)
    uuid = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|cv-[0-9a-f]{12}"
                      r"|\d{4}-\d{2}-\d{2} \d{2}:\d{2}")
    again = build_report(folder, png=False, circuit=circuit).read_text(encoding="utf-8")
    assert uuid.sub("ID", again) == uuid.sub("ID", html) and len(uuid.findall(html)) >= 7
    with pytest.raises(InputError, match="circuit must be the Circuit"):
        build_report(folder, png=False, circuit=str(folder))


@pytest.mark.slow
def test_scan_command_writes_the_report(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "scan"
    assert main(["scan", "--allow-chance", "--model", str(tiny_dirs["llama"]), "--pairs", "3", "--samples", "3", "--strategy", "exact",
                 "--top-k", "1", "--seeds", "1", "--out", str(out)]) == 0
    assert f"wrote {out / 'report.html'}" in capsys.readouterr().out
    html = (out / "report.html").read_text(encoding="utf-8")
    assert html.count("var CircuitsVis") == 1 and "Ablation curve" in html and "G&amp;A card" in html


def test_circuit_json_task_rebuilds_with_its_own_key_words() -> None:
    """A KV task with its own key list (e.g. a zoo model's kv_words) is recorded and rebuilt exactly."""
    import json

    from gna_interp.tasks import KVRetrieval, task_from_dict

    words = ["apple", "river", "stone", "cloud", "lamp"]
    task = KVRetrieval(3, 4, seed=2, words=words)
    spec = json.loads(json.dumps(task.to_dict()))
    assert spec["args"]["words"] == words
    again = task_from_dict(spec)
    assert again.prompts == task.prompts and [s.gold for s in again] == [s.gold for s in task]
    assert KVRetrieval(3, 4, seed=2).to_dict()["args"]["words"] is None  # the shipped list is the default


# ---- a PNG export that hangs or fails does not hang or break the command ------------------------------------

def _fake_child(monkeypatch, code: str) -> None:
    from gna_interp.viz import export

    monkeypatch.setattr(export, "png_export_problem", lambda: None)
    monkeypatch.setattr(export, "_CHILD", code)


def _figure():
    import plotly.graph_objects as go

    return go.Figure(go.Scatter(y=[1, 3, 2]))


def test_a_hung_png_export_is_killed_and_reported(monkeypatch, tmp_path):
    import time

    from gna_interp.viz.export import write_pngs

    pid_file = tmp_path / "pid"
    _fake_child(monkeypatch, f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n")
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"PNG export timed out after 2 s .*the HTML page has the same figures"):
        write_pngs({"a": _figure()}, tmp_path / "figures", timeout=2)
    assert time.monotonic() - t0 < 20
    with pytest.raises(ProcessLookupError):  # the child is gone, not left sleeping
        os.kill(int(pid_file.read_text()), 0)


def test_a_failing_png_export_says_why(monkeypatch, tmp_path):
    from gna_interp.viz.export import write_pngs

    _fake_child(monkeypatch, "import sys\nsys.exit('kaleido: no browser answered')\n")
    with pytest.raises(RuntimeError, match="PNG export failed: kaleido: no browser answered"):
        write_pngs({"a": _figure()}, tmp_path / "figures")


def test_an_experiment_folder_is_written_whole_when_the_png_export_hangs(monkeypatch, tmp_path):
    import pandas as pd

    from gna_interp.experiments.output import ResultFolder
    from gna_interp.viz import export

    _fake_child(monkeypatch, "import time\ntime.sleep(60)\n")
    monkeypatch.setattr("gna_interp.experiments.output.png_export_problem", lambda: None)
    monkeypatch.setattr(export, "PNG_TIMEOUT_S", 1.0)
    monkeypatch.setattr(export, "PNG_TIMEOUT_PER_FIGURE_S", 0.0)
    folder = ResultFolder(tmp_path / "exp", "eval")
    folder.write(pd.DataFrame({"k": [1, 2], "acc": [0.5, 0.25]}), {"note": "demo"}, title="demo",
                 figures={"curve": _figure()})
    page = folder.report.read_text(encoding="utf-8")
    assert "PNG figures not written: PNG export timed out after 1 s" in page and "Plotly.newPlot" in page
    assert folder.load()["frame"]["acc"].tolist() == [0.5, 0.25] and folder.csv.exists()
