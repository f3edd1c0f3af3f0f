"""`delegation`: roles per head kind of a hybrid and the cost of removing each kind's aggregate heads, checked
against a brute-force `ablate` + `evaluate` loop on the zoo hybrid (its attention heads aggregate, its SSM heads
do not) and on a tiny random Falcon-H1 with a knowledge task; the folder, the scan report's section, bad input."""

from __future__ import annotations

import contextlib
import json
import statistics

import pandas as pd
import pytest
import torch

from gna_interp import load_model
from gna_interp.circuits import discover
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.scan.delegation import KIND_COLUMNS, REMOVAL_COLUMNS, Delegation, delegation, is_hybrid
from gna_interp.circuits.scan.roles import RoleRule
from gna_interp.errors import InputError
from gna_interp.interventions import ablate
from gna_interp.models import zoo_names
from gna_interp.models.tiny_hybrid import build_tiny_hybrid
from gna_interp.report import build_report
from gna_interp.tasks import KVRetrieval, MultipleChoice, NeutralText, evaluate, lm_loss
from gna_interp.tasks.mmlu import category_questions

needs_zoo = pytest.mark.skipif("hybrid-kv" not in zoo_names(), reason="the zoo hybrid is not installed")


@pytest.fixture(scope="module")
def zoo_hybrid():
    torch.set_num_threads(1)
    m = load_model("zoo:hybrid-kv", device="cpu")
    task = KVRetrieval(6, 8, seed=3, max_value=9, words=m.kv_words)
    return m, task, delegation(m, task, seeds=3)


@pytest.fixture(scope="module")
def falcon(tmp_path_factory):
    return load_model(build_tiny_hybrid("falcon_h1", tmp_path_factory.mktemp("falcon_h1")), device="cpu")


def _brute(model, task, heads, knowledge=None):
    """Accuracy, logit difference (and the knowledge metric) with ``heads`` zero-ablated, one evaluate each."""
    with ablate(model, heads) if heads else contextlib.nullcontext():
        ev = evaluate(model, task, progress=False)
        k = None
        if knowledge is not None:
            kev = evaluate(model, knowledge, progress=False)
            k = lm_loss(kev.scores) if all(len(s.candidates) == 1 for s in knowledge.samples) else kev.accuracy
    return ev.accuracy, float(ev.scores.logit_diff.mean()), k


def _check_removals(model, task, res, knowledge=None):
    for _, r in res.removal.iterrows():
        heads = [h for h in r["heads"].split(",") if h]
        acc, ld, k = _brute(model, task, heads, knowledge)
        assert r["accuracy"] == pytest.approx(acc, abs=1e-6), r["heads"]
        assert r["logit_diff"] == pytest.approx(ld, abs=1e-3), r["heads"]
        if knowledge is not None:
            assert r["knowledge"] == pytest.approx(k, abs=1e-4), r["heads"]
    for _, k in res.kinds.iterrows():
        rows = res.removal[res.removal["kind"] == k["kind"]]
        rnd = rows[rows["series"] == "random"]
        assert len(rnd) == k["random_draws"]
        labelled = res.roles[(res.roles["kind"] == k["kind"]) & (res.roles["role"] == "aggregate")]["name"]
        assert k["aggregate_heads"] == len(labelled)
        if k["aggregate_heads"]:
            agg = rows[rows["series"] == "aggregate"].iloc[0]
            assert set(agg["heads"].split(",")) == set(labelled)
            assert agg["heads"] == k["removed"] and agg["n_heads"] == k["aggregate_heads"]
            assert k["retrieval_removed"] == agg["accuracy"]
            removed = set(k["removed"].split(","))
            for _, r in rnd.iterrows():  # same number, same kind, none of the aggregate heads
                names = r["heads"].split(",")
                assert len(names) == len(removed) and not set(names) & removed
                assert {model.check_head(n).kind for n in names} == {k["kind"]}
            if len(rnd):
                assert k["retrieval_random"] == pytest.approx(statistics.median(rnd["accuracy"]))
            assert len(set(rnd["heads"])) == len(rnd)  # distinct draws


@needs_zoo
def test_zoo_hybrid_delegates_aggregation_to_attention(zoo_hybrid):
    m, task, res = zoo_hybrid
    assert is_hybrid(m)
    assert list(res.kinds.columns) == KIND_COLUMNS and list(res.removal.columns) == REMOVAL_COLUMNS
    kinds = res.to_frame().set_index("kind")
    assert list(kinds.index) == ["attn", "ssm2"]  # attention first
    assert kinds.loc["attn", "heads"] == 4 and kinds.loc["ssm2", "heads"] == 24 and (kinds["scored"] == kinds["heads"]).all()
    for kind in ("attn", "ssm2"):
        mine = res.roles[res.roles["kind"] == kind]
        assert kinds.loc[kind, "aggregate_max"] == pytest.approx(mine["aggregate"].max())
        assert kinds.loc[kind, "selectivity_mean"] == pytest.approx(mine["selectivity"].mean())
        assert kinds.loc[kind, "gather_heads"] == (mine["role"] == "gather").sum()
        assert kinds.loc[kind, ["gather_heads", "aggregate_heads", "other_heads"]].sum() == len(mine)
    # the attention head the zoo circuit is built on reads the lines two tokens late and aggregates
    roles = res.roles.set_index("name")
    assert roles.loc["L2H0", "role"] == "aggregate" and roles.loc["L2H0", "offset"] == 2
    assert "L2H0" in kinds.loc["attn", "removed"].split(",") and kinds.loc["ssm2", "aggregate_heads"] == 0
    assert kinds.loc["ssm2", "gather_heads"] >= 1
    # removing the attention aggregates collapses retrieval; as many random attention heads do not
    assert kinds.loc["attn", "retrieval_intact"] >= 0.95
    assert kinds.loc["attn", "retrieval_removed"] <= task.chance + 0.1
    assert kinds.loc["attn", "retrieval_random"] >= 0.9
    _check_removals(m, task, res)
    # the zoo's word-level vocabulary cannot represent prose: no knowledge half, and a note says so
    assert res.knowledge is None and any("no knowledge task" in n for n in res.notes)
    assert "removing the" in res.summary() and "attention heads" in res.summary()


