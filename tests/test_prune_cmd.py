"""`gna prune` / `prune`: the curves against `prune_curve`, the head-keeping rows against direct
`skip_layers` + `ablate` evaluations, the task checks, the folder, resume, and bad input."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from gna_interp import load_model
from gna_interp.circuits import prune_curve
from gna_interp.cli import main
from gna_interp.errors import HeadError, InputError
from gna_interp.experiments import prune as prune_mod
from gna_interp.tasks.options import TaskOptions
from gna_interp.experiments.prune import PruneResult, build_tasks, keep_rows, parse_keep_layers, prune
from gna_interp.interventions import ablate, skip_layers
from gna_interp.tasks import evaluate, task_from_dict

METRICS = ["accuracy", "logit_diff", "gold_prob", "chance", "n_samples"]


@pytest.fixture(scope="module")
def zoo_tr():
    return load_model("zoo:transformer-kv", device="cpu")


def test_curves_equal_prune_curve_on_three_tasks(tiny_models):
    """kv, mc letters and cloze side by side (a random tiny model: allow_chance keeps them), point for
    point the numbers prune_curve computes on the same tasks."""
    model = tiny_models["llama"]
    r = prune(model, tasks="kv,mc,cloze", samples=3, pairs=4, shots=0, allow_chance=True, progress=False)
    built, _ = build_tasks(model, ["kv", "mc", "cloze"], TaskOptions(pairs=4, samples=3, max_value=9, seed=0,
                                                                   questions="categories", shots=0))
    tasks = {name: t for name, (t, _) in built.items()}
    assert set(r.tasks) == set(tasks) and {t["kind"] for t in r.tasks.values()} == {"retrieval", "knowledge"}
    assert r.tasks["categories-cloze"]["kind"] == "knowledge"
    for mode in ("from_end", "single"):
        ref = prune_curve(model, tasks, mode=mode, progress=False)
        got = r.frame[r.frame["mode"] == mode]
        cols = ["mode", "k", "layer", "skipped", "skipped_kinds", "task"]
        merged = got.merge(ref, on=cols, suffixes=("", "_ref"))
        assert len(merged) == len(ref) == len(got)
        for c in METRICS + ["accuracy_drop", "logit_diff_drop"]:
            assert (merged[c] - merged[f"{c}_ref"]).abs().max() <= 1e-6, c
    assert all("NEAR CHANCE" in n for n in r.notes if "intact accuracy" in n)
    with pytest.raises(InputError, match="solves none of the tasks"):
        prune(model, tasks="kv,cloze", samples=3, pairs=4, shots=0, progress=False)


def test_gna_prune_on_the_zoo_transformer(zoo_tr, tmp_path, capsys):
    out = tmp_path / "p"
    assert main(["--device", "cpu", "prune", "--model", "zoo:transformer-kv", "--out", str(out), "--max-value", "99",
                 "--samples", "24", "--keep-heads", "L1H3,L1H2", "--no-png"]) == 0
    printed = capsys.readouterr().out
    assert "categories-letters left out" in printed and "vocabulary" in printed  # the zoo tokenizer has no MC words
    r = PruneResult.load(out)
    assert list(r.tasks) == ["kv10-official"] and r.tasks["kv10-official"]["intact"] >= 0.9
    assert list(r.curve("kv10-official").index) == [0, 1, 2]
    assert list(r.curve("kv10-official", "single").index) == [-1, 0, 1]
    # the head-keeping rows, each against a direct evaluation
    task = task_from_dict(r.tasks["kv10-official"]["task"])
    table = r.keep_table()["kv10-official"]

    def acc(skipped=(), ablated=()):
        with skip_layers(zoo_tr, list(skipped)):
            if ablated:
                with ablate(zoo_tr, list(ablated)):
                    return evaluate(zoo_tr, task, progress=False).accuracy
            return evaluate(zoo_tr, task, progress=False).accuracy

    assert table["intact"] == pytest.approx(acc())
    assert table["layers 0-0"] == pytest.approx(acc([1]))
    assert table["layers 0-0 + L1H3,L1H2"] == pytest.approx(acc(ablated=["L1H0", "L1H1"]))
    assert table["layers 0-0 + L1H3,L1H2 without L1H3"] == pytest.approx(acc(ablated=["L1H0", "L1H1", "L1H3"]))
    assert r.curve("kv10-official")[1] == pytest.approx(acc([1]))
    assert r.curve("kv10-official", "single")[0] == pytest.approx(acc([0]))
    # the paper's table in miniature: the two aggregate heads alone keep retrieval, as many other heads do not
    assert table["layers 0-0 + L1H3,L1H2"] >= 0.9 > 0.3 >= table["layers 0-0 + 2 random heads (seed 0)"]
    doc = json.loads((out / "prune.json").read_text())
    assert doc["format"] == "prune" and doc["format_version"] == 1
    assert len(pd.read_csv(out / "prune.csv")) == 6 and len(pd.read_csv(out / "keep.csv")) == 8
    page = (out / "report.html").read_text()
    assert "Layer pruning" in page and "Head keeping" in page and "plotly" in page
    # the points stay (a checkpoint is never deleted implicitly): a second run into the folder is refused, --resume
    # rebuilds the same outputs from them
    assert (out / prune_mod.CHECKPOINT).is_file()
    again = ["--device", "cpu", "prune", "--model", "zoo:transformer-kv", "--out", str(out), "--max-value", "99",
             "--samples", "24", "--keep-heads", "L1H3,L1H2", "--no-png"]
    before = (out / "prune.csv").read_text()
    assert main(again) == 2 and "--resume continues it" in capsys.readouterr().err
    assert main([*again, "--resume"]) == 0 and (out / "prune.csv").read_text() == before


def test_resume_runs_only_the_missing_points(zoo_tr, tmp_path, monkeypatch):
    out = tmp_path / "p"
    real, calls = prune_mod._evaluate, []

    def flaky(model, plans, skipped, ablated, batch_size):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append((tuple(skipped), len(ablated)))
        return real(model, plans, skipped, ablated, batch_size)

    monkeypatch.setattr(prune_mod, "_evaluate", flaky)
    kw = dict(tasks="kv", samples=6, max_value=99, keep_layers="0-0", keep_heads="L1H3", keep_seeds=1,
              progress=False, png=False)
    with pytest.raises(KeyboardInterrupt):
        prune(zoo_tr, out, **kw)
    state = json.loads((out / prune_mod.CHECKPOINT).read_text())
    assert list(state["points"]) == ["intact", "from_end:1", "from_end:2"]
    with pytest.raises(InputError, match="--resume continues it"):
        prune(zoo_tr, out, **kw)
    with pytest.raises(InputError, match="other settings"):
        prune(zoo_tr, out, resume=True, **{**kw, "keep_heads": "L1H2"})
    calls.clear()
    monkeypatch.setattr(prune_mod, "_evaluate", lambda *a: (calls.append(a[2]), real(*a))[1])
    r = prune(zoo_tr, out, resume=True, **kw)
    # missing: the 2 single blocks and the keep rows after intact (B = 1 is the last layer: no "layers 0-B" row)
    assert calls == [[0], [1]] + [row["skipped"] for row in keep_rows(zoo_tr, "0-0", "L1H3", 1)[1:]]
    fresh = prune(zoo_tr, None, **kw)
    pd.testing.assert_frame_equal(r.frame, fresh.frame)
    pd.testing.assert_frame_equal(r.keep, fresh.keep)


def test_keep_rows_and_bad_input(zoo_tr, tmp_path, capsys):
    rows = keep_rows(zoo_tr, None, "L1H3", seeds=2)
    assert [r["series"] for r in rows] == ["intact", "pruned", "kept", "without", "random", "random"]
    kept = rows[2]
    assert kept["skipped"] == [] and {h.name for h in kept["ablated"]} == {"L1H0", "L1H1", "L1H2"}
    assert {h.name for h in rows[3]["ablated"]} == {"L1H0", "L1H1", "L1H2", "L1H3"}
    assert all(r["kept_heads"] != "L1H3" for r in rows[4:])
    assert parse_keep_layers("0-15") == parse_keep_layers("15") == parse_keep_layers(15) == 15
    with pytest.raises(InputError, match="must start at layer 0"):
        parse_keep_layers("3-5")
    with pytest.raises(InputError, match="written 0-A"):
        parse_keep_layers("zero-1")
    with pytest.raises(InputError, match="keep every head anyway"):
        keep_rows(zoo_tr, "0-1", "L1H3")
    with pytest.raises(InputError, match="has layers 0..1"):
        keep_rows(zoo_tr, "0-4", None)
    with pytest.raises(HeadError):
        keep_rows(zoo_tr, None, "L1H9")
    with pytest.raises(InputError, match="ks must be integers in 0..2"):
        prune(zoo_tr, tasks="kv", ks=[5], max_value=99, progress=False)
    with pytest.raises(InputError, match="unknown prune mode"):
        prune(zoo_tr, tasks="kv", modes="middle", progress=False)
    with pytest.raises(InputError, match="unknown task"):
        prune(zoo_tr, tasks="kv,gsm8k", progress=False)
    with pytest.raises(InputError, match="no task can be scored"):
        prune(zoo_tr, tasks="mc,cloze", progress=False)
    capsys.readouterr()
    for argv, where in ((["--tasks", "kv,nope"], "--tasks"), (["--keep-layers", "2-4"], "must start at layer 0"),
                        (["--pairs", "12"], "fewer than --pairs"), (["--modes", "both"], "--modes")):
        assert main(["prune", "--model", "zoo:transformer-kv", "--out", str(tmp_path / "o"), *argv]) == 2
        err = capsys.readouterr().err
        assert where in err and err.startswith("gna: error:") and err.count("\n") == 1
