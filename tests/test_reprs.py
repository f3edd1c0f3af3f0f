"""Results display themselves: a short ``repr`` and a static, escaped ``_repr_html_`` for Model, Evaluation,
HeadScan, Circuit, PatternSet and Calibration (their numbers are the objects' own); ``Model.to_str_tokens``
takes text; the BOS convention of ``Model.run_with_cache`` is the tokenizer's and is stated."""

from __future__ import annotations

import copy
import dataclasses
import html
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.html_repr import fmt
from gna_interp.circuits.edges.causal import EDGE_COLUMNS
from gna_interp.errors import InputError
from gna_interp.mixing.pattern_set import PatternSet
from gna_interp.models.model import Model, TokenBatch
from gna_interp.models.spec import ResolvedSpec
from gna_interp.tasks.calibration import Calibration, FormResult
from made_up import made_up_circuit

torch.set_num_threads(1)

HOSTILE = "<script>alert('x')</script>&<b>"
FAMILIES = ["llama", "mamba", "mamba2", "bamba", "jamba"]
TEXT = "The value of the key 'apple' is"


def _safe(page: str) -> None:
    """No hostile markup got through, and it is there escaped."""
    assert "<script" not in page.lower() and HOSTILE not in page
    assert html.escape(HOSTILE, quote=True) in page


def _text(page: str) -> str:
    """The page's text (tags dropped, entities decoded), for looking numbers up."""
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.fixture(scope="module")
def llama(tiny_models) -> Model:
    return tiny_models["llama"]


@pytest.fixture(scope="module")
def circuit(llama):
    return made_up_circuit(llama, llama.heads(), n_cards=0)


# ---- Model ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_model_repr_is_short_and_its_html_counts_every_kind(tiny_models, family):
    m = tiny_models[family]
    assert len(repr(m)) < 200 and m.architecture in repr(m)
    page = m._repr_html_()
    text = _text(page)
    counts = Counter(h.kind for h in m.heads())
    assert m.head_counts() == dict(counts)
    assert m.family and m.family == m.hf_model.config.model_type
    for fact in (m.family, m.architecture, f"{m.n_layers} (", "float32", "cpu"):
        assert fact in text, fact
    rows = re.findall(r"<tr>(.*?)</tr>", page.split("<thead>")[1])
    shown = {}
    for row in rows:
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        if cells:
            shown[cells[0]] = int(cells[5])  # kind, heads are, e.g., layers, per layer, total, layout
    assert shown == dict(counts)


def test_model_html_escapes_its_name(llama):
    m = copy.copy(llama)
    m.source = ResolvedSpec(HOSTILE, "dir", HOSTILE)
    _safe(m._repr_html_())
    assert HOSTILE in repr(m)  # the text form is text: repr quotes it, a console shows it as is


