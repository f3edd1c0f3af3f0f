"""G&A role scores: the formulas on hand-made patterns, the labelling rule, and real patterns."""

from __future__ import annotations

import math

import pytest
import torch

from gna_interp.circuits.scan.offsets import pick_offset, reach, shifted_items
from gna_interp.circuits.scan.roles import (ROLE_COLUMNS, SCORE_COLUMNS, RoleRule, _sample_scores, decision_inputs, offset_scores,
                                      role_scores)
from gna_interp.errors import InputError
from gna_interp.mixing import patterns
from gna_interp.tasks import KVRetrieval, Task
from gna_interp.tasks.base import Sample
from gna_interp.tasks.segments import Span

TASK = KVRetrieval(n_pairs=3, n_samples=3, max_value=20, seed=2)


def test_scores_of_a_hand_made_gather_and_aggregate_pattern():
    # 10 tokens: segment A = 1..3 (summary 3), segment B = 4..7 (summary 7), final = 9, gold = B.
    items = (Span(1, 4), Span(4, 8))
    n = 10
    p = torch.zeros(2, n, n)
    for t in range(n):
        p[:, t, t] = 1.0  # default: attend to self
    # head 0 gathers: summary 3 -> 1, 2 (0.4 + 0.4) + self 0.2; summary 7 -> 4, 5, 6 (0.3 each) + self 0.1
    p[0, 3] = 0
    p[0, 3, [1, 2, 3]] = torch.tensor([0.4, 0.4, 0.2])
    p[0, 7] = 0
    p[0, 7, [4, 5, 6, 7]] = torch.tensor([0.3, 0.3, 0.3, 0.1])
    # head 1 aggregates: final 9 -> 0.6 on B's summary, 0.1 on B's first token, 0.1 on A's summary, 0.2 on 8
    p[1, 9] = 0
    p[1, 9, [7, 4, 3, 8]] = torch.tensor([0.6, 0.1, 0.1, 0.2])
    s = _sample_scores(p, items, gold=1, final=9)
    gather, prev, width, agg, to_summ, to_items, share, select, sharp = s.T.tolist()
    assert width == [pytest.approx(3.5)] * 2  # segments of 3 and 4 tokens
    assert gather[0] == pytest.approx((0.8 + 0.9) / 2) and prev[0] == pytest.approx((0.4 + 0.3) / 2)
    assert gather[1] == pytest.approx(0.0) and agg[0] == pytest.approx(0.0)
    assert agg[1] == pytest.approx(0.7) and to_summ[1] == pytest.approx(0.7) and to_items[1] == pytest.approx(0.8)
    assert share[1] == pytest.approx(0.7 / 0.8) and select[1] == pytest.approx((0.7 / 0.8 - 0.5) / 0.5)
    q = torch.tensor([0.1, 0.7]) / 0.8
    assert sharp[1] == pytest.approx(1 + float((q * q.log()).sum()) / math.log(2), abs=1e-6)
    rule = RoleRule()
    names = SCORE_COLUMNS
    assert rule.label(dict(zip(names, s[0].tolist()))) == "gather"
    assert rule.label(dict(zip(names, s[1].tolist()))) == "aggregate"


@pytest.mark.parametrize("scores,role", [
    ({"aggregate": 0.5, "selectivity": 0.9, "gather": 0.9, "gather_prev": 0.1}, "aggregate"),  # aggregate wins
    ({"aggregate": 0.5, "selectivity": 0.1, "gather": 0.1, "gather_prev": 0.0}, "other"),      # not selective
    ({"aggregate": 0.1, "selectivity": 0.9, "gather": 0.6, "gather_prev": 0.2}, "gather"),
    ({"aggregate": 0.0, "selectivity": 0.0, "gather": 0.9, "gather_prev": 0.85}, "other"),     # previous-token head
    ({"aggregate": 0.0, "selectivity": 0.0, "gather": 0.2, "gather_prev": 0.0}, "other"),
    # two-token lines (key, value): the adjacent token is the whole line, so no spread test
    ({"aggregate": 0.0, "selectivity": 0.0, "gather": 0.9, "gather_prev": 0.9, "line_tokens": 2.0}, "gather"),
    ({"aggregate": 0.0, "selectivity": 0.0, "gather": 0.9, "gather_prev": 0.9, "line_tokens": 5.0}, "other"),
    ({"aggregate": 0.0, "selectivity": 0.0, "gather": 0.2, "gather_prev": 0.2, "line_tokens": 2.0}, "other"),
])
def test_role_rule(scores, role):
    assert RoleRule().label(scores) == role


