"""`gna circuit` as a folder it owns: every file written through the store (never through a link), a second run
refused without --resume / --fresh, an interrupted run resumed with its finished stages read back, the scan read
once (a scan folder replaced meanwhile does not mix in), bounds checked before the model loads; and the faithfulness
files' strict JSON and clear errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from gna_interp.circuits.search.sufficiency import Faithfulness
from gna_interp.cli import main
from gna_interp.errors import InputError

LIGHT = ["--sizes", "1,2", "--seeds", "0", "--minimality", "0", "--edges", "0", "--verify", "6", "--edge-seeds", "0",
         "--edge-minimality", "0", "--samples", "3", "--threshold", "0.5"]


@pytest.fixture(scope="module")
def scan(tiny_models, tmp_path_factory) -> Path:
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    return write_scan_folder(tmp_path_factory.mktemp("scan") / "scan", model, model.heads())


@pytest.fixture(scope="module")
def done(scan, tmp_path_factory) -> Path:
    """One finished light run."""
    out = tmp_path_factory.mktemp("done") / "c"
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT]) == 0
    return out


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_outputs_named_by_links_replace_the_links_and_leave_their_targets(scan, done, tmp_path):
    """--out holding links named like its outputs: each link is replaced by the new file; what they pointed at,
    outside --out, is untouched."""
    out = tmp_path / "out"
    out.mkdir()
    names = ["faithfulness.csv", "faithfulness.md", "faithfulness.html", "edge_screen.csv", "edge_graph.html",
             "edge_faithfulness.md", "circuit_run.json"]
    victims = {}
    for name in names:
        victim = tmp_path / f"victim-{name}"
        victim.write_text("precious")
        (out / name).symlink_to(victim)
        victims[name] = victim
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT, "--fresh"]) == 0
    for name, victim in victims.items():
        assert victim.read_text() == "precious", name
        assert (out / name).is_file() and not (out / name).is_symlink(), name


def test_a_second_run_takes_resume_or_fresh(scan, done, tmp_path, capsys):
    out = _copy(done, tmp_path / "again")
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT, "--fresh"]) == 0
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT, "--fresh"]) == 0  # twice into one folder
    capsys.readouterr()
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT, "--resume"]) == 0
    assert "resumed: faithfulness, screen, edge_circuits" in capsys.readouterr().out
    other = [a if a != "0.5" else "0.6" for a in LIGHT]
    assert main(["circuit", str(scan), "--out", str(out), *other, "--resume"]) == 2
    assert "threshold 0.5 there, 0.6 now" in capsys.readouterr().err


def test_an_interrupted_run_resumes_with_its_finished_stages(scan, done, tmp_path, monkeypatch, capsys):
    """Stopped during the screen: --resume reads the faithfulness curve back (not measured again) and finishes with
    the same files a run through gives."""
    import gna_interp.circuits.edges.edge_screen as es
    import gna_interp.circuits.search.sufficiency as suff

    out = tmp_path / "cut"
    real = es.screen_edges

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(es, "screen_edges", stop)
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT]) == 130
    assert (out / "faithfulness.json").is_file() and not (out / "edge_screen.csv").exists()
    monkeypatch.setattr(es, "screen_edges", real)

    def never(*a, **k):
        raise AssertionError("a finished stage ran again")

    monkeypatch.setattr(suff, "faithfulness", never)
    capsys.readouterr()
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT, "--resume"]) == 0
    assert "resumed: faithfulness" in capsys.readouterr().out
    for name in ("edge_screen.csv", "faithfulness.csv", "edge_faithfulness.csv"):
        assert (out / name).read_text() == (done / name).read_text(), name
    assert set(json.loads((out / "circuit_run.json").read_text())["profile"]) >= {"faithfulness", "screen"}


def test_each_stage_that_ran_records_what_it_cost(done, tiny_models):
    """circuit_run.json's profile: every stage that ran, with the blocks it ran (a faithfulness point is one forward
    of the light run's 3 prompts through every block, so at least ``n_layers`` calls of 3 rows)."""
    run = json.loads((done / "circuit_run.json").read_text())
    assert set(run["profile"]) == set(run["stages"])
    n_layers = tiny_models["llama"].n_layers
    fx = run["profile"]["faithfulness"]
    assert fx["block_calls"] >= n_layers and fx["block_rows"] >= 3 * n_layers and fx["cpu_s"] > 0
    assert all(c["wall_s"] > 0 and c["peak_rss_mb"] > 0 for c in run["profile"].values())


def test_a_scan_replaced_while_it_runs_does_not_mix_in(scan, tiny_models, tmp_path, monkeypatch, capsys):
    """The scan folder swapped for another finished scan during the run: whole_circuit/ holds the scan that was read
    (its run id), and the run says the folder changed."""
    import shutil

    import gna_interp.circuits.edges.edge_screen as es
    from made_up import write_scan_folder

    mine = _copy(scan, tmp_path / "scan")
    before = json.loads((mine / "circuit.json").read_text())["run_id"]
    real = es.screen_edges

    def swap(*a, **k):
        shutil.rmtree(mine)
        model = tiny_models["llama"]
        write_scan_folder(mine, model, model.heads()[:6])
        return real(*a, **k)

    monkeypatch.setattr(es, "screen_edges", swap)
    out = tmp_path / "out"
    assert main(["circuit", str(mine), "--out", str(out), *LIGHT, "--threshold", "0.01"]) == 0
    assert json.loads((mine / "circuit.json").read_text())["run_id"] != before
    assert json.loads((out / "whole_circuit" / "circuit.json").read_text())["run_id"] == before
    assert "changed while gna circuit ran" in capsys.readouterr().out


