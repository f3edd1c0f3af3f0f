"""Figures: score heatmap, ablation curve, G&A card, head comparison, pages (on tiny models and made-up scores)."""

from __future__ import annotations

import math
import os
import shutil
from html import unescape
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from gna_interp import patterns
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.mixing.sharpness import sharpness
from gna_interp.tasks import KVRetrieval
from gna_interp.viz import (HTMLView, ablation_curve, attention_heads, compare_heads, figure_div, ga_card, page,
                            patterns_page, score_heatmap)
from gna_interp.viz.attention import display_rows
from made_up import made_up_curve, made_up_scan

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]
BUNDLE = "var CircuitsVis"  # the circuitsvis bundle's own declaration: present once per page that embeds it


def assert_labelled(fig) -> None:
    """Every figure has a title and every cartesian axis in use has a title (or shares one that has)."""
    assert fig.layout.title.text
    used = {t.xaxis for t in fig.data if getattr(t, "xaxis", None)} | {t.yaxis for t in fig.data if getattr(t, "yaxis", None)}
    for ref in used:
        axis = fig.layout[ref.replace("x", "xaxis", 1) if ref.startswith("x") else ref.replace("y", "yaxis", 1)]
        assert axis.title.text or axis.matches, f"{ref} has no axis title"


def test_heatmap_lays_out_each_kind_in_its_own_panel(tiny_models):
    bamba, mamba = tiny_models["bamba"], tiny_models["mamba"]
    heads = bamba.heads() + [HeadRef(h.layer + 3, h.head, "ssm1", h.width) for h in mamba.heads(channel_group=16)]
    df = made_up_scan(heads)
    df = df[df["name"] != "L0S3"]  # an unscanned head is a gap, not a crash
    fig = score_heatmap(df)
    assert_labelled(fig)
    assert [t.name for t in fig.data] == ["attention heads", "Mamba-2 (SSM) heads", "Mamba-1 channels"]
    attn, ssm2, ssm1 = fig.data
    assert list(fig.layout.yaxis.ticktext) == ["L1"] and list(fig.layout.xaxis.ticktext) == ["H0", "H1", "H2", "H3"]
    assert list(fig.layout.yaxis2.ticktext) == ["L0", "L2"] and fig.layout.xaxis3.ticktext[1] == "C16"
    assert math.isnan(ssm2.z[0][3]) and ssm2.customdata[0][3] == "not scanned"
    top = df.sort_values("rank").iloc[0]
    hover = [c for row in fig.data for line in row.customdata for c in line if c.startswith(f"<b>{top['name']}</b>")]
    assert len(hover) == 1 and "role: aggregate" in hover[0] and "drop: " in hover[0]
    assert any("A#1" in t for tr in fig.data for line in tr.text for t in line)
    assert fig.layout.coloraxis.cmid == 0
    assert fig.layout.title.text.startswith("Ablation drop per head")  # not a panel's title
    assert score_heatmap(df, title="mine").layout.title.text == "mine"


def test_heatmap_rejects_frames_without_head_columns():
    with pytest.raises(InputError, match="lacks columns"):
        score_heatmap(pd.DataFrame({"drop": [1.0]}))
    with pytest.raises(InputError, match="no column 'accuracy_drop'"):
        score_heatmap(made_up_scan([HeadRef(0, 0)]), value="accuracy_drop")


def test_heatmap_accepts_a_result_with_to_frame():
    df = made_up_scan([HeadRef(0, h) for h in range(3)])

    class Result:
        def to_frame(self) -> pd.DataFrame:
            return df

    assert len(score_heatmap(Result()).data) == 1


def test_ablation_curve_shows_top_k_beside_random_spread():
    fig = ablation_curve({"curve": made_up_curve(), "chance": 0.25})
    assert_labelled(fig)
    names = [t.name for t in fig.data]
    assert "top-k discovered heads" in names and "k random heads (median of 3 seeds)" in names
    band = next(t for t in fig.data if t.name == "random: min-max over seeds")
    assert band.fill == "toself" and max(band.y) == pytest.approx(0.9) and min(band.y) == pytest.approx(0.9 - 0.02 * 4 * 2)
    top = next(t for t in fig.data if t.name == "top-k discovered heads")
    assert list(top.y) == pytest.approx([0.9, 0.7, 0.5, 0.3, 0.1]) and "L1H0, L1H1" in top.customdata[2]
    assert any("chance 0.25" in (a.text or "") for a in fig.layout.annotations)
    # the default band (one order at every k, the other draws at the largest k only) says so in its legend
    k = 4  # made_up_curve's largest k
    banded = [r for r in made_up_curve(k) if not (r["series"] == "random" and r["seed"] > 0 and 0 < r["k"] < k)]
    names = [t.name for t in ablation_curve({"curve": banded, "chance": 0.25}).data]
    assert "k random heads (median of 3 seeds; one order at smaller k)" in names