def test_role_scores_match_the_patterns_they_come_from(tiny_models):
    model = tiny_models["llama"]
    df = role_scores(model, TASK, n_samples=3, batch_size=2)
    assert list(df.columns) == ["layer", "head", "kind"] + ROLE_COLUMNS
    assert len(df) == len(model.heads())
    for c in ["gather", "gather_prev", "aggregate", "to_summaries", "to_items", "gold_share", "sharpness"]:
        assert df[c].between(-1e-6, 1 + 1e-6).all(), c
    assert df["selectivity"].between(-1 / (3 - 1) - 1e-6, 1 + 1e-6).all()  # 3 segments: chance 1/3
    assert (df["gather_prev"] <= df["gather"] + 1e-6).all() and (df["aggregate"] <= df["to_items"] + 1e-6).all()
    # recompute one head's aggregate score straight from `patterns`, one sample at a time
    want = 0.0
    for s, ids in zip(TASK.samples, decision_inputs(model, TASK.samples)):
        seg = s.segments(model.tokenizer)
        row = patterns(model, torch.tensor([ids]), heads=["L2H1"]).sample(0, ["L2H1"])[0, -1]
        gold = seg.items[s.gold]
        want += float(row[gold.start:gold.stop].sum()) / len(TASK)
    assert df.set_index("name").loc["L2H1", "aggregate"] == pytest.approx(want, abs=1e-5)


def test_decision_position_is_where_the_candidates_part(tiny_models):
    import os.path

    model = tiny_models["llama"]  # byte-level tokenizer: one token per character, " 12" is " ", "1", "2"
    tok = model.tokenizer
    for template in ("official", "completion"):
        task = KVRetrieval(n_pairs=3, n_samples=4, max_value=20, seed=2, template=template)
        for s, ids in zip(task.samples, decision_inputs(model, task.samples)):
            shared = os.path.commonprefix(list(s.candidates))[: min(map(len, s.candidates)) - 1]
            assert ids == tok(s.prompt)["input_ids"] + (tok(shared)["input_ids"] if shared else [])
        if template == "official":
            assert all(c.startswith(" ") for s in task.samples for c in s.candidates)  # so " " is always fed


def test_role_scores_for_ssm_heads(tiny_models):
    df = role_scores(tiny_models["bamba"], TASK, n_samples=2)
    assert set(df["kind"]) == {"ssm2", "attn"} and df["role"].isin(["gather", "aggregate", "other"]).all()
    assert df[["gather", "aggregate", "sharpness"]].notna().all().all()
    ch = role_scores(tiny_models["mamba"], TASK, heads=["L1C0+8", "L0C3"], n_samples=2)
    assert ch["name"].tolist() == ["L1C0+8", "L0C3"]


def test_role_scores_refuse_bad_input(tiny_models):
    model = tiny_models["llama"]
    with pytest.raises(InputError, match="needs a Task"):
        role_scores(model, ["just a prompt"])
    plain = Task("plain", [Sample("Hello there, the answer is", (" A", " B"), 0)])
    with pytest.raises(InputError, match="no segments"):
        role_scores(model, plain)
    with pytest.raises(InputError, match="n_samples"):
        role_scores(model, TASK, n_samples=0)


