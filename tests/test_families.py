"""`gna compare` / `experiments.families.compare` on the zoo Transformer and hybrid: removal costs equal
`evaluate` under `ablate`, aggregation scores equal `role_scores` (unshifted) and a by-hand reading of
the patterns (shifted), the hybrid's aggregation sits in its attention head, the folder round-trips and
an interrupted comparison resumes."""

from __future__ import annotations

import json

import pytest

import gna_interp as gna
from gna_interp.circuits.scan.roles import decision_inputs, role_scores
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.experiments.families import (CKPT, CURVE_COLUMNS, TABLE_COLUMNS, FamilyComparison, aggregation_scores,
                                             compare)
from gna_interp.mixing.sharpness import row_distribution
from gna_interp.models import zoo_names

pytestmark = pytest.mark.skipif(not {"transformer-kv", "hybrid-kv"} <= set(zoo_names()),
                                reason="the zoo Transformer and hybrid are not installed")

KW = dict(k=2, seeds=2, pairs=6, samples=8, seed=2, sharp_samples=4, pool=32, progress=False, png=False)


@pytest.fixture(scope="module")
def models():
    return {n: gna.load_model(f"zoo:{n}", device="cpu") for n in ("transformer-kv", "hybrid-kv")}


@pytest.fixture(scope="module")
def circuits(models, tmp_path_factory):
    """Small circuits (exact scan, no control), saved as `gna scan` folders."""
    out = {}
    for name, m in models.items():
        task = gna.KVRetrieval(6, 8, seed=7, max_value=9, words=m.kv_words)
        c = gna.discover(m, task, strategy="exact", k=2, seeds=1, control=False, n_cards=0, progress=False)
        out[name] = c.save(tmp_path_factory.mktemp(name))
    return out


@pytest.fixture(scope="module")
def result(models, circuits, tmp_path_factory):
    out = tmp_path_factory.mktemp("families")
    ms = [models["transformer-kv"], models["hybrid-kv"]]
    return compare(ms, [circuits["transformer-kv"], circuits["hybrid-kv"]], out=out, **KW), out


def test_costs_equal_evaluate_under_ablate(models, result):
    res, _ = result
    assert list(res.curve.columns) == CURVE_COLUMNS and set(TABLE_COLUMNS) <= set(res.table.columns)
    for name, m in (("zoo:transformer-kv", models["transformer-kv"]), ("zoo:hybrid-kv", models["hybrid-kv"])):
        task = gna.KVRetrieval(6, 8, seed=2, max_value=9, words=m.kv_words)
        intact = gna.evaluate(m, task, progress=False).accuracy
        c = res.curve[res.curve["model"] == name]
        assert len(c) == 3 + 2 * 2  # top j = 0..2, two random orders at j = 1, 2
        for _, r in c.iterrows():
            heads = [h for h in r["heads"].split(",") if h]
            with gna.ablate(m, heads):
                acc = gna.evaluate(m, task, progress=False).accuracy
            assert r["accuracy"] == pytest.approx(acc, abs=1e-6) and r["cost"] == pytest.approx(intact - acc, abs=1e-6)
        row = res.table[res.table["model"] == name].iloc[0]
        assert row["intact"] == pytest.approx(intact)
        assert row["cost_1"] == pytest.approx(c[(c["series"] == "top") & (c["j"] == 1)]["cost"].iloc[0])
        rnd = c[(c["series"] == "random") & (c["j"] == 2)]
        assert row["random_cost_k"] == pytest.approx(rnd["cost"].median())
        top = set(row["top_heads"].split(","))
        assert all(not (set(h.split(",")) & top) for h in rnd["heads"])


def test_unshifted_scores_equal_role_scores(models):
    m = models["transformer-kv"]
    task = gna.KVRetrieval(6, 4, seed=3, max_value=9, words=m.kv_words)
    heads = [h.name for h in m.heads()]
    agg = aggregation_scores(m, task, heads, n_samples=4, shifts=(0,)).per_head.set_index("name")
    roles = role_scores(m, task, heads=heads, n_samples=4).set_index("name")
    for h in heads:
        assert agg.loc[h, "aggregate"] == pytest.approx(roles.loc[h, "aggregate"], abs=1e-5)
        assert agg.loc[h, "to_lines"] == pytest.approx(roles.loc[h, "to_items"], abs=1e-5)
        assert agg.loc[h, "gold_share"] == pytest.approx(roles.loc[h, "gold_share"], abs=1e-5)
        # roles' `sharpness` is 1 - the normalised entropy over the lines
        assert 1 - agg.loc[h, "line_entropy"] == pytest.approx(roles.loc[h, "sharpness"], abs=1e-5)


def test_shifted_scores_by_hand(models):
    """The hybrid's attention head reads each line two tokens late: read the patterns by hand."""
    m = models["hybrid-kv"]
    task = gna.KVRetrieval(6, 4, seed=4, max_value=9, words=m.kv_words)
    res = aggregation_scores(m, task, ["L2H0", "L0S0"], n_samples=4)
    fed = decision_inputs(m, task.samples)
    for name in ("L2H0", "L0S0"):
        d = int(res.per_head.set_index("name").loc[name, "shift"])
        want = []
        for i, s in enumerate(task.samples):
            p = row_distribution(gna.patterns(m, m.pad_ids([fed[i]]), heads=[name]).sample(0, [name]).float())[0, -1]
            f = p.shape[-1] - 1
            lines = [p[min(sp.start + d, f):min(sp.stop + d, f)].sum().item() for sp in s.segments(m.tokenizer).items]
            want.append((lines[s.gold], sum(lines)))
        got = res.per_sample[res.per_sample["name"] == name].sort_values("sample")
        assert list(got["aggregate"]) == pytest.approx([w[0] for w in want], abs=1e-5)
        assert list(got["to_lines"]) == pytest.approx([w[1] for w in want], abs=1e-5)
    row = res.per_head.set_index("name").loc["L2H0"]
    assert row["shift"] == 2 and row["aggregate"] > 0.95 and row["line_entropy"] < 0.05


