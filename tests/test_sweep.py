"""`gna sweep` / `experiments.sweep.sweep` on the zoo Transformer: every point is the accuracy `evaluate`
gives under `ablate`, the random draws are the same heads at every size, the folder round-trips, an
interrupted sweep resumes without redoing finished points, and bad input is refused before any work."""

from __future__ import annotations

import json

import numpy as np
import pytest

import gna_interp as gna
from gna_interp.bootstrap import N_BOOTSTRAP, paired_bootstrap
from gna_interp.cli import main
from gna_interp.errors import HeadError, InputError
from gna_interp.experiments.sweep import COLUMNS, CKPT, Sweep, sweep
from gna_interp.models import zoo_names

pytestmark = pytest.mark.skipif("transformer-kv" not in zoo_names(), reason="the zoo Transformer is not installed")

PAIRS = (6, 12)
SAMPLES = 8


@pytest.fixture(scope="module")
def model():
    return gna.load_model("zoo:transformer-kv", device="cpu")


@pytest.fixture(scope="module")
def circuit_dir(model, tmp_path_factory):
    """A small circuit of the zoo Transformer (exact scan, no control), saved as a `gna scan` folder."""
    task = gna.KVRetrieval(6, 8, seed=5, max_value=9, words=model.kv_words)
    circuit = gna.discover(model, task, strategy="exact", k=2, seeds=1, control=False, n_cards=0, progress=False)
    return circuit.save(tmp_path_factory.mktemp("circuit"))