def test_ablation_curve_explains_a_bad_curve():
    with pytest.raises(InputError, match="k, series"):
        ablation_curve({"curve": [{"x": 1}]})
    with pytest.raises(InputError, match="no 'logit_diff' column"):
        ablation_curve(made_up_curve(), metric="logit_diff")


@pytest.fixture(scope="module")
def kv_llama(tiny_models):
    model = tiny_models["llama"]
    task = KVRetrieval(n_pairs=4, n_samples=2, seed=3)
    ps = patterns(model, task.prompts, heads="L0H1,L2H3")  # left-padded batch of two prompts
    return model, task, ps


def test_ga_card_draws_segments_and_final_row_weights(kv_llama):
    model, task, ps = kv_llama
    s = task[1]
    seg = s.segments(model.tokenizer)
    fig = ga_card(ps, "L0H1", "L2H3", seg, sample=1, gold=s.gold, pred=(s.gold + 1) % 4, candidates=s.candidates)
    assert_labelled(fig)
    heat, summ, rest = fig.data
    pat = ps.sample(1, ["L0H1", "L2H3"])
    tokens = ps.str_tokens[1]
    for i, span in enumerate(seg.items):
        cells = [t for t in heat.text[i] if t]
        assert "".join(cells).replace("\\n", "\n") == "".join(tokens[span.start:span.stop])
        assert heat.z[i][0] == pytest.approx(float(pat[0, span.summary, span.start]), abs=1e-6)
        assert summ.x[i] == pytest.approx(float(pat[1, seg.final, span.summary]), abs=1e-6)
        assert summ.x[i] + rest.x[i] == pytest.approx(float(pat[1, seg.final, span.start:span.stop].sum()), abs=1e-6)
    assert summ.marker.color[s.gold] == "#2e8b57" and summ.marker.color[(s.gold + 1) % 4] == "#c0392b"
    assert repr(s.answer) in fig.layout.title.text and "✗" in fig.layout.title.text


def test_ga_card_checks_the_segments_match_the_sample(kv_llama):
    model, task, ps = kv_llama
    with pytest.raises(InputError, match="segments cover"):
        ga_card(ps, "L0H1", "L2H3", task[0].segments(model.tokenizer), sample=1)


def test_compare_heads_reports_sharpness_of_what_it_draws(tiny_models):
    prompt = "Memorize the following dictionary:\napple:12\nriver:7\nThe value of the key 'river' is"
    attn = patterns(tiny_models["llama"], prompt, heads="L1H2")
    ssm = patterns(tiny_models["mamba2"], prompt, heads="L1S3", form="attention")
    fig = compare_heads(attn, "L1H2", ssm, "L1S3")
    assert_labelled(fig)
    left, right, table = fig.data
    assert len(left.x) == len(attn.str_tokens[0]) and len(set(left.x)) == len(left.x)
    shown = display_rows(ssm.sample(0, ["L1S3"]), [HeadRef.parse("L1S3")])[0]
    assert np.allclose(np.asarray(right.z, dtype=float), shown.numpy(), atol=1e-6)
    assert torch.allclose(shown.sum(-1), torch.ones(shown.shape[0]), atol=1e-5)
    expected = sharpness(shown).top1[-1].item()
    rows = dict(zip(table.cells.values[0], table.cells.values[2]))
    assert float(rows["final-row top-1 mass"]) == pytest.approx(expected, abs=1e-3)
    assert "form=attention" in fig.layout.annotations[1].text and "Mamba-2" in fig.layout.annotations[1].text


def test_page_embeds_each_bundle_once(kv_llama):
    _, _, ps = kv_llama
    figs = [figure_div(ablation_curve(made_up_curve())), figure_div(score_heatmap(made_up_scan([HeadRef(0, 1)])))]
    html = page("t", [attention_heads(ps, ["L0H1"]), *figs], circuitsvis=True, plotly=True)
    assert html.count("var CircuitsVis") == 1
    assert html.count("Plotly.newPlot") == 2 and html.count("* plotly.js v") == 1  # the library's banner
    assert "cdn.plot.ly" not in html.split("</head>")[1] and "unpkg.com" not in html


def test_page_adds_the_bundle_an_html_view_needs(kv_llama):
    _, _, ps = kv_llama
    html = page("t", ["<p>intro</p>", attention_heads(ps, ["L0H1"])])  # no circuitsvis=True: the view asks for it
    assert html.count(BUNDLE) == 1 and html.count("CircuitsVis.render(") == 1 and "<p>intro</p>" in html


