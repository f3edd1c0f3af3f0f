"""One task-form chooser for every entry point: `gna.discover(model)` with no task does what `gna scan` does."""

from __future__ import annotations

import json

import pytest

import gna_interp as gna
import gna_interp.cli as cli
from gna_interp.cli import main
from gna_interp.errors import OptionError
from gna_interp.tasks.choice import TaskChoice, choose_task

CHEAP = dict(strategy="exact", k=2, seeds=1, role_samples=2, n_cards=1, control=False, paths=2)


def test_choose_task_calibrates_the_unnamed_knobs_and_keeps_the_named_ones(tiny_models):
    model = tiny_models["llama"]
    chosen = choose_task(model, samples=6, calibrate=4, pairs=3, template="official")
    cal = chosen.calibration
    assert cal is not None and {r.form["n_pairs"] for r in cal.rows} == {3}
    assert {r.form["template"] for r in cal.rows} == {"official"} and len(cal.rows) == 2  # values 0-9 / 0-99
    assert chosen.form == cal.form and chosen.task.name.startswith("kv3-official") and len(chosen.task) == 6
    assert chosen.twin is not None and chosen.twin.name == "knowledge"  # the byte tokenizer writes every fact
    ref = chosen.reference(model)
    assert ref.name == chosen.task.name and ref[0].prompt != chosen.task[0].prompt  # seed + 1
    named = choose_task(model, samples=6, pairs=3, template="official", max_value=9)
    assert named.calibration is None and named.form == {"template": "official", "max_value": 9, "n_pairs": 3}


def test_a_zoo_model_gets_no_knowledge_twin_and_says_why():
    model = gna.load_model("zoo:transformer-kv")
    chosen = choose_task(model, samples=4, calibrate=0, formats=("official", "completion"))
    assert chosen.twin is None and any("vocabulary cannot write the facts" in n for n in chosen.notes)
    assert [t.name.split("-")[1] for t in chosen.formats] == ["official"]  # completion is the task's own form
    assert any("not scanned twice" in n for n in chosen.notes)


@pytest.mark.parametrize("bad,match", [(dict(kind="mcq"), "unknown kind"), (dict(samples=0), "samples"),
                                       (dict(pairs=30, max_value=9), "distinct values"),
                                       (dict(formats="official"), "formats"), (dict(template="x"), "template"),
                                       (dict(calibrat=3), "did you mean 'calibrate'")])
def test_bad_choices_are_refused(bad, match):
    with pytest.raises(OptionError, match=match):
        TaskChoice(**bad)


def test_discover_without_a_task_finds_what_gna_scan_finds(tmp_path, monkeypatch):
    """The notebook line and the command line choose the same form and find the same top heads."""
    model = gna.load_model("zoo:transformer-kv")
    circuit = gna.discover(model, gna.TaskChoice(samples=8, calibrate=4), **CHEAP, progress=False)
    out = tmp_path / "run"
    argv = ["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--samples", "8", "--calibrate", "4",
            "--strategy", "exact", "--top-k", "2", "--seeds", "1", "--no-control", "--no-png", "--out", str(out)]
    # the CLI runs discover's defaults for what it does not name; match the cheap ones it has no flag for
    import gna_interp.circuits.search.discovery as discovery

    real = discovery.DiscoverConfig.build
    monkeypatch.setattr(discovery.DiscoverConfig, "build", classmethod(lambda cls, base=None, **kw: real(base, **{
        **kw, "role_samples": 2, "n_cards": 1, "paths": 2})))
    assert main(argv) == 0
    doc = json.loads((out / "circuit.json").read_text())
    assert doc["task"] == circuit.task
    assert doc["calibration"]["chosen"] == circuit.calibration.chosen and circuit.timings["calibrate"] > 0
    assert [h["name"] for h in doc["heads"][:5]] == [h.name for h in circuit.scan.top(5)]
    # and with no arguments at all it calibrates like gna scan's defaults
    assert TaskChoice().samples == 24 and TaskChoice().calibrate == 16


def test_the_command_line_holds_no_task_building_code():
    from pathlib import Path

    for name in ("_scan_task", "_scan_form", "_format_tasks", "_knowledge_twin", "KV_UNCALIBRATED"):
        assert not hasattr(cli, name), name
    for f in Path(cli.__file__).parent.glob("*.py"):
        text = f.read_text()
        assert "KVRetrieval(" not in text and "multiple_choice(" not in text and ".kv(" not in text, f.name


def test_a_calibrated_task_is_checked_after_the_scan_from_its_attribution_pass(monkeypatch):
    """Calibration found the form solved, so discover checks it after the scan, from the clean scores the scan's
    attribution pass recorded: the task gets no clean forward of its own (only the two-row replay check captures)."""
    from gna_interp.engine import replay as replay_mod

    model = gna.load_model("zoo:transformer-kv")
    rows = []
    real = replay_mod.capture
    monkeypatch.setattr(replay_mod, "capture", lambda m, b, reads=None: rows.append(int(b.ids.shape[0])) or real(m, b, reads))
    circuit = gna.discover(model, gna.TaskChoice(samples=8, calibrate=4), strategy="auto", k=2, seeds=1, role_samples=2,
                           n_cards=1, paths=0, control=False, progress=False)
    assert list(circuit.timings)[:3] == ["calibrate", "scan", "check"]
    assert rows and max(rows) <= 2, rows
    want = gna.evaluate(model, circuit.load_task(), progress=False).accuracy
    assert circuit.baseline["accuracy"] == pytest.approx(want)
    assert f"{want:.3f}" in circuit.notes[0] and "chance" in circuit.notes[0]
