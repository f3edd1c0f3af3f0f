"""`gna mask` / `mask_experiment`: the keep-only-G&A masks (checked entry by entry against a direct
construction), the intact and fully-masked conditions against `evaluate` and `ablate`, the paper's claim
on the zoo Transformer and Mamba-2, the folder, resume, and bad input."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from gna_interp import load_model
from gna_interp.cli import main
from gna_interp.errors import HeadError, InputError
from gna_interp.experiments import mask as mask_mod
from gna_interp.experiments.mask import MaskResult, ga_mask, mask_experiment, reach, shifted_items
from gna_interp.interventions import ablate
from gna_interp.tasks import KVRetrieval, evaluate
from gna_interp.tasks.segments import Segments, Span

TR_HEADS = "L0H3=gather,L1H3=aggregate,L1H2=aggregate"  # the zoo Transformer's circuit (tests/test_zoo.py)
M2_AGG = ["L1S0", "L1S1", "L1S2", "L1S3", "L1S4", "L1S7"]  # the zoo Mamba-2's layer-1 heads


@pytest.fixture(scope="module")
def zoo():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_model(f"zoo:{name}", device="cpu")
        return cache[name]

    return get


def margin(chance: float, n: int) -> float:
    return max(0.05, 2 * math.sqrt(chance * (1 - chance) / n))


def test_masks_entry_by_entry():
    # prompt of 12 tokens: lines [2,4), [4,7), [7,9); question [9,11); final 11; behind 3 padding tokens
    seg = Segments((Span(2, 4), Span(4, 7), Span(7, 9)), Span(9, 11), 11, 12, True)
    pad, T = 3, 17  # 12 prompt tokens + 2 fed candidate tokens behind 3 pads
    for offset in (0, 1, 4):
        lines = [(a + offset, min(b + offset, 12)) for a, b in ((2, 4), (4, 7), (7, 9))]
        g, a = ga_mask(seg, "gather", T, pad, offset), ga_mask(seg, "aggregate", T, pad, offset)
        for q in range(T):
            for k in range(T):
                same = any(s <= q - pad < e and s <= k - pad < e for s, e in lines)
                assert g[q, k] == float(same and k <= q), (offset, q, k)
                decision = q - pad >= 11
                summary = any(k - pad == e - 1 for s, e in lines)
                assert a[q, k] == float(decision and summary), (offset, q, k)
    assert [(s.start, s.stop) for s in shifted_items(seg, 4)] == [(6, 8), (8, 11), (11, 12)]
    with pytest.raises(InputError, match="does not fit"):
        ga_mask(seg, "gather", 12, pad=1)
    with pytest.raises(InputError, match="unknown G&A role"):
        ga_mask(seg, "copy", 12)


def test_reach_follows_the_convolutions(zoo):
    tr, m2, hy = zoo("transformer-kv"), zoo("mamba2-kv"), zoo("hybrid-kv")
    assert reach(tr, "L1H3") == 0
    conv = m2.hf_module(m2.layer_spec(0, "ssm2").bridge_path).conv_kernel_size
    assert reach(m2, "L0S0") == reach(m2, "L3S7") == conv - 1 == 3
    assert reach(hy, "L2H0") == 3  # attention after SSM layers reads a shifted residual stream


def test_intact_and_masked_conditions_agree_with_evaluate_and_ablate(zoo):
    """intact = evaluate; an all-zero mask on attention heads = their zero ablation (independent paths)."""
    model = zoo("transformer-kv")
    r = mask_experiment(model, heads=TR_HEADS, samples=16, max_value=99, seeds=1, progress=False)
    task = KVRetrieval(10, 16, seed=1, max_value=99, words=model.kv_words)
    assert r.task == task.to_dict()
    rows = r.frame.set_index("condition")
    ev = evaluate(model, task, progress=False)
    assert rows.loc["intact", "accuracy"] == pytest.approx(ev.accuracy, abs=1e-9)
    assert rows.loc["intact", "logit_diff"] == pytest.approx(ev.scores.logit_diff.mean().item(), abs=1e-4)
    with ablate(model, ["L0H3", "L1H3", "L1H2"]):
        ab = evaluate(model, task, progress=False)
    assert rows.loc["ga_masked", "accuracy"] == pytest.approx(ab.accuracy, abs=1e-9)
    assert rows.loc["ga_masked", "logit_diff"] == pytest.approx(ab.scores.logit_diff.mean().item(), abs=1e-4)
    assert [h.role for h in r.heads] == ["gather", "aggregate", "aggregate"]
    assert all(h.offset == 0 and h.source == "given" for h in r.heads)
    rnd = r.random[0]
    assert [h.role for h in rnd] == ["gather", "aggregate", "aggregate"]
    assert not {h.head for h in rnd} & {h.head for h in r.heads}
    # the model is restored: a plain evaluation afterwards is unchanged
    assert evaluate(model, task, progress=False).accuracy == ev.accuracy


def test_zoo_transformer_masking_claim(zoo, tmp_path, capsys):
    """`gna mask --model zoo:transformer-kv --out DIR` (discovery included): masking the G&A heads drops KV
    retrieval to chance, keeping only their G&A pattern recovers it, random heads barely matter."""
    out = tmp_path / "mask"
    assert main(["--device", "cpu", "mask", "--model", "zoo:transformer-kv", "--out", str(out), "--max-value", "99",
                 "--samples", "32", "--no-png"]) == 0
    printed = capsys.readouterr().out
    assert "ga_pattern" in printed and "gives back" in printed
    r = MaskResult.load(out)
    m = r.metrics
    assert m["intact"] >= 0.9
    assert m["ga_masked"] <= m["chance"] + margin(m["chance"], 32)
    assert m["ga_pattern"] >= 0.85 * m["intact"] and m["recovered"] >= 0.8
    assert m["random_masked"] >= m["intact"] - 0.2
    assert {h.head.name: h.role for h in r.heads} == {"L0H3": "gather", "L1H3": "aggregate", "L1H2": "aggregate"}
    doc = json.loads((out / "mask.json").read_text())
    assert doc["format"] == "mask" and doc["format_version"] == 1
    csv = pd.read_csv(out / "mask.csv")
    assert list(csv.columns) == mask_mod.COLUMNS and len(csv) == 3 + 2 * 3
    assert (out / "circuit" / "circuit.json").is_file()  # the discovery it ran, reusable by gna report
    page = (out / "report.html").read_text()
    assert "plotly" in page and "Keep-only-G&amp;A" in page and "Masked heads" in page
    assert (out / mask_mod.CHECKPOINT).is_file()  # kept: a checkpoint is never deleted implicitly


def test_zoo_mamba2_reads_the_lines_one_token_late(zoo):
    """The Mamba-2 aggregate heads select the gold line one token after its end (their conv carries it
    there): fully masked -> chance, only the shifted G&A pattern -> intact, literal summaries -> chance."""
    model = zoo("mamba2-kv")
    r = mask_experiment(model, heads=M2_AGG, samples=32, max_value=99, seeds=2, progress=False)
    assert {h.role for h in r.heads} == {"aggregate"} and {h.offset for h in r.heads} == {1}
    assert {h.source for h in r.heads} == {"measured"}
    sc = r.scores.set_index(["name", "offset"])["selectivity"]
    assert all(sc[(h, 1)] > 0.15 > sc[(h, 0)] for h in M2_AGG)
    m = r.metrics
    n, c = 32, m["chance"]
    assert m["intact"] >= 0.95
    assert m["ga_masked"] <= c + margin(c, n) and m["ga_pattern_unshifted"] <= c + margin(c, n)
    assert m["ga_pattern"] >= 0.9 and m["random_masked"] >= 0.9
    # a forced offset 0 is the unshifted condition
    r0 = mask_experiment(model, heads={h: "aggregate" for h in M2_AGG}, samples=32, max_value=99, seeds=0,
                         offset=0, progress=False)
    assert r0.accuracy("ga_pattern") == pytest.approx(m["ga_pattern_unshifted"])
    assert "ga_pattern_unshifted" not in set(r0.frame["condition"])


def test_resume_runs_only_the_missing_conditions(zoo, tmp_path, monkeypatch):
    model = zoo("transformer-kv")
    out = tmp_path / "m"
    real, calls = mask_mod._score, []

    def flaky(*args, **kw):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(args[4])
        return real(*args, **kw)

    monkeypatch.setattr(mask_mod, "_score", flaky)
    kw = dict(heads=TR_HEADS, samples=8, max_value=99, seeds=1, progress=False, png=False)
    with pytest.raises(KeyboardInterrupt):
        mask_experiment(model, out=out, **kw)
    saved = json.loads((out / mask_mod.CHECKPOINT).read_text())
    assert list(saved["points"]) == ["intact:-1", "ga_masked:-1"]
    with pytest.raises(InputError, match="--resume continues it"):
        mask_experiment(model, out=out, **kw)
    assert main(["mask", "--model", "zoo:transformer-kv", "--heads", TR_HEADS, "--out", str(out)]) == 2
    monkeypatch.setattr(mask_mod, "_score", lambda *a, **k: (calls.append(a[4]), real(*a, **k))[1])
    with pytest.raises(InputError, match="other settings"):
        mask_experiment(model, out=out, resume=True, **{**kw, "samples": 9})
    r = mask_experiment(model, out=out, resume=True, **kw)
    assert calls == ["none", "zero", "pattern", "zero", "pattern"]  # 2 before the interruption, 3 after
    fresh = mask_experiment(model, **{**kw, "out": None})
    pd.testing.assert_frame_equal(r.frame, fresh.frame)
    assert len(json.loads((out / mask_mod.CHECKPOINT).read_text())["points"]) == 5 and (out / "mask.json").exists()


def test_bad_input(zoo, tmp_path, capsys):
    model = zoo("transformer-kv")
    with pytest.raises(InputError, match="unknown role"):
        mask_experiment(model, heads="L0H3=copier", progress=False)
    with pytest.raises(HeadError, match="out of range"):
        mask_experiment(model, heads="L0H9=gather", progress=False)
    with pytest.raises(HeadError, match="given twice"):
        mask_experiment(model, heads="L0H3,L0H3=gather", progress=False)
    with pytest.raises(InputError, match="a circuit or heads, not both"):
        mask_experiment(model, circuit=tmp_path, heads="L0H3", progress=False)
    with pytest.raises(InputError, match="none of the heads"):
        mask_experiment(model, heads="L0H0,L1H0", max_value=99, progress=False)
    with pytest.raises(InputError, match="seeds must be"):
        mask_experiment(model, heads=TR_HEADS, seeds=-1, progress=False)
    with pytest.raises(InputError, match="fewer than pairs"):
        mask_experiment(model, heads=TR_HEADS, pairs=12, max_value=9, progress=False)
    with pytest.raises(InputError, match="at chance"):  # 40 pairs: beyond what the 2-layer model retrieves
        mask_experiment(load_model("zoo:mamba1-kv", device="cpu"), heads="L1C0=aggregate", pairs=40, max_value=99,
                        samples=16, progress=False, offset=0)
    capsys.readouterr()
    assert main(["mask", "--model", "zoo:transformer-kv", "--circuit", str(tmp_path / "nope"),
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gna: error: --circuit") and err.count("\n") == 1
    assert main(["mask", "--model", "zoo:transformer-kv", "--offset", "-1", "--out", str(tmp_path / "o")]) == 2
    assert "--offset" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["mask", "--model", "zoo:transformer-kv", "--out", str(tmp_path / "file")]) == 2
    assert "existing file" in capsys.readouterr().err


def test_masks_are_evaluated_on_the_circuits_template(zoo, tmp_path):
    """A circuit found on the completion template is masked on completion-template prompts (not the official
    ones): the evaluation task follows the circuit's KV form unless a knob is named."""
    from gna_interp import discover

    model = zoo("transformer-kv")
    found = KVRetrieval(6, 8, seed=0, template="completion", max_value=99, words=model.kv_words)
    c = discover(model, found, control=False, k=2, seeds=1, progress=False).save(tmp_path / "c")
    r = mask_experiment(model, circuit=c, samples=8, seeds=1, progress=False)
    assert r.task == KVRetrieval(6, 8, seed=1, template="completion", max_value=99, words=model.kv_words).to_dict()
    named = mask_experiment(model, circuit=c, samples=8, seeds=1, template="official", progress=False)
    assert named.task["args"]["template"] == "official"
