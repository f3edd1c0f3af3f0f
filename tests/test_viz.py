"""Figures: score heatmap, ablation curve, G&A card, head comparison, pages (on tiny models and made-up scores)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from gna_interp import patterns
from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.patterns.sharpness import sharpness
from gna_interp.tasks import KVRetrieval
from gna_interp.viz import ablation_curve, attention_heads, compare_heads, figure_div, ga_card, page, score_heatmap
from gna_interp.viz.attention import display_rows
from made_up import made_up_curve, made_up_scan


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
    assert "top-k discovered heads" in names and "k random heads (mean of 3 seeds)" in names
    band = next(t for t in fig.data if t.name == "random: min-max over seeds")
    assert band.fill == "toself" and max(band.y) == pytest.approx(0.9) and min(band.y) == pytest.approx(0.9 - 0.02 * 4 * 2)
    top = next(t for t in fig.data if t.name == "top-k discovered heads")
    assert list(top.y) == pytest.approx([0.9, 0.7, 0.5, 0.3, 0.1]) and "L1H0, L1H1" in top.customdata[2]
    assert any("chance 0.25" in (a.text or "") for a in fig.layout.annotations)


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
