"""`discover`: circuit structure, ablation curve, saved files, `gna scan`; SmolLM2 equality checks."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from gna_interp import HeadRef
from gna_interp.circuits import ablation_curve, discover, scan_heads
from gna_interp.circuits.search.circuit import Circuit
from gna_interp.circuits.search.curve import CURVE_COLUMNS
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.interventions import ablate
from gna_interp.tasks import KVRetrieval, evaluate

TASK = KVRetrieval(n_pairs=3, n_samples=4, max_value=20, seed=3)


@pytest.fixture(scope="module")
def circuit(tiny_models) -> Circuit:
    return discover(tiny_models["llama"], TASK, strategy="auto", allow_chance=True, verify=6, k=3, seeds=2, batch_size=4,
                    role_samples=2, progress=False)


def test_circuit_ranks_heads_with_roles(circuit, tiny_models):
    df = circuit.to_frame()
    assert len(df) == len(tiny_models["llama"].heads())
    assert df["rank"].tolist() == list(range(1, len(df) + 1))
    assert df["role"].isin(["gather", "aggregate", "other"]).all()
    assert {"gather", "aggregate", "gold_share", "sharpness", "source"} <= set(df.columns)
    assert (df["source"].head(6) == "exact").all()


def test_curve_top_k_and_random(circuit, tiny_models):
    c = circuit.curve
    assert list(c.columns) == CURVE_COLUMNS
    top = c[c["series"] == "top"]
    assert top["k"].tolist() == [0, 1, 2, 3]
    ranked = circuit.scan.top(3)
    assert top["heads"].iloc[3] == ",".join(h.name for h in ranked)
    rnd = c[c["series"] == "random"]
    assert sorted(rnd["seed"].unique()) == [0, 1] and len(rnd) == 4 + 2  # the band's order at every k, the other at 0 and 3
    assert sorted(rnd[rnd["seed"] == 0]["k"]) == [0, 1, 2, 3] and sorted(rnd[rnd["seed"] == 1]["k"]) == [0, 3]
    assert (rnd[rnd["k"] == 0]["accuracy"] == top["accuracy"].iloc[0]).all()
    # each point is a real evaluation under `ablate`
    model = tiny_models["llama"]
    with ablate(model, ranked[:2]):
        m = evaluate(model, TASK, batch_size=4, progress=False).metrics
    assert top["logit_diff"].iloc[2] == pytest.approx(m["logit_diff"], abs=1e-6)
    assert circuit.baseline["accuracy"] == pytest.approx(top["accuracy"].iloc[0])


def test_ablation_curve_is_reproducible_and_checks_k(tiny_models):
    model = tiny_models["mamba2"]
    heads = model.heads()
    a = ablation_curve(model, TASK, heads, heads, k=2, seeds=1, batch_size=4)
    b = ablation_curve(model, TASK, heads, heads, k=2, seeds=1, batch_size=4)
    assert a.equals(b)
    with pytest.raises(InputError, match="cannot remove"):
        ablation_curve(model, TASK, heads[:1], heads, k=2)


def test_saved_files_feed_the_report(circuit, tmp_path):
    import pandas as pd

    from gna_interp.circuits import Circuit

    circuit.save(tmp_path)
    data = json.loads((tmp_path / "circuit.json").read_text())
    args = data["task"]["args"]
    assert data["model"] == circuit.model and args["n_pairs"] == 3 and args["max_value"] == 20
    assert data["rule"] == circuit.rule.to_dict() and len(data["curve"]) == len(circuit.curve)
    scan_csv = pd.read_csv(tmp_path / "scan.csv")
    assert list(scan_csv.columns[:8]) == ["layer", "head", "kind", "name", "baseline", "ablated", "drop", "rank"]
    loaded = Circuit.load(tmp_path)
    assert loaded.to_frame()["name"].tolist() == circuit.to_frame()["name"].tolist()
    assert loaded.baseline["accuracy"] == pytest.approx(circuit.baseline["accuracy"])
    from gna_interp.report import build_report

    build_report(tmp_path, png=False)  # the report writes summary.md beside report.html
    text = (tmp_path / "summary.md").read_text()
    assert circuit.to_frame()["name"].iloc[0] in text and "random heads" in text
    c = circuit.curve
    k1 = [c[(c["series"] == s) & (c["k"] == 1)]["accuracy"].mean() for s in ("top", "random")]
    assert f"k=1 {k1[0]:.3f} vs {k1[1]:.3f}" in text


def test_pair_prefers_an_earlier_gather_head():
    import pandas as pd

    from gna_interp.circuits.scan import HeadScan

    ablated = {"L2H0": 0.2, "L2H1": 0.3, "L1H0": 0.5, "L0H0": 0.9, "L0H1": 1.2}  # baseline 1.0
    heads = [HeadRef.parse(n) for n in ablated]
    per = lambda v: {"logit_diff": torch.tensor([v], dtype=torch.float64), "correct": torch.tensor([True])}  # noqa: E731
    scan = HeadScan("m", "t", "zero", "logit_diff", "exact", heads, per(1.0), {h: per(ablated[h.name]) for h in heads})
    roles = {"L2H0": "aggregate", "L2H1": "gather", "L1H0": "gather", "L0H0": "gather", "L0H1": "gather"}
    frame = lambda r: pd.DataFrame({"name": list(r), "role": list(r.values())})  # noqa: E731
    c = Circuit("m", {"name": "t"}, scan, frame(roles), {}, pd.DataFrame(columns=CURVE_COLUMNS))
    assert [h.name for h in c.pair()] == ["L1H0", "L2H0"]  # best-ranked gather head in an earlier layer
    c.roles = frame({**roles, "L1H0": "other", "L0H0": "other"})
    assert [h.name for h in c.pair()] == ["L2H1", "L2H0"]  # none earlier (L0H1 does not hurt): any layer
    c.roles = frame({**roles, "L2H0": "other"})
    assert c.pair() is None


def test_gna_scan_command(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--device", "cpu", "scan", "--allow-chance", "--model", str(tiny_dirs["mamba2"]), "--pairs", "3", "--samples", "3",
            "--max-value", "20", "--top-k", "2", "--seeds", "1", "--batch-size", "3", "--no-png", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "top heads (" in printed and "| rank | head |" not in printed and "wrote" in printed  # summary.md has it
    for f in ("scan.csv", "circuit.json", "summary.md", "scan.ckpt.json"):
        assert (out / f).is_file(), f
    first = (out / "scan.csv").read_text()
    doc = json.loads((out / "circuit.json").read_text())
    assert doc["twin"]["task"].startswith("knowledge") and 0 <= doc["twin"]["intact"] <= 1  # the zero-shot control
    assert doc["edges"] and "strongest gather -> aggregate path" in (out / "summary.md").read_text()
    assert main(argv + ["--resume"]) == 0  # resumes from the finished checkpoint
    assert (out / "scan.csv").read_text().splitlines()[0] == first.splitlines()[0]
    assert main(["scan", "--model", str(tiny_dirs["mamba2"]), "--pairs", "0", "--out", str(out)]) == 2


@pytest.mark.smollm2
def test_smollm2_fast_exact_equals_naive(smollm2):
    task = KVRetrieval(n_pairs=3, n_samples=2, max_value=9, seed=5)
    heads = ["L0H4", "L14H2", "L29H8"]
    naive = scan_heads(smollm2, task, heads=heads, strategy="naive", batch_size=2, progress=False)
    exact = scan_heads(smollm2, task, heads=heads, strategy="exact", batch_size=2, progress=False)
    for h in naive.exact:
        torch.testing.assert_close(exact.exact[h]["logit_diff"], naive.exact[h]["logit_diff"], atol=1e-4, rtol=0)
    assert max(abs(exact.to_frame()["drop"])) > 1e-4


_REEVALUATE = """
import json, sys
import torch
torch.set_num_threads(1)
import gna_interp as gna
c = gna.Circuit.load(sys.argv[1])
model = gna.load_model(c.model, device="cpu")
task = c.load_task()
plain = gna.evaluate(model, task, progress=False).accuracy
with gna.ablate(model, c.heads[:3]):
    cut = gna.evaluate(model, task, progress=False).accuracy