def test_a_scan_being_written_is_refused(scan, tmp_path, capsys):
    from gna_interp.run_folder import Lock

    mine = _copy(scan, tmp_path / "scan")
    with Lock(mine):  # as a gna scan writing there holds it
        assert main(["circuit", str(mine), "--out", str(tmp_path / "o"), *LIGHT]) == 2
    assert "being written by another gna process" in capsys.readouterr().err
    assert not (mine / ".gna.lock").exists()


def test_what_is_not_a_scan_is_named_with_the_command_that_makes_one(done, tmp_path, capsys):
    for bad in (done, tmp_path / "missing", done / "faithfulness.json"):
        assert main(["circuit", str(bad), "--out", str(tmp_path / "o")]) == 2
        err = capsys.readouterr().err
        assert "gna scan --out" in err, err


@pytest.mark.parametrize("argv, says", [
    (["--samples", "999999"], "has 4 prompts"),
    (["--ig-steps", "1000000"], "at most 1,000"),
    (["--threads", "1000000"], "the CPU cores"),
])
def test_counts_past_what_exists_are_refused_before_the_model_loads(scan, tmp_path, monkeypatch, capsys, argv, says):
    import gna_interp.cli.args as cli_args

    def no_load(*a, **k):
        raise AssertionError("the model loaded")

    monkeypatch.setattr(cli_args, "load_for", no_load)
    assert main(["circuit", str(scan), "--out", str(tmp_path / "o"), *argv]) == 2
    assert says in capsys.readouterr().err


# ---- Faithfulness files -------------------------------------------------------------------------------------------

def test_faithfulness_saves_strict_json_and_reads_it_back(done, tmp_path):
    fx = Faithfulness.load(done)
    fx.intact["logit_diff"][0] = math.nan
    path = fx.save(tmp_path / "f.json")
    text = path.read_text()
    assert "NaN" not in text and json.loads(text)["intact"]["logit_diff"][0] is None
    back = Faithfulness.load(path)
    assert math.isnan(back.intact["logit_diff"][0]) and back.to_frame().shape == fx.to_frame().shape


def test_faithfulness_save_never_writes_through_a_link_and_refuses_a_file_parent(done, tmp_path):
    fx = Faithfulness.load(done)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "f.json").symlink_to(victim)
    fx.save(tmp_path / "f.json")
    assert victim.read_text() == "precious" and not (tmp_path / "f.json").is_symlink()
    with pytest.raises(InputError, match="is not a folder"):
        fx.save(victim / "x.json")
    with pytest.raises(InputError, match="is not a folder"):
        fx.write(victim)


@pytest.mark.parametrize("content, says", [
    ('{"format": "faithfulness", "format_version": 2, "metric": ', "cannot be read as JSON"),
    ("[1, 2]", "holds a list"),
    ("DROP_POINTS", "points"),
    ("BAD_MEMBER", "not a valid faithfulness file"),
    ("SHORT", "differ in length"),
])
def test_faithfulness_load_refuses_malformed_files(done, tmp_path, content, says):
    doc = json.loads((done / "faithfulness.json").read_text())
    if content == "DROP_POINTS":
        del doc["points"]
    elif content == "BAD_MEMBER":
        doc["smallest"] = ["not a head"]
    elif content == "SHORT":
        doc["points"][0]["results"]["logit_diff"] = doc["points"][0]["results"]["logit_diff"][:1]
    path = tmp_path / "faithfulness.json"
    path.write_text(content if not content.isupper() else json.dumps(doc))
    with pytest.raises(InputError, match=says) as e:
        Faithfulness.load(path)
    assert str(path) in str(e.value)


def test_faithfulness_load_of_an_empty_folder_names_the_file(tmp_path):
    with pytest.raises(InputError, match="faithfulness.json' does not exist"):
        Faithfulness.load(tmp_path)


def test_an_edge_whose_effect_lies_far_outside_its_interval_is_refused(tiny_models, tmp_path):
    """circuit.json's edge table (effect 23.0, interval [0, 1]) is refused when the folder is read, so `gna report`
    never draws it."""
    from gna_interp.circuits import Circuit
    from made_up import edited_copy, write_scan_folder

    model = tiny_models["llama"]
    src = write_scan_folder(tmp_path / "src", model, model.heads())

    def edit(doc):
        doc["edges"] = [{"edge": "L0H0 -> logits", "sender": "L0H0", "receiver": "logits", "input": "logits",
                         "positions": "all", "effect": 23.0, "low": 0.0, "high": 1.0}]

    bad = edited_copy(src, tmp_path / "bad", edit)
    with pytest.raises(InputError, match="far outside its own interval"):
        Circuit.load(bad)
    assert main(["report", str(bad)]) == 2


def test_a_finished_folder_reads_back_as_one_result(done, scan, tmp_path):
    """Sufficiency.load: the folder's curves, screen and edge curve as the run wrote them; its table holds both
    curves; its display names the smallest circuits; a folder with no finished stage is refused."""
    from gna_interp.experiments.sufficiency_run import Sufficiency

    res = Sufficiency.load(done)
    assert res.faithfulness.to_frame().equals(Faithfulness.load(done).to_frame())
    assert res.screen is not None and len(res.screen.table) and res.edge_faithfulness is not None
    assert res.screen.agreement().loc["all", "n"] == res.screen.verified().shape[0]
    frame = res.to_frame()
    assert set(frame["unit"]) == {"heads", "edges"} and len(frame) == len(res.faithfulness.to_frame()) + len(
        res.edge_faithfulness.to_frame())
    html = res._repr_html_()
    assert "smallest ranked circuit" in html and "<script" not in html
    with pytest.raises(InputError, match="does not exist"):
        Sufficiency.load(tmp_path)