def test_hybrid_aggregates_in_attention(result):
    res, _ = result
    kinds = res.kinds[res.kinds["model"] == "zoo:hybrid-kv"].set_index("kind")
    assert set(kinds.index) == {"attn", "ssm2"} and kinds.loc["attn", "heads"] == 4 and kinds.loc["ssm2", "heads"] == 24
    assert kinds.loc["attn", "gold_share"] > 0.9 and kinds.loc["ssm2", "gold_share"] < 0.5
    assert kinds.loc["attn", "top_drop"] > 3 * kinds.loc["ssm2", "top_drop"]
    row = res.table.set_index("model").loc["zoo:hybrid-kv"]
    assert row["aggregate_kind"] == "attn" and row["mixers"] == "ssm2 x3 + attn x1"
    assert "attn heads (4): best aggregate L2H0" in res.summary()


def test_folder_round_trip_and_figure(result):
    res, out = result
    for f in ("families.csv", "families_curve.csv", "families_heads.csv", "families_kinds.csv", "families.json",
              "report.html", CKPT):
        assert (out / f).is_file(), f
    doc = json.loads((out / "families.json").read_text())
    assert doc["format"] == "families" and doc["models"] == ["zoo:transformer-kv", "zoo:hybrid-kv"]
    again = FamilyComparison.load(out)
    assert again.models == res.models and again.metrics == res.metrics
    assert again.curve.round(9).equals(res.curve.round(9))
    fig = res.figure()
    assert len({tr.xaxis for tr in fig.data}) == 2  # two panels
    assert {tr.name for tr in fig.data if tr.type == "box"} == set(res.models)
    page = (out / "report.html").read_text()
    assert "Per mixer kind" in page and "L2H0" in page


def test_resume(models, circuits, tmp_path):
    ms = [models["transformer-kv"], models["hybrid-kv"]]
    cs = [circuits["transformer-kv"], circuits["hybrid-kv"]]
    kw = {**KW, "samples": 4, "seeds": 1}
    from gna_interp.engine import replay

    calls = []
    real = replay.SetAblation.run

    def counting(self, heads):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(self, heads)

    replay.SetAblation.run = counting
    try:
        with pytest.raises(KeyboardInterrupt):
            compare(ms, cs, out=tmp_path, **kw)
        with pytest.raises(InputError, match="--resume continues it"):
            compare(ms, cs, out=tmp_path, **kw)
        before = len(calls)
        res = compare(ms, cs, out=tmp_path, resume=True, **kw)
        after = len(calls) - before
    finally:
        replay.SetAblation.run = real
    assert after == len(res.curve) - 3  # one run per curve point (j = 0 is the intact run); 3 were saved
    whole = compare(ms, cs, **kw)
    assert whole.curve.round(9).equals(res.curve.round(9))


@pytest.mark.parametrize("args, match", [
    (dict(models="zoo:transformer-kv"), "two or more models"),
    (dict(models="zoo:transformer-kv,zoo:transformer-kv"), "more than once"),
    (dict(models="zoo:transformer-kv,", ), "empty"),
    (dict(models="zoo:transformer-kv,zoo:hybrid-kv", circuits=[None]), "1 circuits for 2 models"),
    (dict(models="zoo:transformer-kv,zoo:hybrid-kv", pairs=20), "raise max_value"),
    (dict(models="zoo:transformer-kv,zoo:hybrid-kv", pool=0), "pool must be an integer >= 1"),
])
def test_bad_input_is_refused(args, match):
    with pytest.raises(InputError, match=match):
        compare(**args)


def test_cli(circuits, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["compare", "--model", "zoo:transformer-kv,zoo:hybrid-kv", "--circuit",
            f"{circuits['transformer-kv']},{circuits['hybrid-kv']}", "--pairs", "6", "--samples", "4", "--top-k", "2",
            "--seeds", "1", "--sharp-samples", "2", "--out", str(out), "--no-png"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "zoo:hybrid-kv (ssm2 x3 + attn x1, 28 heads)" in text and "wrote" in text
    assert FamilyComparison.load(out).models == ["zoo:transformer-kv", "zoo:hybrid-kv"]
    assert main(args) == 2 and "--resume continues it" in capsys.readouterr().err
    for bad, msg in ((["--model", "zoo:transformer-kv"], "compare needs two or more"),
                     (["--model", "a,,b"], "empty entry"),
                     (["--model", "zoo:transformer-kv,zoo:hybrid-kv", "--circuit", str(circuits["hybrid-kv"])],
                      "1 folders for 2 models"),
                     (["--model", "zoo:transformer-kv,zoo:hybrid-kv", "--circuit", f"{tmp_path / 'x'},"],
                      "does not exist"),
                     (["--model", "zoo:transformer-kv,zoo:hybrid-kv", "--pairs", "30"], "raise --max-value")):
        assert main(["compare", *bad, "--out", str(tmp_path / "bad")]) == 2
        assert msg in capsys.readouterr().err, bad
    assert not (tmp_path / "bad").exists()
