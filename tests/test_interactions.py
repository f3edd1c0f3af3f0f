"""Pairwise head interactions: pair drops equal a full forward under `ablate`, the matrix, intervals, redundancy,
persistence and the heatmap (on tiny models)."""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

import gna_interp
from gna_interp.circuits import Interactions, head_interactions
from gna_interp.circuits.scan.interactions import interactions
from gna_interp.errors import GnaError, InputError
from gna_interp.tasks import KVRetrieval
from gna_interp.engine import plan_scoring, run_plan
from gna_interp.engine.metrics import get_metric, results
from gna_interp.viz import interaction_heatmap

TASK = KVRetrieval(3, 4, seed=0, max_value=9)
HEADS = {"llama": ["L0H1", "L1H0", "L2H3"], "mamba2": ["L0S1", "L1S0", "L1S3"], "bamba": ["L1H2", "L0S1", "L2S0"]}


@pytest.mark.parametrize("family", sorted(HEADS))
def test_pair_drops_equal_ablate_and_run_plan(models, family):
    """Every single and pair drop (logit diff and accuracy) is what `ablate` + `run_plan` give, to 1e-5; the
    matrix is symmetric with the single drops on its diagonal; the pair table agrees with the matrix."""
    model = models(family)
    res = interactions(model, TASK, HEADS[family], batch_size=2)
    plan = plan_scoring(model, TASK.samples)
    base = results(run_plan(model, plan, batch_size=2))
    heads = model.check_heads(HEADS[family])
    assert res.heads == heads and len(res.pairs) == 3

    def drop(hs, metric="logit_diff"):
        with gna_interp.ablate(model, hs):
            per = results(run_plan(model, plan, batch_size=2))
        m = get_metric(metric)
        return m.value(base) - m.value(per)

    mat = res.matrix()
    assert mat.shape == (3, 3) and torch.equal(mat, mat.T)
    moved = 0.0
    for i, h in enumerate(heads):
        want = drop([h])
        assert abs(res.drop(i) - want) < 1e-5 and abs(float(mat[i, i]) - want) < 1e-5
    for i, j in itertools.combinations(range(3), 2):
        want = drop([heads[i], heads[j]])
        assert abs(res.drop(i, j) - want) < 1e-5
        assert abs(float(mat[i, j]) - (want - res.drop(i) - res.drop(j))) < 1e-5
        assert abs(res.drop(i, j, "accuracy") - drop([heads[i], heads[j]], "accuracy")) < 1e-9
        moved = max(moved, abs(want))
    assert moved > 1e-3, "no pair changed anything: the comparison would be vacuous"

    df = res.to_frame()
    assert list(df.columns) == ["head_i", "head_j", "drop_i", "drop_j", "drop_ij", "interaction", "low", "high", "kind"]
    assert list(zip(df["head_i"], df["head_j"])) == [(heads[i].name, heads[j].name)
                                                     for i, j in itertools.combinations(range(3), 2)]
    for _, r in df.iterrows():
        assert r["low"] <= r["high"]
        assert r["kind"] == ("super-additive" if r["low"] > 1e-9 else "sub-additive" if r["high"] < -1e-9 else "additive")
    assert torch.allclose(torch.tensor(df["interaction"].to_numpy()),
                          torch.tensor([float(mat[i, j]) for i, j in itertools.combinations(range(3), 2)],
                                       dtype=torch.float64))