# ---- tokens and BOS ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_to_str_tokens_takes_text_ids_and_lists(tiny_models, family):
    m = tiny_models[family]
    ids = m.tokenize(TEXT).ids
    want = m.to_str_tokens(ids[0])
    assert m.to_str_tokens(TEXT) == want
    assert m.to_str_tokens(ids) == want  # [1, pos]
    assert m.to_str_tokens(ids[0].tolist()) == want
    with pytest.raises(InputError, match="one sequence"):
        m.to_str_tokens(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(InputError, match="holding str"):
        m.to_str_tokens(["a", "b"])


def test_run_with_cache_keeps_the_tokenizers_positions_and_says_so(llama):
    """gna's run_with_cache caches the tokenizer's positions (no BOS of its own); the bridge's prepends one."""
    _, cache = llama.run_with_cache(TEXT, names_filter=lambda n: n == "blocks.0.hook_in")
    n = len(llama.to_str_tokens(TEXT))
    assert cache["blocks.0.hook_in"].shape[1] == n
    assert len(llama.bridge.to_str_tokens(TEXT)) == n + 1  # TransformerLens adds BOS; this tokenizer does not
    doc = " ".join(llama.run_with_cache.__doc__.split())
    assert "BOS" in doc and "Hugging Face tokenizer's own special-token policy" in doc
    guide = " ".join((Path(__file__).resolve().parents[1] / "docs" / "python.md").read_text(encoding="utf-8").split())
    assert "Tokens and BOS" in guide and "19 positions" in guide and "18" in guide


# ---- Evaluation -------------------------------------------------------------------------------------------------


def test_evaluation_html_shows_its_metrics_and_escapes_the_task(llama):
    ev = gna.evaluate(llama, gna.KVRetrieval(n_pairs=3, n_samples=4, seed=0), progress=False)
    assert len(repr(ev)) < 200
    text = _text(ev._repr_html_())
    m = ev.metrics
    for key in ("accuracy", "logit_diff", "gold_prob", "chance"):
        assert fmt(m[key]) in text, key
    frame = ev.to_frame()
    for v in frame["logit_diff"]:
        assert fmt(v) in text
    _safe(dataclasses.replace(ev, task=HOSTILE)._repr_html_())


# ---- HeadScan ---------------------------------------------------------------------------------------------------


def test_head_scan_html_lists_the_top_heads_with_drops_intervals_and_a_heatmap(circuit):
    scan = circuit.scan
    assert len(repr(scan)) < 300
    page = scan._repr_html_()
    text = _text(page)
    df = scan.to_frame()
    top = df.head(10)
    body = page.split("top 10 heads")[1]
    names = [html.unescape(n) for n in re.findall(r"<td[^>]*>(L\d+[A-Z]\d+)</td>", body)]
    assert names[:10] == list(top["name"])
    for _, r in top.iterrows():
        assert f"{fmt(r['drop'])}" in text and f"[{fmt(r['drop_lo'])}, {fmt(r['drop_hi'])}]" in text
    assert fmt(scan.baseline_value) in text
    cells = re.findall(r"<td title='([^']*)'", page)  # one heatmap cell a head, its title the head and drop
    assert sorted(c.split(":")[0] for c in cells) == sorted(h.name for h in scan.heads)
    assert f"{df['name'][0]}: drop {fmt(df['drop'][0])}" in cells
    hostile = copy.copy(scan)
    hostile.model, hostile.task = HOSTILE, HOSTILE
    _safe(hostile._repr_html_())


def test_head_scan_heatmap_names_a_kind_too_wide_to_draw(tiny_models):
    m = tiny_models["jamba"]  # 128 Mamba-1 channels a layer, 4 attention heads
    scan = made_up_circuit(m, m.heads(), n_cards=0).scan
    page = scan._repr_html_()
    cells = re.findall(r"<td title='([^']*)'", page)
    assert sorted(c.split(":")[0] for c in cells) == sorted(h.name for h in m.heads(kind="attn"))
    assert "Mamba-1 channels: not drawn" in _text(page)


# ---- Circuit ----------------------------------------------------------------------------------------------------


def test_circuit_html_shows_baseline_roles_pair_and_curve(circuit):
    assert len(repr(circuit)) < 300
    page = circuit._repr_html_()
    text = _text(page)
    pair = circuit.pair()
    assert pair is not None and f"{pair[0].name} -> {pair[1].name} (from pattern roles" in text
    assert f"accuracy {fmt(circuit.baseline['accuracy'])}" in text
    cs = circuit.curve_summary()
    assert f"top {cs['k']} removed: accuracy {fmt(cs['top'])}" in text
    assert f"median {fmt(cs['random_median'])}" in text
    df = circuit.to_frame().set_index("name")
    body = page.split("top 10 heads of the circuit")[1].split("ablation curve")[0]
    for row in re.findall(r"<tr>(.*?)</tr>", body.split("<tbody>")[1]):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        r = df.loc[cells[1]]
        assert cells[2] == fmt(r["drop"]) and cells[4] == r["role"] and cells[5] == "–"
    assert [h.name for h in circuit.heads[:10]] == re.findall(r"<td[^>]*>(L\d+H\d+)</td>", body)


def test_circuit_html_shows_the_measured_path_and_escapes_everything(circuit):
    c = copy.copy(circuit)
    g, a = circuit.pair()
    c.edges = pd.DataFrame([
        {"edge": f"{g.name}->{a.name}", "sender": g.name, "receiver": a.name, "input": "v", "positions": "items",
         "effect": 0.5, "low": 0.2, "high": 0.8},
        {"edge": f"{a.name}->logits", "sender": a.name, "receiver": "logits", "input": "direct", "positions": "all",
         "effect": 0.7, "low": 0.3, "high": 0.9}], columns=EDGE_COLUMNS)
    path = c.path()
    assert path is not None
    text = _text(c._repr_html_())
    assert (f"{path['sender']} -> {path['receiver']}: measured path v@items, effect {fmt(path['effect'])} "
            f"[{fmt(path['low'])}, {fmt(path['high'])}]") in text
    causal = c.to_frame().set_index("name")["causal_role"]
    assert causal[a.name] in text
    c.model, c.task, c.notes = HOSTILE, {**c.task, "name": HOSTILE}, [HOSTILE]
    _safe(c._repr_html_())


def test_circuit_html_leaves_generic_heads_out_and_shows_the_calibrated_form(circuit):
    """With an LM-loss control one head is generic: named apart, not in the table, its pattern role kept."""
    scan = circuit.scan
    worst = scan.heads[0]
    n = 4

    def per(score: float) -> dict:
        return {"gold_score": torch.full((n,), score, dtype=torch.float64), "n_gold": torch.ones(n, dtype=torch.long)}

    control = gna.HeadScan(scan.model, "neutral", "zero", "logprob", "exact", list(scan.heads), per(-2.0),
                           {h: per(-3.0 if h == worst else -2.001) for h in scan.heads})
    cal = Calibration([FormResult({"template": "completion"}, "kv4-completion", 0.8, 0.25, 16, 60.0, "chosen")], 0)
    c = dataclasses.replace(circuit, control=control, calibration=cal)
    assert [h.name for h in c.generic] == [worst.name]
    page = c._repr_html_()
    text = _text(page)
    assert f"generic, left out {worst.name}" in " ".join(text.split())
    body = page.split("top 10 heads of the circuit")[1].split("ablation curve")[0]
    shown = re.findall(r"<td[^>]*>(L\d+H\d+)</td>", body)
    assert worst.name not in shown and shown == [h.name for h in c.heads[:10]]
    df = c.to_frame().set_index("name")
    assert "LM loss rise" in body and fmt(df.loc[shown[0], "control_drop"]) in body
    assert "kv4-completion (template=completion), chosen of 1 by calibration" in text


# ---- PatternSet -------------------------------------------------------------------------------------------------


def test_pattern_set_repr_is_a_shape_summary_whatever_the_tensors(llama):
    ps = gna.patterns(llama, [TEXT, "hi"], heads=llama.heads())
    assert len(repr(ps)) < 200 and "tensor" not in repr(ps)
    page = ps._repr_html_()
    assert "tensor(" not in page
    for (layer, _), (heads, pat) in ps.by_layer.items():
        assert str(list(pat.shape)) in page
    assert f"{len(ps.heads)}: " in _text(page)
    # a big set: many heads, long sequences (expanded, nothing allocated)
    heads = llama.heads() * 40
    n, t = len(heads), 3000
    big = PatternSet(TokenBatch(torch.zeros(2, t, dtype=torch.long), torch.ones(2, t, dtype=torch.long)),
                     [[HOSTILE] * t, ["x"]], heads, {(0, "attn"): (heads, torch.zeros(1).expand(2, n, t, t))})
    assert len(repr(big)) < 300
    page = big._repr_html_()
    assert len(page) < 5000 and f"[2, {n}, {t}, {t}]" in page
    assert "<script" not in page and html.escape(repr(HOSTILE)) in page


# ---- Calibration ------------------------------------------------------------------------------------------------


def test_calibration_html_marks_the_chosen_form():
    rows = [FormResult({"template": "official", "max_value": 9}, "kv10-official", 0.40, 0.1, 16, 120.0, "solved"),
            FormResult({"template": "completion", "max_value": 99}, HOSTILE, 0.81, 0.01, 16, 140.0, "chosen"),
            FormResult({"template": "official", "max_value": 99}, "kv10-x", 0.05, 0.01, 16, 150.0, "at chance")]
    cal = Calibration(rows, 1, skipped=[{"n_pairs": 20}])
    assert len(repr(cal)) < 300 and "0.810" in repr(cal)
    page = cal._repr_html_()
    _safe(page)
    body = re.findall(r"<tr[^>]*>.*?</tr>", page.split("<tbody>")[1])
    assert len(body) == 3
    assert body[1].startswith("<tr style='font-weight:bold") and "▶ 1" in body[1]
    assert not any("font-weight" in b or "▶" in b for b in (body[0], body[2]))
    for r, b in zip(rows, body):
        assert fmt(r.accuracy) in b and fmt(r.chance) in b and html.escape(r.verdict) in b
    assert "not measured" in _text(page)