@needs_zoo
def test_folder_round_trip(zoo_hybrid, tmp_path):
    _, _, res = zoo_hybrid
    res.save(tmp_path)
    doc = json.loads((tmp_path / "delegation.json").read_text())
    assert doc["format"] == "delegation" and doc["format_version"] == 1
    again = Delegation.load(tmp_path)
    assert again.notes == res.notes and again.knowledge == res.knowledge and again.chance == res.chance
    pd.testing.assert_frame_equal(again.kinds, res.kinds)
    pd.testing.assert_frame_equal(again.removal, res.removal)
    pd.testing.assert_frame_equal(again.roles, res.roles)
    (tmp_path / "other.json").write_text(json.dumps({"format": "mask", "format_version": 1}))
    with pytest.raises(InputError, match="not a gna_interp delegation file"):
        Delegation.load(tmp_path / "other.json")


def test_tiny_falcon_h1_with_knowledge_tasks(falcon):
    """A random tiny hybrid under a loose rule (some heads of both kinds labelled aggregate); the knowledge half
    as LM loss on prose and as accuracy on cloze questions, every number against ablate + evaluate."""
    task = KVRetrieval(3, 3, seed=2, max_value=20)
    rule = RoleRule(aggregate_min=0.0, selectivity_min=0.0, smooth_selectivity_min=0.0)
    prose = NeutralText(n_paragraphs=2)
    res = delegation(falcon, task, knowledge=prose, seeds=2, n_samples=2, rule=rule)
    assert res.knowledge == {"name": "neutral-text", "metric": "lm_loss", "n_samples": 2}
    assert set(res.kinds["kind"]) == {"attn", "ssm2"} and res.kinds["aggregate_heads"].sum() > 0
    _check_removals(falcon, task, res, prose)
    cloze = MultipleChoice(category_questions(3, seed=1), format="cloze")
    res2 = delegation(falcon, task, knowledge=cloze, roles=res.roles, seeds=1)
    assert res2.knowledge["metric"] == "accuracy"
    _check_removals(falcon, task, res2, cloze)


def test_bad_input(tiny_models, falcon):
    task = KVRetrieval(3, 3, seed=2, max_value=20)
    with pytest.raises(InputError, match="hybrid; .* has only attn heads"):
        delegation(tiny_models["llama"], task)
    with pytest.raises(InputError, match="knowledge must be"):
        delegation(falcon, task, knowledge="prose")
    with pytest.raises(InputError, match="seeds must be"):
        delegation(falcon, task, seeds=-1)
    with pytest.raises(InputError, match="retrieval task"):
        delegation(falcon)
    with pytest.raises(InputError, match="lack the columns"):
        delegation(falcon, task, roles=pd.DataFrame({"name": ["L0H0"], "offset": [0]}))


@needs_zoo
def test_scan_report_shows_delegation_for_hybrids_only(zoo_hybrid, tiny_models, tmp_path):
    m, task, _ = zoo_hybrid
    kw = dict(strategy="exact", k=1, seeds=2, control=False, n_cards=0, progress=False)
    circ = discover(m, task, **kw)
    assert circ.delegation is not None and "delegation" in circ.timings
    assert circ.delegation.to_frame().set_index("kind").loc["attn", "aggregate_heads"] >= 1
    circ.save(tmp_path / "hy")
    assert (tmp_path / "hy" / "delegation.csv").is_file()
    pd.testing.assert_frame_equal(Circuit.load(tmp_path / "hy").delegation.kinds, circ.delegation.kinds)
    page = build_report(tmp_path / "hy", png=False).read_text()
    assert "Delegation: which kind of head takes which role" in page and "L2H0 A +2" in page
    assert "Delegation in zoo:hybrid-kv" in (tmp_path / "hy" / "summary.md").read_text()
    tr = discover(tiny_models["llama"], KVRetrieval(3, 4, seed=2, max_value=20), allow_chance=True, **kw)
    assert tr.delegation is None and "delegation" not in tr.timings
    tr.save(tmp_path / "tr")
    assert not (tmp_path / "tr" / "delegation.json").exists()
    assert "Delegation" not in build_report(tmp_path / "tr", png=False).read_text()
