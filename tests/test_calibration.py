"""Task-form calibration: the choice rule, the grid, the measurement against `evaluate`, and `gna scan` using it."""

from __future__ import annotations

import json

import pytest

from gna_interp import load_model
from gna_interp.circuits import Circuit
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval, evaluate
from gna_interp.tasks.calibration import Calibration, FormResult, calibrate, chance_margin, choose, kv_forms


def _row(acc: float, tokens: float = 60.0, chance: float = 0.1, n: int = 16) -> FormResult:
    return FormResult({"x": acc}, "t", acc, chance, n, tokens)


def test_choose_takes_the_most_accurate_unsaturated_solved_form():
    # SmolLM2's numbers (docs/discovery.md): 0.40 official 0-9, 0.81 completion 0-99, 0.67 with 20 pairs
    rows = [_row(0.40), _row(0.81), _row(0.67, 120)]
    assert choose(rows) == 1
    assert choose([_row(0.50), _row(1.0)]) == 1  # 16/16 on a form solved at 0.85: saturation never demotes it
    assert choose([_row(0.8, 120), _row(0.8, 60)]) == 1  # a tie goes to the shorter prompts
    assert choose([_row(0.97, 60), _row(1.0, 120), _row(0.12)]) == 1  # all solved saturate: the hardest
    assert choose([_row(0.12), _row(0.15)]) == 1  # none solved: the most accurate (the chance check refuses it)
    assert not _row(0.1 + chance_margin(0.1, 16)).solved and _row(0.1 + chance_margin(0.1, 16) + 1e-6).solved
    with pytest.raises(InputError):
        choose([])


def test_kv_forms_vary_only_the_knobs_not_named():
    assert len(kv_forms()) == 6  # 2 templates x (10 pairs 0-9, 10 pairs 0-99, 20 pairs 0-99)
    forms = kv_forms({"template": "official", "n_pairs": None})
    assert {f["template"] for f in forms} == {"official"} and len(forms) == 3
    assert kv_forms({"template": "completion", "max_value": 9, "n_pairs": 6}) == [
        {"template": "completion", "max_value": 9, "n_pairs": 6}]
    with pytest.raises(InputError, match="n_pairs must be at most"):
        kv_forms({"max_value": 9, "n_pairs": 20})
    with pytest.raises(InputError, match="unknown KV knobs"):
        kv_forms({"pairs": 3})


def test_calibrate_measures_each_form_as_evaluate_does_and_round_trips():
    model = load_model("zoo:transformer-kv", device="cpu")
    forms = kv_forms({"max_value": 99})

    def build(f):
        return KVRetrieval(f["n_pairs"], 6, seed=3, template=f["template"], max_value=f["max_value"],
                           words=model.kv_words)

    cal = calibrate(model, forms, build, {"max_value": 99})
    assert [r.form for r in cal.rows] == forms and not cal.skipped
    for r, f in zip(cal.rows, forms):
        assert r.accuracy == pytest.approx(evaluate(model, build(f), progress=False).accuracy)
        assert r.n_samples == 6 and r.tokens > 10
    assert cal.chosen == choose(cal.rows) and cal.rows[cal.chosen].verdict == "chosen"
    assert cal.named == {"max_value": 99} and "max_value=99 named, so held fixed" in "\n".join(cal.lines())
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.rows == cal.rows and back.chosen == cal.chosen
    with pytest.raises(InputError, match="malformed calibration"):
        Calibration.from_dict({"rows": [{"form": {}}], "chosen": 0})


def test_gna_scan_calibrates_the_unnamed_knobs_and_records_the_grid(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--max-value", "99", "--template", "official",
            "--samples", "6", "--calibrate", "4", "--top-k", "1", "--seeds", "1", "--no-control", "--no-png", "--out", str(out)]
    assert main(argv) == 0
    assert "[calibrate] task form" in capsys.readouterr().out
    c = Circuit.load(out)
    cal = c.calibration
    assert cal is not None and [r.form["n_pairs"] for r in cal.rows] + [f["n_pairs"] for f in cal.skipped] == [10, 20]
    assert all(r.form["template"] == "official" and r.form["max_value"] == 99 for r in cal.rows)
    # the 20-pair form is measured only when the 10-pair one has no headroom
    assert bool(cal.skipped) == (cal.rows[0].solved and cal.rows[0].accuracy < cal.saturated)
    args = c.task["args"]
    assert (args["template"], args["max_value"], args["n_pairs"]) == ("official", 99, c.calibration.form["n_pairs"])
    assert "timings" in json.loads((out / "circuit.json").read_text()) and "calibrate" in c.timings
    assert "## Task form" in (out / "summary.md").read_text()
    assert "Task form" in (out / "report.html").read_text()
    # every knob named: nothing to calibrate, the form is used as given (and only checked)
    out2 = tmp_path / "named"
    assert main(argv[:-1] + [str(out2), "--pairs", "6"]) == 0
    c2 = Circuit.load(out2)
    assert c2.calibration is None and c2.task["args"]["n_pairs"] == 6


def test_gna_scan_mc_calibrates_letters_against_stated(tiny_dirs, tmp_path):
    out = tmp_path / "mc"
    assert main(["--device", "cpu", "scan", "--allow-chance", "--model", str(tiny_dirs["llama"]), "--task", "mc",
                 "--samples", "4", "--calibrate", "4", "--shots", "1", "--top-k", "1", "--seeds", "1", "--no-control",
                 "--no-png", "--out", str(out)]) == 0
    c = Circuit.load(out)
    assert [r.form for r in c.calibration.rows] == [{"mc_form": "letters"}, {"mc_form": "stated"}]
    assert c.load_task().name == f"categories-{c.calibration.form['mc_form']}"