def test_pick_offset_prefers_the_literal_reading():
    assert pick_offset({0: 0.5, 1: 0.52, 2: 0.3}) == 0  # within 10% of the best: the smaller offset wins
    assert pick_offset({0: 0.1, 1: 0.6, 2: 0.62}) == 1
    assert pick_offset({0: math.nan, 1: 0.2}) == 1 and pick_offset({}) == 0


def test_offset_scores_read_the_shifted_lines(tiny_models):
    """Offsets 0..reach of an SSM head, each recomputed by hand from the pattern with the lines moved."""
    model = tiny_models["bamba"]
    head = "L0S1"
    assert reach(model, head) == model.hf_module(model.layer_spec(0, "ssm2").bridge_path).conv_kernel_size - 1
    per = offset_scores(model, TASK, heads=[head], n_samples=3).set_index("offset")
    assert list(per.index) == list(range(reach(model, head) + 1)) and (per["n_scored"] == 3).all()
    for d in per.index:
        want = {"gather": 0.0, "aggregate": 0.0, "summary_aggregate": 0.0}
        for s, ids in zip(TASK.samples, decision_inputs(model, TASK.samples)):
            pat = patterns(model, torch.tensor([ids]), heads=[head]).sample(0, [head])[0].float()
            p = pat.abs() / pat.abs().sum(-1, keepdim=True)
            items = shifted_items(s.segments(model.tokenizer), int(d))
            want["gather"] += sum(float(p[sp.summary, sp.start:sp.summary].sum()) for sp in items) / len(items) / 3
            want["aggregate"] += float(p[-1, items[s.gold].start:items[s.gold].stop].sum()) / 3
            want["summary_aggregate"] += float(p[-1, items[s.gold].summary]) / 3
        for c, v in want.items():
            assert per.loc[d, c] == pytest.approx(v, abs=1e-5), (d, c)
    roles = role_scores(model, TASK, heads=[head], n_samples=3).iloc[0]
    assert roles["offset"] in per.index
    assert roles["aggregate"] == pytest.approx(per.loc[roles["offset"], "aggregate"])
    literal = role_scores(model, TASK, heads=[head], n_samples=3, offset=0).iloc[0]
    assert literal["offset"] == 0 and literal["gather"] == pytest.approx(per.loc[0, "gather"])


def test_attention_only_models_are_read_at_the_literal_summaries(tiny_models):
    df = role_scores(tiny_models["llama"], TASK, n_samples=2)
    assert (df["offset"] == 0).all()


def test_smooth_rule_for_ssm_heads():
    sc = {"aggregate": 0.26, "selectivity": 0.22, "gather": 0.02, "gather_prev": 0.02}
    rule = RoleRule()
    assert rule.label(sc) == "other" and rule.label(sc, smooth=True) == "aggregate"
    assert "min 0.15 for an SSM head" in rule.explain(sc, smooth=True)


def test_zoo_mamba2_aggregate_heads_are_labelled_at_offset_one():
    """The zoo Mamba-2's layer-1 heads (tests/test_mask_cmd.py) select the gold line one token after its end:
    labelled aggregate at offset 1, and ``other`` when read at the literal summaries."""
    from gna_interp import load_model
    from gna_interp.models import zoo_names

    if "mamba2-kv" not in zoo_names():
        pytest.skip("the zoo Mamba-2 is not installed")
    m = load_model("zoo:mamba2-kv", device="cpu")
    agg = ["L1S0", "L1S1", "L1S2", "L1S3", "L1S4", "L1S7"]
    task = KVRetrieval(10, 8, seed=0, max_value=99, words=m.kv_words)
    df = role_scores(m, task, heads=agg + ["L2S0", "L3S4"], n_samples=8).set_index("name")
    assert (df.loc[agg, "role"] == "aggregate").all() and (df.loc[agg, "offset"] == 1).all()
    assert (df.loc[["L2S0", "L3S4"], "role"] == "other").all()
    literal = role_scores(m, task, heads=agg, n_samples=8, offset=0)
    assert (literal["role"] == "other").all() and (literal["selectivity"] < 0.05).all()
