"""Trustworthy discovery: the LM-loss control, generic heads, the chance check, intervals, stability, roles
with reasons, the curve's k and its random draws."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.circuits.search.curve import curve_k
from gna_interp.circuits.search.discovery import check_solvable
from gna_interp.circuits.scan.specificity import control_task, specificity_frame
from gna_interp.errors import InputError
from gna_interp.engine import plan_scoring, run_plan
from gna_interp.tasks.text import NeutralText, lm_loss

TASK = gna.KVRetrieval(n_pairs=3, n_samples=6, max_value=20, seed=4)


def test_neutral_text_lm_loss_equals_a_plain_cross_entropy(tiny_models):
    """The control's LM loss is the mean next-token cross-entropy of the continuations, computed by hand."""
    model = tiny_models["llama"]
    task = NeutralText(n_paragraphs=3)
    got = lm_loss(run_plan(model, plan_scoring(model, task.samples)))
    total, count = 0.0, 0
    for s in task:
        ids = model.tokenizer(s.prompt + s.candidates[0], return_tensors="pt")["input_ids"]
        n_prompt = len(model.tokenizer(s.prompt)["input_ids"])
        with torch.no_grad():
            logits = model.hf_model(ids).logits[0, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none")[n_prompt - 1:]
        total, count = total + float(nll.sum()), count + len(nll)
    assert got == pytest.approx(total / count, rel=1e-5)
    with pytest.raises(InputError, match="prompt_words"):
        NeutralText(prompt_words=0)
    with pytest.raises(InputError, match="string of paragraphs"):
        NeutralText(text=["not", "a", "string"])


def test_control_scan_measures_the_lm_loss_rise_per_head(tiny_models):
    model = tiny_models["llama"]
    task = NeutralText(n_paragraphs=2)
    exact = gna.scan_heads(model, task, metric="logprob", strategy="exact", batch_size=2, progress=False)
    plan = plan_scoring(model, task.samples)
    base = lm_loss(run_plan(model, plan))
    assert -exact.baseline_value == pytest.approx(base, rel=1e-6)
    for h in exact.heads[:3]:
        with gna.ablate(model, [h]):
            rise = lm_loss(run_plan(model, plan)) - base
        assert exact.to_frame().set_index("name").loc[h.name, "drop"] == pytest.approx(rise, abs=1e-5)
    att = gna.scan_heads(model, task, metric="logprob", strategy="attribution", batch_size=2, progress=False)
    assert all(math.isfinite(att.est_drop(h)) for h in att.heads)
    auto = gna.scan_heads(model, task, metric="logprob", strategy="auto", certify=0, verify=1, settle_above=-1e9,
                          batch_size=2, progress=False)
    assert set(auto.exact) == set(auto.heads)  # every head could pass a threshold that low: all settled exactly


def test_the_control_loss_is_read_a_few_rows_at_a_time_and_equals_the_full_computation(tiny_models, monkeypatch):
    """The control reads every position of its text, so no step may hold a ``reads x vocabulary`` matrix: the clean
    pass keeps each read's log-probability only, the head runs over a few rows (here 4) and vocabulary columns at a
    time, and only the replay check reads whole logit rows, a bounded spread of them. The LM loss, intact and with a
    head removed, equals the full computation's (``log_softmax`` over the whole vocabulary at every read) to 1e-6."""
    from gna_interp.engine import unembed as head_mod
    from gna_interp.engine import replay as replay_mod

    model = tiny_models["llama"]
    task = NeutralText(n_paragraphs=3)
    plan = plan_scoring(model, task.samples)
    heads = model.heads()[:2]
    want = [lm_loss(run_plan(model, plan))]
    for h in heads:
        with gna.ablate(model, [h]):
            want.append(lm_loss(run_plan(model, plan)))
    monkeypatch.setitem(head_mod.VOCAB_BLOCK, "cpu", 64)
    monkeypatch.setitem(head_mod.HEAD_VALUES, "cpu", 4 * 64)
    asked, read_logits = [], model.read_logits

    def counted(batch, rows, pos, *args, **kwargs):
        asked.append(rows.numel())
        return read_logits(batch, rows, pos, *args, **kwargs)

    monkeypatch.setattr(model, "read_logits", counted)
    model.facts.pop(replay_mod.VERIFIED, None)  # check the replays again, under the count
    runner = replay_mod.SetAblation(model, task, batch_size=2)
    got = [lm_loss(runner.clean())] + [lm_loss(runner.run([h])) for h in heads]
    assert got == pytest.approx(want, abs=1e-6)
    n_reads = sum(len(t.tokens) for t in plan.targets)
    assert asked and max(asked) <= replay_mod.VERIFY_READS < n_reads


def test_generic_heads_are_labelled_and_left_out(tiny_models):
    model = tiny_models["llama"]
    scan = gna.scan_heads(model, TASK, strategy="exact", batch_size=3, progress=False)
    control = gna.scan_heads(model, NeutralText(n_paragraphs=2), metric="logprob", strategy="exact", batch_size=2,
                             progress=False)
    frame = specificity_frame(scan, control, generic_fraction=0.02)
    rel = frame.set_index("name")["control_rel"]
    worst = rel.idxmax()
    threshold = float(rel.sort_values().iloc[-2] + rel.max()) / 2  # exactly one head above it
    base_loss = -control.baseline_value
    frame = specificity_frame(scan, control, generic_fraction=threshold)
    assert frame.set_index("name")["generic"].sum() == 1 and bool(frame.set_index("name").loc[worst, "generic"])
    assert ((frame["specificity"] >= -1) & (frame["specificity"] <= 1)).all()
    assert frame.set_index("name").loc[worst, "control_drop"] == pytest.approx(rel[worst] * base_loss)

    roles = gna.role_scores(model, TASK, n_samples=2)
    c = gna.Circuit(model.name, TASK.to_dict(), scan, roles, {"chance": TASK.chance}, pd.DataFrame(),
                    control=control, generic_fraction=threshold)
    df = c.to_frame().set_index("name")
    assert df.loc[worst, "role"] == "generic" and "generic: removing it raises the LM loss" in df.loc[worst, "role_reason"]
    assert worst not in [h.name for h in c.heads] and [h.name for h in c.generic] == [worst]
    assert len(c.heads) == len(scan.heads) - 1
    kept = gna.Circuit(model.name, TASK.to_dict(), scan, roles, {}, pd.DataFrame(), control=control,
                       generic_fraction=threshold, keep_generic=True)
    assert worst in [h.name for h in kept.heads]


def test_the_control_is_skipped_with_a_reason_for_a_word_level_vocabulary():
    model = gna.load_model("zoo:transformer-kv", device="cpu")
    task, why = control_task(model)
    assert task is None and "cannot be scored" in why


def test_a_task_at_chance_is_refused_before_any_scan(tiny_models):
    model = tiny_models["llama"]  # random weights: at chance
    with pytest.raises(InputError, match=r"at chance on kv3-official.*allow_chance=True"):
        check_solvable(model, TASK)
    assert "NEAR CHANCE" in check_solvable(model, TASK, allow_chance=True)
    with pytest.raises(InputError, match="at chance"):
        gna.discover(model, TASK, strategy="exact", progress=False)


def test_intervals_cover_the_drop_and_stability_compares_two_halves(tiny_models):
    model = tiny_models["llama"]
    scan = gna.scan_heads(model, TASK, strategy="exact", batch_size=3, progress=False)
    df = scan.to_frame()
    assert (df["drop_lo"] <= df["drop"] + 1e-9).all() and (df["drop"] <= df["drop_hi"] + 1e-9).all()
    assert scan.intervals() is scan.intervals()  # cached
    # a brute-force resample of one head matches the vectorised bootstrap on the same indices
    h = scan.heads[0]
    d = (scan.baseline["logit_diff"] - scan.exact[h]["logit_diff"]).numpy()
    assert df.set_index("name").loc[h.name, "drop"] == pytest.approx(float(d.mean()))
    st = scan.stability(top=4)
    assert st["k"] == 4 and 0 <= st["top_k_overlap"] <= 4 and set(st["drops_a"]) == {x.name for x in scan.heads}
    even = torch.arange(0, len(TASK), 2)
    base = float(scan.baseline["logit_diff"][even].mean())
    assert st["drops_a"][h.name] == pytest.approx(base - float(scan.exact[h]["logit_diff"][even].mean()))


def test_the_curve_removes_a_small_k_and_random_draws_avoid_the_circuit(tiny_models):
    assert curve_k(8, 5) == 2 and curve_k(270, 5) == 5 and curve_k(3, 5) == 1
    model = tiny_models["llama"]
    heads = model.heads()
    ranked = heads[::-1]
    curve = gna.ablation_curve(model, TASK, ranked, heads, k=2, seeds=3, batch_size=3,
                               control=NeutralText(n_paragraphs=1), generic=heads[:1])
    top = {n for n in ranked[:2]}
    for names in curve.loc[curve["series"] == "random", "heads"]:
        assert not {gna.HeadRef.parse(n) for n in names.split(",") if n} & top
    assert set(curve["series"]) == {"top", "random", "generic"}
    measured = curve["k"].isin([0, 2]) | curve["series"].eq("generic")  # intact, at k, and the generic point
    gen = curve[curve["series"] == "generic"]
    assert gen["k"].tolist() == [0, 1] and gen["heads"].tolist()[1] == heads[0].name  # generic: measured at k only
    assert curve.loc[measured, "lm_loss"].notna().all() and curve.loc[~measured, "lm_loss"].isna().all()
    wide = gna.ablation_curve(model, TASK, ranked, heads, k=3, seeds=4, batch_size=3, band=2)
    rnd = wide[wide["series"] == "random"]
    assert sorted(rnd.loc[rnd["k"] == 3, "seed"]) == [0, 1, 2, 3]  # every draw at k: the comparison
    assert sorted(rnd.loc[rnd["k"].isin([1, 2]), "seed"]) == [0, 0, 1, 1]  # the band's draws at every j
    again = gna.ablation_curve(model, TASK, ranked, heads, k=3, seeds=4, batch_size=3, band=None)
    assert len(again[again["series"] == "random"]) == 4 * 4


def test_role_reasons_name_the_numbers(tiny_models):
    roles = gna.role_scores(tiny_models["llama"], TASK, n_samples=2)
    assert roles["role_reason"].str.len().gt(20).all()
    rule = gna.RoleRule()
    agg = {"gather": 0.1, "gather_prev": 0.0, "aggregate": 0.6, "selectivity": 0.8}
    assert rule.label(agg) == "aggregate" and "selects the gold segment" in rule.explain(agg)
    weak = {"gather": 0.1, "gather_prev": 0.0, "aggregate": 0.3, "selectivity": 0.0}
    assert rule.label(weak) == "other" and "does not select" in rule.explain(weak)