def test_redundancy_definition_and_round_trip(models):
    """`redundancy` = 1 - Σ pair drops / Σ (drop_i + drop_j); to_dict survives JSON; the heatmap's shape."""
    model = models("llama")
    res = interactions(model, TASK, HEADS["llama"], batch_size=4)
    d = [res.drop(i) for i in range(3)]
    pairs = list(itertools.combinations(range(3), 2))
    want = 1 - sum(res.drop(i, j) for i, j in pairs) / sum(d[i] + d[j] for i, j in pairs)
    if sum(d) > 0:
        assert res.redundancy() == pytest.approx(want)
        assert res.redundancy() == pytest.approx(-sum(float(res.matrix()[i, j]) for i, j in pairs) / (2 * sum(d)))
    else:
        assert math.isnan(res.redundancy())

    back = Interactions.from_dict(json.loads(json.dumps(res.to_dict(), allow_nan=False)))
    assert back.heads == res.heads and torch.allclose(back.matrix(), res.matrix())
    assert back.to_frame().equals(res.to_frame())
    assert "redundancy" in res._repr_html_() and set(res.metrics) >= {"redundancy", "super-additive", "sub-additive"}

    fig = interaction_heatmap(res)
    off, diag = fig.data
    names = [h.name for h in res.heads]
    assert list(off.x) == names and list(off.y) == names
    assert len(off.z) == 3 and all(len(r) == 3 for r in off.z)
    assert all(math.isnan(off.z[i][i]) and diag.z[i][i] == pytest.approx(d[i]) for i in range(3))
    assert off.z[0][1] == off.z[1][0] == pytest.approx(float(res.matrix()[0, 1]))
    assert fig.layout.title.text and off.zmid == 0 and "drop together" in off.customdata[0][1]
    assert interaction_heatmap(res.to_dict(), metric="accuracy").data[0].colorbar.title.text.endswith("(accuracy)")


def test_bad_input(models):
    model = models("llama")
    with pytest.raises(InputError, match="at least 2"):
        interactions(model, TASK, ["L0H1"])
    with pytest.raises(GnaError, match="twice"):
        interactions(model, TASK, ["L0H1", "L0H1"])
    with pytest.raises(InputError, match="format"):
        Interactions.from_dict({"format": "scan"})


def test_a_runner_made_for_another_model_is_refused(models):
    """A SetAblation handed in to reuse its clean prefixes must be one made for the model given: it measures its
    own model, so its numbers would otherwise carry the other model's name (interactions, the curve, delegation)."""
    from gna_interp.circuits.search.curve import ablation_curve
    from gna_interp.engine.replay import Replays, SetAblation

    llama, mamba = models("llama"), models("mamba2")
    other = SetAblation(mamba, TASK)
    assert SetAblation.of(mamba, other) is other  # the same model: reused as it is
    with pytest.raises(InputError, match="made for"):
        interactions(llama, TASK, ["L0H1", "L1H0"], runner=other)
    with pytest.raises(InputError, match="made for"):
        ablation_curve(llama, other, llama.heads()[:2], llama.heads(), k=2)


@pytest.mark.parametrize("family", sorted(HEADS))
@pytest.mark.parametrize("stack", [None, 2])
def test_run_many_equals_each_set_alone(models, family, stack):
    """`SetAblation.run_many` stacks sets that start at different layers (each joining the replay at its earliest
    head) and returns, in the order given, what `run` of each set alone returns, to 1e-5: singles and pairs over
    every layer, a repeated set, the empty set, in one stack or in stacks of two; the stacked run replays fewer
    blocks than the one-by-one runs."""
    from gna_interp.engine import replay as replay_mod
    from gna_interp.engine.replay import Replays, SetAblation

    model = models(family)
    runner = SetAblation(model, TASK, batch_size=2, replays=Replays(stack=stack))
    heads = model.check_heads(HEADS[family])
    sets = [[h] for h in heads] + [[heads[i], heads[j]] for i, j in itertools.combinations(range(3), 2)]
    sets = [sets[-1], [], *sets, sets[0]]
    calls = []
    real = replay_mod.replay

    def counted(model, prefix, start, copies=1, hidden=None, stop=None):
        calls.append(copies)
        return real(model, prefix, start, copies, hidden, stop)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(replay_mod, "replay", counted)
        got = runner.run_many(sets)
        stacked = len(calls)
        calls.clear()
        want = [runner.run(s) for s in sets]
        alone = len(calls)
    assert len(got) == len(sets)
    for g, w in zip(got, want):
        torch.testing.assert_close(g.scores, w.scores, atol=1e-5, rtol=0)
        assert torch.equal(g.correct, w.correct)
    assert torch.equal(got[1].scores, runner.clean().scores)
    assert not torch.equal(want[2].scores, want[1].scores)  # the sets change the scores
    assert stacked < alone  # fewer replays: the sets ran stacked
    with pytest.raises(InputError, match="stack"):
        SetAblation(model, TASK, batch_size=2, replays=Replays(stack=0))
    with pytest.raises(InputError, match="replays must be a Replays"):
        SetAblation(model, TASK, batch_size=2, replays={"stack": 2})