def test_attention_heads_view_displays_itself(kv_llama):
    _, _, ps = kv_llama
    view = attention_heads(ps, ["L0H1", "L2H3"])
    assert isinstance(view, HTMLView) and view.circuitsvis
    assert str(view) == view.fragment and "CircuitsVis.render(" in view.fragment and BUNDLE not in view.fragment
    shown = view._repr_html_()
    assert shown.startswith("<iframe") and 'srcdoc="' in shown and "<script" not in shown  # all of it is escaped
    doc = unescape(shown.split('srcdoc="', 1)[1].rsplit('"', 1)[0])
    assert doc.startswith("<!DOCTYPE html>") and doc.count(BUNDLE) == 1 and "unpkg.com" not in doc
    assert '"L0H1"' in doc and '"L2H3"' in doc and "CircuitsVis.render(" in doc
    assert "L0H1" in repr(view) and len(repr(view)) < 200  # a short text form for consoles


def test_views_save_standalone_pages(kv_llama, tmp_path):
    _, _, ps = kv_llama
    view = patterns_page(ps, "two heads", ["L0H1", "L2H3"], sample=1, note="a note")
    assert isinstance(view, HTMLView) and view.page().startswith("<!DOCTYPE html>")
    out = view.save(tmp_path / "new" / "p.html")
    assert out == tmp_path / "new" / "p.html" and sorted(p.name for p in out.parent.iterdir()) == ["p.html"]
    html = out.read_text(encoding="utf-8")
    assert html.startswith("<!DOCTYPE html>") and html.count(BUNDLE) == 1 and html.count("CircuitsVis.render(") == 1
    assert "<h1>two heads</h1>" in html and "a note" in html and '"L0H1"' in html and '"L2H3"' in html
    assert "unpkg.com" not in html and "cdn" not in html.split("<body>")[1].lower()
    assert "<body>" not in str(view) and "a note" in str(view)  # str(): the body fragment, for other pages
    again = attention_heads(ps, ["L2H3"]).save(out)  # overwrites in place
    assert again == out and out.read_text(encoding="utf-8").count(BUNDLE) == 1 and '"L0H1"' not in out.read_text()


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
def test_views_render_offline_in_headless_chromium(kv_llama, tmp_path):
    """The saved page and the notebook output (``_repr_html_`` inside a host page) both draw the widget."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    _, _, ps = kv_llama
    saved = patterns_page(ps, "two heads", ["L0H1", "L2H3"]).save(tmp_path / "page.html")
    host = tmp_path / "notebook.html"
    host.write_text("<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>cell</title></head><body>"
                    f"<p>cell output:</p>{attention_heads(ps, ['L0H1', 'L2H3'])._repr_html_()}<p>next cell</p>"
                    "</body></html>", encoding="utf-8")
    widget = """(doc) => {
        const w = doc && doc.querySelector('.cv-widget');
        return w ? {canvases: w.querySelectorAll('canvas').length, text: w.innerText} : null;
    }"""
    errors, requests, drawn = [], [], {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1100, "height": 900})
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("request", lambda r: requests.append(r.url))
            tab.goto(saved.as_uri(), wait_until="load", timeout=120_000)
            tab.wait_for_function("document.querySelectorAll('.cv-widget canvas').length >= 1", timeout=120_000)
            drawn["page"] = tab.evaluate(f"({widget})(document)")
            tab.goto(host.as_uri(), wait_until="load", timeout=120_000)
            tab.wait_for_function("(() => { const f = document.querySelector('iframe.gna-view');"
                                  " const d = f && f.contentDocument;"
                                  " return !!d && d.querySelectorAll('.cv-widget canvas').length >= 1; })()",
                                  timeout=120_000)
            tab.wait_for_timeout(300)  # let the frame fit its height to the drawn widget
            drawn["frame"] = tab.evaluate(f"""() => {{
                const f = document.querySelector('iframe.gna-view');
                return {{...({widget})(f.contentDocument), height: f.getBoundingClientRect().height,
                         content: f.contentDocument.body.getBoundingClientRect().bottom}};
            }}""")
        finally:
            browser.close()
    assert not errors, errors
    assert all(u.startswith(("file:", "data:", "blob:", "about:")) for u in requests), requests
    for where in ("page", "frame"):
        assert drawn[where]["canvases"] >= 1 and "L0H1" in drawn[where]["text"] and "L2H3" in drawn[where]["text"], drawn
    assert drawn["frame"]["height"] >= drawn["frame"]["content"] > 300, drawn  # sized to the widget, not clipped
