"""Checks before the model loads: what the arguments and the saved circuits alone decide is refused in one line
before any model is loaded (``gna mask --heads`` roles and repeats, ``gna compare-circuits`` on two circuits of
different models or too few heads outside both), and ``gna hybrid build`` refuses a teacher without attention heads
before it scans."""

from __future__ import annotations

import json
import shutil

import pytest

from gna_interp.cli import main
from test_hostile_folders import _refused, scan_folder  # noqa: F401 -- scan_folder is a fixture


@pytest.mark.parametrize("heads, needle", [("L0H3=boss", "unknown role"), ("L0H3=gather,L0H3=aggregate", "given twice"),
                                           ("L0H3=gather,nobody", "malformed head name")])
def test_mask_head_roles_are_checked_before_the_model(heads, needle, tmp_path, capsys):
    _refused(["mask", "--model", "zoo:transformer-kv", "--heads", heads, "--out", str(tmp_path / "o")], capsys,
             needle, tmp_path, seconds=120)


def test_compare_circuits_of_two_models_is_refused_before_the_model(scan_folder, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(scan_folder, other)
    doc = json.loads((other / "circuit.json").read_text())
    doc["model"] = "some-other-model"
    (other / "circuit.json").write_text(json.dumps(doc))
    _refused(["compare-circuits", str(scan_folder), str(other)], capsys, "different models", tmp_path, seconds=120)


def test_compare_circuits_with_too_few_heads_outside_both_is_refused_before_the_model(scan_folder, tmp_path, capsys):
    _refused(["compare-circuits", str(scan_folder), str(scan_folder), "--top-k", "40"], capsys, "heads", tmp_path, seconds=120)


def test_hybrid_build_refuses_a_teacher_without_attention_before_scanning(tmp_path, capsys):
    """The teacher must be loaded to count its heads; nothing is scanned or trained before the refusal."""
    import time

    start = time.perf_counter()
    assert main(["--device", "cpu", "--quiet", "hybrid", "build", "--model", "zoo:mamba2-kv", "--k", "1", "--out",
                 str(tmp_path / "o")]) == 2
    out, err = capsys.readouterr()
    assert err.strip().startswith("gna: error: ") and "has no attention heads" in err and len(err.strip().splitlines()) == 1
    assert "scan" not in out.lower() and time.perf_counter() - start < 60
    assert not (tmp_path / "o").exists()