@pytest.fixture(scope="module")
def result(model, circuit_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    res = sweep(model, PAIRS, circuit_dir, k=2, seeds=3, samples=SAMPLES, seed=3, out=out, progress=False, png=False)
    return res, out


def test_every_point_equals_evaluate_under_ablate(model, result):
    res, _ = result
    assert list(res.table.columns) == COLUMNS
    assert len(res.table) == len(PAIRS) * (3 + 3)
    for n in PAIRS:
        task = gna.KVRetrieval(n, SAMPLES, seed=3, max_value=99, words=model.kv_words)
        for _, row in res.table[res.table["pairs"] == n].iterrows():
            heads = [h for h in row["heads"].split(",") if h]
            if heads:
                with gna.ablate(model, heads):
                    ev = gna.evaluate(model, task, progress=False)
            else:
                ev = gna.evaluate(model, task, progress=False)
            assert row["accuracy"] == pytest.approx(ev.accuracy, abs=1e-6), (n, row["condition"], heads)
            assert row["logit_diff"] == pytest.approx(ev.scores.metrics["logit_diff"], abs=1e-3)
            assert row["chance"] == pytest.approx(1 / n)


def test_conditions_and_draws(result, circuit_dir):
    res, _ = result
    circuit = gna.Circuit.load(circuit_dir)
    assert [h.name for h in res.heads] == [h.name for h in circuit.heads[:2]]
    t = res.table
    for n in PAIRS:
        at = t[t["pairs"] == n].set_index(["condition", "seed"])
        assert at.loc[("intact", 0), "heads"] == ""
        assert at.loc[("top1", 0), "heads"] == res.heads[0].name
        assert at.loc[("topk", 0), "heads"] == ",".join(h.name for h in res.heads)
    draws = t[t["condition"] == "random"].groupby("seed")["heads"].agg(set)
    assert all(len(s) == 1 for s in draws), "a seed's random heads differ between sizes"
    for d in res.random:
        assert len(d) == 2 and not set(d) & set(res.heads)
    assert len({tuple(d) for d in res.random}) > 1  # three seeds, not one draw repeated
    b = res.by_pairs()
    assert list(b["pairs"]) == list(PAIRS)
    assert (b["drop_topk"] == b["intact"] - b["topk"]).all()
    assert res.metrics["drop_topk"] == pytest.approx(b["drop_topk"].mean())
    # the zoo Transformer's G&A heads carry its retrieval: removing them costs far more than random heads
    assert res.metrics["drop_top1"] > 0.5 and res.metrics["drop_topk"] > res.metrics["drop_random"] + 0.3


def test_folder_round_trip(result):
    res, out = result
    for f in ("sweep.csv", "sweep.json", "report.html", CKPT):
        assert (out / f).is_file(), f
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["format"] == "sweep" and doc["format_version"] == 1 and len(doc["table"]) == len(res.table)
    again = Sweep.load(out)
    assert again.heads == res.heads and again.random == res.random and again.pairs == res.pairs
    assert again.by_pairs().round(9).equals(res.by_pairs().round(9))
    page = (out / "report.html").read_text()
    assert "Accuracy by dictionary size" in page and "plotly" in page.lower()
    fig = res.figure()
    names = [tr.name for tr in fig.data]
    assert "intact" in names and any(n.startswith("top-1 removed") for n in names)
    assert any(n and "median" in n for n in names) and any(n and "min-max" in n for n in names)


def test_resume_skips_finished_points(model, circuit_dir, tmp_path):
    seen: list[str] = []

    def stop_after_three(row):
        seen.append(f"{row['pairs']}/{row['condition']}/{row['seed']}")
        if len(seen) == 3:
            raise KeyboardInterrupt

    kw = dict(k=2, seeds=2, samples=4, seed=1, progress=False, png=False)
    with pytest.raises(KeyboardInterrupt):
        sweep(model, (6, 8), circuit_dir, out=tmp_path, on_point=stop_after_three, **kw)
    with pytest.raises(InputError, match="--resume continues it"):
        sweep(model, (6, 8), circuit_dir, out=tmp_path, **kw)
    with pytest.raises(InputError, match="different run"):
        sweep(model, (6, 8), circuit_dir, out=tmp_path, resume=True, **{**kw, "samples": 5})
    later: list[str] = []
    res = sweep(model, (6, 8), circuit_dir, out=tmp_path, resume=True, on_point=lambda r: later.append(
        f"{r['pairs']}/{r['condition']}/{r['seed']}"), **kw)
    assert not set(seen) & set(later) and len(seen) + len(later) == len(res.table) == 2 * 5
    whole = sweep(model, (6, 8), circuit_dir, **kw)
    assert res.table.drop(columns="heads").round(9).equals(whole.table.drop(columns="heads").round(9))
    fresh = sweep(model, (6, 8), circuit_dir, out=tmp_path, fresh=True, on_point=lambda r: later.append("x"), **kw)
    assert later.count("x") == 10 and len(fresh.table) == 10


def test_discovers_when_no_circuit_given(model, tmp_path):
    res = sweep(model, (6,), None, k=2, seeds=1, samples=4, out=tmp_path, progress=False, png=False)
    assert (tmp_path / "circuit" / "circuit.json").is_file() and "discovered on kv10-" in res.source
    assert "the form chosen as gna scan chooses it" in res.source
    circuit = gna.Circuit.load(tmp_path / "circuit")
    assert circuit.task["args"]["seed"] == 1  # held out: seed + 1
    assert circuit.calibration is not None and circuit.task["name"] == circuit.calibration.rows[circuit.calibration.chosen].task
    assert res.heads == circuit.heads[:2]


@pytest.mark.parametrize("kw, match", [
    (dict(pairs="6,x"), "comma-separated integers"),
    (dict(pairs=[6, 1]), "integers >= 2"),
    (dict(pairs=[6, 6]), "more than once"),
    (dict(pairs=[6, 120]), "raise max_value"),
    (dict(pairs=[6, 70], max_value=99), "word list has 64"),
    (dict(pairs=[6], seeds=0), "seeds must be an integer >= 1"),
    (dict(pairs=[6], template="chat"), "unknown template"),
])
def test_bad_input_is_refused(model, circuit_dir, kw, match):
    with pytest.raises(InputError, match=match):
        sweep(model, circuit=circuit_dir, samples=2, progress=False, **kw)


def test_cli(circuit_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["sweep", "--model", "zoo:transformer-kv", "--circuit", str(circuit_dir), "--pairs", "8,6", "--samples", "4",
            "--top-k", "2", "--seeds", "2", "--out", str(out), "--no-png"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "pairs  intact   top1  top-k" in text and f"wrote {out / 'sweep.csv'}" in text
    assert Sweep.load(out).pairs == [6, 8]
    assert main(args) == 2
    assert "--resume continues it" in capsys.readouterr().err
    assert main(args + ["--resume"]) == 0
    for bad, msg in ((["--pairs", "1,5"], "sizes must be at least 2"), (["--pairs", "5,5"], "given more than once"),
                     (["--pairs", "10,120"], "raise --max-value"),
                     (["--circuit", str(tmp_path / "none")], "does not exist"),
                     (["--top-k", "0"], "must be at least 1")):
        code = main(["sweep", "--model", "zoo:transformer-kv", "--out", str(tmp_path / "bad"), *bad])
        assert code == 2 and msg in capsys.readouterr().err, bad
    assert not (tmp_path / "bad").exists()


def test_cli_interrupt_says_how_to_resume(circuit_dir, tmp_path, capsys, monkeypatch):
    from gna_interp.engine import replay

    real, calls = replay.SetAblation.run, []

    def stop_on_third(self, heads):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(self, heads)

    monkeypatch.setattr(replay.SetAblation, "run", stop_on_third)
    out = tmp_path / "out"
    args = ["sweep", "--model", "zoo:transformer-kv", "--circuit", str(circuit_dir), "--pairs", "6", "--samples", "4",
            "--top-k", "2", "--seeds", "1", "--out", str(out), "--no-png"]
    assert main(args) == 130
    err = capsys.readouterr().err
    assert "interrupted; the finished work is saved in" in err and "--resume" in err
    assert not (out / ".gna.lock").exists()
    monkeypatch.setattr(replay.SetAblation, "run", real)
    assert main(args + ["--resume"]) == 0
    assert len(Sweep.load(out).table) == 4


# ---- single heads (the paper's per-head signatures) and the drop slopes ------------------------------------
SIZES = (4, 8, 12)


def _drops(model, task, heads):
    """Accuracy and logit-difference drops of ``heads`` removed, from ``evaluate`` with and without ``ablate``."""
    clean = gna.evaluate(model, task, progress=False)
    with gna.ablate(model, heads):
        cut = gna.evaluate(model, task, progress=False)
    return (clean.accuracy - cut.accuracy,
            clean.scores.metrics["logit_diff"] - cut.scores.metrics["logit_diff"])


@pytest.fixture(scope="module")
def single(model, circuit_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    res = sweep(model, SIZES, circuit_dir, k=2, seeds=2, samples=SAMPLES, seed=3, heads="gather,aggregate,L1H2",
                out=out, progress=False, png=False)
    return res, out


def test_single_heads_equal_ablate_and_their_slope_is_polyfit(model, circuit_dir, single):
    res, _ = single
    gather, aggregate = gna.Circuit.load(circuit_dir).pair()
    assert res.single == {"gather": gather, "aggregate": aggregate, "L1H2": gna.HeadRef(1, 2)}
    assert "gather L0H3 and aggregate L1H3 from its measured" in res.source or "pattern roles" in res.source
    t, d = res.table, res.drops()
    assert set(t["condition"]) == {"intact", "top1", "topk", "random", "gather", "aggregate", "L1H2"}
    x = np.array(SIZES, dtype=float)
    slopes = res.slopes().set_index("condition")
    for cond, head in res.single.items():
        acc, ld = [], []
        for n in SIZES:
            task = gna.KVRetrieval(n, SAMPLES, seed=3, max_value=99, words=model.kv_words)
            a, lg = _drops(model, task, [head])
            row = d[(d["condition"] == cond) & (d["pairs"] == n)].iloc[0]
            assert row["heads"] == head.name
            assert row["drop"] == pytest.approx(a, abs=1e-6), (cond, n)
            assert row["ld_drop"] == pytest.approx(lg, abs=1e-3), (cond, n)
            assert res.by_pairs().set_index("pairs").loc[n, f"drop_{cond}"] == pytest.approx(a, abs=1e-6)
            acc.append(a)
            ld.append(lg)
        s = slopes.loc[cond]
        assert s["drop_slope_per_10"] == pytest.approx(10 * np.polyfit(x, acc, 1)[0], abs=1e-6)
        assert s["ld_drop_slope_per_10"] == pytest.approx(10 * np.polyfit(x, ld, 1)[0], abs=1e-3)
        assert s["drop_mean"] == pytest.approx(np.mean(acc), abs=1e-6)
        assert res.metrics[f"drop_{cond}_slope_per_10"] == pytest.approx(s["drop_slope_per_10"])
        for pre in ("", "ld_"):  # a bootstrap interval was drawn, and it is an interval
            assert s[f"{pre}drop_slope_lo"] <= s[f"{pre}drop_slope_hi"]
            assert s[f"{pre}trend"] in ("grows", "shrinks", "flat")
    # the gather head is the top-1 head here: one head set, measured once, the same numbers
    top1 = t[t["condition"] == "top1"].reset_index(drop=True)
    g = t[t["condition"] == "gather"].reset_index(drop=True)
    assert (top1["heads"] == g["heads"]).all() and top1["accuracy"].equals(g["accuracy"])


def test_slope_intervals_resample_the_prompts(single):
    res, _ = single
    a, b = res.slopes(), res.slopes()
    assert a.equals(b)  # seeded: the same interval every time
    none = res.slopes(resamples=0)
    assert none["drop_slope_lo"].isna().all() and (none["trend"] == "").all()
    assert none["drop_slope_per_10"].equals(a["drop_slope_per_10"])
    # the interval is a bootstrap of the per-prompt differences: recompute one by hand
    s = res.settings["seed"]
    x = np.array(res.pairs, dtype=float)
    w = (x - x.mean()) / ((x - x.mean()) ** 2).sum() * 10
    idx = {n: paired_bootstrap(SAMPLES, N_BOOTSTRAP, s + j).numpy() for j, n in enumerate(res.pairs)}
    cols = []
    for n in res.pairs:
        base = np.array(res.per_sample[f"{n}/intact/0"]["correct"], dtype=float)
        cut = np.array(res.per_sample[f"{n}/aggregate/0"]["correct"], dtype=float)
        cols.append((base - cut)[idx[n]].mean(-1))
    lo, hi = np.percentile(np.stack(cols, axis=1) @ w, [2.5, 97.5])
    row = a.set_index("condition").loc["aggregate"]
    assert row["drop_slope_lo"] == pytest.approx(lo) and row["drop_slope_hi"] == pytest.approx(hi)


def test_single_heads_in_summary_figures_and_folder(single):
    res, out = single
    text = res.summary()
    assert "pairs  intact   top1  top-k" in text and "single heads removed" in text
    assert "gather L0H3" in text and "aggregate L1H3" in text and "drop slope per 10 pairs" in text
    assert "95% bootstrap interval over the prompts, 2000 resamples" in text
    names = [tr.name for tr in res.figure().data]
    assert "gather L0H3 removed" in names and "L1H2 removed" in names
    drop_names = [tr.name for tr in res.drop_figure().data if tr.showlegend is not False]
    assert any(n.startswith("aggregate L1H3: accuracy ") and "per 10 pairs" in n and "[" in n for n in drop_names)
    assert len(drop_names) == len(res.conditions())
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["single"] == {"gather": "L0H3", "aggregate": "L1H3", "L1H2": "L1H2"}
    assert [r["condition"] for r in doc["slopes"]] == ["top1", "topk", "random", "gather", "aggregate", "L1H2"]
    assert len(doc["per_sample"]["4/gather/0"]["correct"]) == SAMPLES
    assert "Drop slope over dictionary size" in (out / "report.html").read_text()
    again = Sweep.load(out)
    assert again.single == res.single and again.per_sample == res.per_sample
    assert again.slopes().round(9).equals(res.slopes().round(9))


def test_named_heads_without_a_circuit_discover_nothing(model, tmp_path):
    res = sweep(model, (4, 8), None, heads=["L0H3", "L1H3"], samples=4, out=tmp_path, progress=False, png=False)
    assert not (tmp_path / "circuit").exists() and "no circuit" in res.source
    assert res.heads == [] and res.random == [] and res.conditions() == ["L0H3", "L1H3"]
    assert sorted(set(res.table["condition"])) == ["L0H3", "L1H3", "intact"]
    assert list(res.slopes()["condition"]) == ["L0H3", "L1H3"]
    assert "L0H3" in res.summary() and "top1  top-k" not in res.summary()
    Sweep.load(tmp_path).figure()


def test_single_heads_resume(model, circuit_dir, tmp_path):
    seen: list[str] = []

    def stop_after_four(row):
        seen.append(f"{row['pairs']}/{row['condition']}")
        if len(seen) == 4:
            raise KeyboardInterrupt

    kw = dict(k=2, seeds=1, samples=4, seed=1, progress=False, png=False, heads="aggregate,L1H2")
    with pytest.raises(KeyboardInterrupt):
        sweep(model, (4, 6), circuit_dir, out=tmp_path, on_point=stop_after_four, **kw)
    with pytest.raises(InputError, match="different run"):
        sweep(model, (4, 6), circuit_dir, out=tmp_path, resume=True, **{**kw, "heads": "L1H2"})
    res = sweep(model, (4, 6), circuit_dir, out=tmp_path, resume=True, **kw)
    assert len(res.table) == 2 * 6 and len(res.per_sample) == 12
    whole = sweep(model, (4, 6), circuit_dir, **kw)
    assert res.slopes().round(9).equals(whole.slopes().round(9))


def test_single_heads_of_an_ssm(tiny_models):
    m = tiny_models["mamba2"]
    res = sweep(m, (3, 5), None, heads="L1S0,L0S2", samples=4, max_value=9, progress=False)
    for n in (3, 5):
        task = gna.KVRetrieval(n, 4, seed=0, max_value=9, words=m.kv_words)
        for h in ("L1S0", "L0S2"):
            a, lg = _drops(m, task, [h])
            row = res.drops().set_index(["condition", "pairs"]).loc[(h, n)]
            assert row["drop"] == pytest.approx(a, abs=1e-6) and row["ld_drop"] == pytest.approx(lg, abs=1e-3)


@pytest.mark.parametrize("heads, err, match", [
    ("L1X2", HeadError, "malformed head name 'L1X2'"),
    ("L0H3,L0H3", HeadError, "L0H3 is named twice"),
    ("gather,Gather", HeadError, "gather is named twice"),
    ("L0H3,", HeadError, "empty name between commas"),
    ("", HeadError, "no head"),
    ("L5H0", HeadError, "layer 5"),
    ("L1H4", HeadError, "L1H4 is out of range"),
    ("L0S1", HeadError, "L0S1"),
])
def test_bad_heads_are_refused(model, circuit_dir, heads, err, match):
    with pytest.raises(err, match=match):
        sweep(model, (4,), circuit_dir, heads=heads, samples=2, progress=False)


def test_role_words_need_a_pair(model, circuit_dir, monkeypatch):
    monkeypatch.setattr(gna.Circuit, "pair", lambda self, pool=20: None)
    with pytest.raises(InputError, match="gather/aggregate pair.*has none"):
        sweep(model, (4,), circuit_dir, heads="gather", samples=2, k=2, seeds=1, progress=False)
    with pytest.raises(InputError, match="bootstrap must be >= 0"):
        sweep(model, (4,), circuit_dir, heads="L0H3", bootstrap=-1)


def test_cli_heads(circuit_dir, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["sweep", "--model", "zoo:transformer-kv", "--circuit", str(circuit_dir), "--pairs", "4,8", "--samples", "4",
            "--top-k", "2", "--seeds", "1", "--heads", "gather,aggregate,L1H2", "--bootstrap", "200", "--out", str(out),
            "--no-png"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "single heads removed" in text and "200 resamples" in text and "aggregate L1H3" in text
    res = Sweep.load(out)
    assert list(res.single) == ["gather", "aggregate", "L1H2"] and res.settings["bootstrap"] == 200
    bad = tmp_path / "bad"
    for heads, msg in (("L1X2", "malformed head name 'L1X2'"), ("L0H3,L0H3", "named twice"),
                       ("L9H0", "layer 9")):
        code = main(["sweep", "--model", "zoo:transformer-kv", "--circuit", str(circuit_dir), "--pairs", "4",
                     "--samples", "2", "--heads", heads, "--out", str(bad), "--no-png"])
        assert code == 2 and msg in capsys.readouterr().err, heads
        assert not (bad / CKPT).exists()
