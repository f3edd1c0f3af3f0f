"""A report never sinks a run: every part of report.html (and summary.md, the PNG files) is built in isolation. A
part that cannot be drawn is a note on the page and in summary.md and one ``gna: warning:`` line; the command exits 0
and the results files are untouched. A scan under ``--metric accuracy --strategy attribution`` (no head run exactly)
draws its graph and says nothing about single removals it did not measure."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from gna_interp.cli import main
from gna_interp.errors import ReportWarning

ZOO = "zoo:transformer-kv"
RESULT_FILES = ("scan.csv", "scan.json", "circuit.json", "views.pt")


@pytest.fixture(scope="module")
def attribution_scan(tmp_path_factory) -> Path:
    """A real `gna scan --metric accuracy --strategy attribution` folder of the zoo transformer (edges measured)."""
    out = tmp_path_factory.mktemp("acc") / "run"
    argv = ["--device", "cpu", "--quiet", "scan", "--model", ZOO, "--metric", "accuracy", "--strategy", "attribution",
            "--samples", "8", "--seeds", "1", "--calibrate", "0", "--top-k", "2", "--threads", "1", "--out", str(out)]
    assert main(argv) == 0
    return out


def test_an_accuracy_attribution_scan_writes_its_whole_report(attribution_scan):
    """No head ran exactly, so the accuracy drops are NaN: the graph sizes heads by their logit-difference drop (the
    edges' unit), the causal roles are measured against it, and the summary claims no single-removal verdict."""
    from gna_interp.circuits import Circuit

    page = (attribution_scan / "report.html").read_text(encoding="utf-8")
    summary = (attribution_scan / "summary.md").read_text(encoding="utf-8")
    assert "Not drawn" not in page and "Report notes" not in summary
    assert "gna-graph-data" in page and "NaN" not in page.split('id="gna-graph-data">')[1].split("</script>")[0]
    assert "not measured: no head was run exactly" in summary
    assert "survives every single removal" not in summary
    circuit = Circuit.load(attribution_scan)
    assert not circuit.scan.exact and pd.isna(circuit.to_frame()["drop"]).all()
    drops = circuit.edge_drops()
    assert all(pd.notna(v) for v in drops.values())
    roles = circuit.to_frame().dropna(subset=["causal_role"])
    assert "nan" not in " ".join(roles["causal_reason"])  # no comparison with a NaN drop
    assert {"aggregate", "gather"} <= set(roles["causal_role"])  # the zoo model's G&A pair, measured


def _fail(*_args, **_kwargs):
    raise ValueError("forced failure\nwith a second line")


# each part of the scan report, by the builder it calls (module attribute of gna_interp.report.build)
PARTS = {"heatmap": "score_heatmap", "head explorer": "head_explorer", "top table": "_top_table",
         "graph": "graph_section", "curve": "ablation_curve", "stability": "_stability_section", "cards": "ga_card",
         "patterns": "attention_heads", "model and task": "_summary", "summary.md": "circuit_summary",
         "png": "write_pngs"}


@pytest.mark.parametrize("part", sorted(PARTS))
def test_every_report_part_that_fails_is_a_note(part, attribution_scan, tmp_path, monkeypatch, capsys):
    import gna_interp.report.build as build

    folder = tmp_path / "run"
    shutil.copytree(attribution_scan, folder)
    before = {f: (folder / f).read_bytes() for f in RESULT_FILES}
    monkeypatch.setattr(build, PARTS[part], _fail)
    argv = ["report", str(folder)]
    if part == "png":
        monkeypatch.setattr(build, "png_export_problem", lambda: None)
    else:
        argv.append("--no-png")
    assert main(argv) == 0
    out, err = capsys.readouterr()
    warnings = [ln for ln in err.splitlines() if ln.startswith("gna: warning:")]
    assert len(warnings) == 1 and "forced failure with a second line" in warnings[0], err
    assert "Traceback" not in err
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert "Not drawn: ValueError: forced failure with a second line" in page
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    assert "## Report notes" in summary and "forced failure with a second line" in summary
    assert {f: (folder / f).read_bytes() for f in RESULT_FILES} == before  # the results stay as they were
    if part != "summary.md":
        assert "# G&A circuit:" in summary and "| rank | head |" in summary


def test_build_report_warns_in_python(attribution_scan, tmp_path, monkeypatch):
    import gna_interp.report.build as build

    folder = tmp_path / "run"
    shutil.copytree(attribution_scan, folder)
    monkeypatch.setattr(build, "ablation_curve", _fail)
    with pytest.warns(ReportWarning, match="Ablation curve"):
        build.build_report(folder, png=False)
    page = (folder / "report.html").read_text(encoding="utf-8")
    assert "<h2>Ablation curve</h2>" in page and "<h2>How the heads work together</h2>" in page


def test_a_png_export_that_writes_nothing_is_a_note(tmp_path, monkeypatch):
    """The exporter exits 0 without writing a figure: the missing files are named, nothing is read that is not
    there."""
    import plotly.graph_objects as go

    from gna_interp.viz import export

    monkeypatch.setattr(export, "png_export_problem", lambda: None)
    monkeypatch.setattr(export, "_CHILD", "import sys\n")
    with pytest.raises(RuntimeError, match="wrote no file for a, b"):
        export.write_pngs({"a": go.Figure(), "b": go.Figure()}, tmp_path / "figures")
    assert not list((tmp_path / "figures").glob("*.png"))


def test_an_experiment_page_with_a_figure_that_fails_is_written_whole(tmp_path, recwarn):
    from gna_interp.experiments.output import ResultFolder

    folder = ResultFolder(tmp_path / "exp", "eval")
    folder.write(pd.DataFrame({"k": [1, 2], "acc": [0.5, 0.25]}), {"note": "demo"}, title="demo",
                 figures={"broken": _fail}, png=False)
    page = folder.report.read_text(encoding="utf-8")
    assert "Not drawn: ValueError: forced failure with a second line" in page and "<h2>Table</h2>" in page
    assert folder.load()["frame"]["acc"].tolist() == [0.5, 0.25]
    assert any(issubclass(w.category, ReportWarning) for w in recwarn)


def test_summary_md_escapes_markup_it_did_not_write(attribution_scan, tmp_path):
    from gna_interp.report import build_report

    folder = tmp_path / "run"
    shutil.copytree(attribution_scan, folder)
    doc = json.loads((folder / "circuit.json").read_text())
    doc["notes"] = ["<script>alert(1)</script> **bold** \x1b[2J \u202eevil"]
    (folder / "circuit.json").write_text(json.dumps(doc))
    build_report(folder, png=False)
    summary = (folder / "summary.md").read_text(encoding="utf-8")
    assert "<script>" not in summary and "&lt;script&gt;" in summary and "\\*\\*bold\\*\\*" in summary
    assert "\x1b" not in summary and "\u202e" not in summary and "\\x1b" in summary


def test_terminal_output_escapes_control_characters(tmp_path, capsys):
    out = tmp_path / "a\x1b[2Jb\u202e"
    assert main(["report", str(out)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err and "\\x1b" in err