print(json.dumps({"plain": plain, "cut": cut, "top": [h.name for h in c.heads[:3]], "rows": len(c.to_frame())}))
"""


def test_saved_circuit_loads_in_a_new_process_and_reevaluates_the_same(circuit, tiny_models, tmp_path):
    """`Circuit.load(circuit.save(p))` round-trips; its own task re-evaluates to the same accuracy elsewhere."""
    import subprocess
    import sys

    folder = circuit.save(tmp_path / "run")
    back = Circuit.load(folder)
    assert back.heads == circuit.heads and back.model == circuit.model and back.task == circuit.task
    assert back.to_frame().equals(circuit.to_frame())
    assert back.curve[["k", "series", "accuracy"]].equals(circuit.curve[["k", "series", "accuracy"]])
    assert back.views is not None and back.views.heads == circuit.views.heads
    torch.testing.assert_close(back.views.patterns.stack(), circuit.views.patterns.stack())
    assert back.load_task().prompts == TASK.prompts
    model = tiny_models["llama"]
    with ablate(model, circuit.heads[:3]):
        cut = evaluate(model, TASK, progress=False).accuracy
    proc = subprocess.run([sys.executable, "-c", _REEVALUATE, str(folder)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["plain"] == pytest.approx(circuit.baseline["accuracy"]) and got["cut"] == pytest.approx(cut)
    assert got["top"] == [h.name for h in circuit.heads[:3]] and got["rows"] == len(circuit.heads)


def test_a_truncated_or_foreign_circuit_folder_is_refused(circuit, tmp_path):
    folder = circuit.save(tmp_path / "run")
    text = (folder / "circuit.json").read_text()
    (folder / "circuit.json").write_text(text[: len(text) // 2])
    with pytest.raises(InputError, match="truncated"):
        Circuit.load(folder)
    from gna_interp.store import FORMAT_VERSIONS

    version = f'"format_version": {FORMAT_VERSIONS["circuit"]}'
    assert version in text
    (folder / "circuit.json").write_text(text.replace(version, '"format_version": 99'))
    with pytest.raises(InputError, match="format version 99"):
        Circuit.load(folder)


def test_mc_scan_measures_its_cloze_twin_and_compare_circuits_removes_each_on_the_other(tiny_dirs, tmp_path, capsys):
    """`gna scan --task mc`: the circuit carries the cloze twin's accuracy intact / top k / random k removed (equal to
    `evaluate` under `ablate`); `gna compare-circuits` of it and a KV circuit: overlap, Spearman and the cross-removal
    table, each number equal to an independent evaluation."""
    from gna_interp import load_model
    from gna_interp.circuits import CircuitComparison
    from gna_interp.tasks import MultipleChoice
    from gna_interp.tasks.mmlu import questions_from

    common = ["--device", "cpu", "scan", "--allow-chance", "--model", str(tiny_dirs["llama"]), "--samples", "4",
              "--top-k", "2", "--seeds", "2", "--batch-size", "4", "--no-control", "--no-png"]
    mc, kv = tmp_path / "mc", tmp_path / "kv"
    assert main(common + ["--task", "mc", "--mc-form", "stated", "--shots", "1", "--out", str(mc)]) == 0
    assert main(common + ["--pairs", "3", "--max-value", "20", "--out", str(kv)]) == 0
    model = load_model(tiny_dirs["llama"], device="cpu")
    c = Circuit.load(mc)
    assert c.load_task().name == "categories-stated"
    questions, shots = questions_from("categories", 4, 0, 1)
    cloze = MultipleChoice(questions, format="cloze", name="categories", shots=shots)
    twin = c.twin
    assert twin["task"] == "categories-cloze" and twin["k"] == 2 and len(twin["random"]) == 2
    assert twin["intact"] == pytest.approx(evaluate(model, cloze, progress=False).accuracy)
    top = [HeadRef.parse(n) for n in c.curve.query("series == 'top' and k == 2")["heads"].iloc[0].split(",")]
    with ablate(model, top):
        assert twin["top"] == pytest.approx(evaluate(model, cloze, progress=False).accuracy)
    assert "knowledge twin categories-cloze" in (mc / "summary.md").read_text()
    assert "knowledge twin" in (mc / "report.html").read_text()

    capsys.readouterr()
    out = tmp_path / "cmp"
    assert main(["--device", "cpu", "compare-circuits", str(mc), str(kv), "--top-k", "2", "--seeds", "2",
                 "--out", str(out)]) == 0
    assert "top-2 overlap" in capsys.readouterr().out
    res = CircuitComparison.load(out)
    a, b = Circuit.load(mc), Circuit.load(kv)
    assert res.metrics["top_k_overlap"] == len(set(a.heads[:2]) & set(b.heads[:2]))
    df = res.to_frame()
    assert len(df) == 8 and set(df["removed"]) == {"none", "A top 2", "B top 2", "random 2 (median of 2)"}
    row = df[(df["task"] == "B: " + b.load_task().name) & (df["removed"] == "A top 2")].iloc[0]
    with ablate(model, a.heads[:2]):
        assert row["accuracy"] == pytest.approx(evaluate(model, b.load_task(), progress=False).accuracy)
    assert row["heads"] == ",".join(h.name for h in a.heads[:2])
    draws = res.metrics["random_draws"]
    assert len(draws) == 2 and all(set(d) == {"heads", "A", "B"} for d in draws)
    rnd = df[(df["task"] == "A: " + a.load_task().name) & (df["removed"] == "random 2 (median of 2)")].iloc[0]
    assert rnd["accuracy"] == pytest.approx((draws[0]["A"] + draws[1]["A"]) / 2)
    heads = [HeadRef.parse(n) for n in draws[1]["heads"].split(",")]
    assert not set(heads) & (set(a.heads[:2]) | set(b.heads[:2]))
    with ablate(model, heads):
        assert draws[1]["B"] == pytest.approx(evaluate(model, b.load_task(), progress=False).accuracy)
    assert main(["compare-circuits", str(mc), str(tmp_path / "missing")]) == 2


def test_to_dict_and_from_dict_are_symmetric(circuit):
    """from_dict(to_dict()) with the parts kept in files of their own gives back the same circuit (its document and
    its table), and the stages ran in order with their timings."""
    from gna_interp.circuits.search.discovery import STAGES

    again = Circuit.from_dict(circuit.to_dict(), circuit.scan, views=circuit.views, control=circuit.control,
                              delegation=circuit.delegation, formats=circuit.formats,
                              format_tasks=circuit.format_tasks)
    from gna_interp.store import clean_json

    as_json = lambda c: json.dumps(clean_json(c.to_dict()), sort_keys=True)  # noqa: E731 (NaN == NaN as null)
    assert as_json(again) == as_json(circuit)
    pd.testing.assert_frame_equal(again.to_frame(), circuit.to_frame())
    order = list(dict.fromkeys(name for name, _ in STAGES))  # (a calibrated task's check runs after the scan)
    assert list(circuit.timings) == [n for n in order if n in circuit.timings]
    assert {"check", "scan", "roles", "control", "curve"} <= set(circuit.timings)


def test_discover_measures_an_edge_table_that_survives_a_save(circuit, tmp_path):
    from gna_interp.circuits.edges.causal import EDGE_COLUMNS

    e = circuit.edges
    assert e is not None and list(e.columns) == EDGE_COLUMNS and len(e)
    heads = set(e["sender"])
    assert len(heads) == min(5, len(circuit.heads)) and heads == {h.name for h in circuit.heads[:5]}
    assert (e["low"] <= e["effect"]).all() and (e["effect"] <= e["high"]).all()
    df = circuit.to_frame()
    scored = df[df["causal_role"].notna()]
    assert set(scored["name"]) == heads and scored["causal_reason"].str.len().gt(0).all()
    loaded = Circuit.load(circuit.save(tmp_path / "c"))
    assert loaded.edges.round(12).equals(e.round(12))
    assert loaded.pair() == circuit.pair()
    doc = circuit.to_dict()
    assert doc["pair_from"] in ("edges", "patterns", None) and len(doc["edges"]) == len(e)


@pytest.mark.parametrize("bad", [{"receiver": "<script>"}, {"effect": "x"}, {"effect": None}, {"input": "z"},
                                 {"positions": "everywhere"}, {"sender": "../etc"}])
def test_a_hostile_edge_row_is_refused_on_load(circuit, tmp_path, bad):
    folder = circuit.save(tmp_path / "c")
    doc = json.loads((folder / "circuit.json").read_text())
    doc["edges"][0].update(bad)
    (folder / "circuit.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="edges/0"):
        Circuit.load(folder)


def test_a_circuit_at_chance_names_no_head_that_brings_it_to_chance(circuit):
    """With allow_chance on a model at chance, every head's ablated accuracy is 'at chance' too: the summary says the
    intact model is at chance instead of naming heads."""
    import copy

    from gna_interp.report.summary import circuit_summary

    at = copy.copy(circuit)
    at.baseline = {**circuit.baseline, "accuracy": circuit.baseline["chance"]}
    assert at.at_chance() and at.decisive() == []
    assert "none: the intact model is itself at chance" in circuit_summary(at)
    above = copy.copy(circuit)
    above.baseline = {**circuit.baseline, "accuracy": 1.0}
    assert not above.at_chance()
