"""Hostile output folders: an ``--out`` that is a file, a folder of another command's results, a finished
scan without its checkpoint, a folder with a link inside, a name too long. Each is refused before any model loads:
exit 2, one ``gna: error:`` line, no traceback, and no file in or outside the folder changed."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from gna_interp.cli import main
from gna_interp.run_folder import RESULTS, RunFolder, check_out_file

ZOO = "zoo:transformer-kv"

# The least each command needs to reach its --out check (before that, nothing is loaded).
COMMANDS: dict[str, list[str]] = {
    "scan": ["scan", "--model", ZOO],
    "eval": ["eval", "--model", ZOO, "--tasks", "arc_easy"],
    "prune": ["prune", "--model", ZOO],
    "mask": ["mask", "--model", ZOO, "--heads", "L1H3"],
    "sweep": ["sweep", "--model", ZOO],
    "compare": ["compare", "--model", f"{ZOO},zoo:mamba2-kv"],
    "hybrid build": ["hybrid", "build"],
    "hybrid plan": ["hybrid", "plan", "--model", "config:llama-3.2-1b", "--order", "random", "--seed", "0"],
    "zoo train": ["zoo", "train", "transformer-kv"],
    "compare-circuits": ["compare-circuits", "no-such-a", "no-such-b"],
    "circuit": ["circuit", "no-such-scan"],
}


def _snapshot(*roots: Path) -> dict[str, bytes | str]:
    """Every file (bytes) and link (target) under ``roots``."""
    out: dict[str, bytes | str] = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                p = Path(dirpath) / name
                out[str(p)] = os.readlink(p) if p.is_symlink() else (p.read_bytes() if p.is_file() else "dir")
    return out


def _refused(argv: list[str], capsys: pytest.CaptureFixture, needle: str, *watch: Path, seconds: float = 20) -> str:
    """Run ``gna argv``: exit 2 within ``seconds`` (no model loaded), one error line containing ``needle``,
    nothing under ``watch`` changed."""
    before = _snapshot(*watch)
    start = time.perf_counter()
    assert main(argv) == 2
    took = time.perf_counter() - start
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gna: error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    assert "loading" not in out, out  # refused before any model load
    assert took < seconds
    assert _snapshot(*watch) == before
    return lines[0]


def _copy(scan_folder: Path, tmp_path: Path) -> Path:
    """A copy of ``scan_folder`` to damage."""
    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    return folder


@pytest.fixture(scope="module")
def scan_folder(tiny_models, tmp_path_factory) -> Path:
    """A finished `gna scan` folder (made-up drops, real files), with its report."""
    from made_up import write_scan_folder

    from gna_interp.report import build_report

    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path_factory.mktemp("scan") / "run", model, model.heads())
    build_report(folder, png=False)
    return folder


@pytest.fixture(scope="module")
def plan_folder(tmp_path_factory) -> Path:
    """A real `gna hybrid plan` folder (a config model on the meta device: no weights)."""
    folder = tmp_path_factory.mktemp("plan") / "plan"
    assert main([*COMMANDS["hybrid plan"], "--out", str(folder)]) == 0
    assert (folder / "hybrid_plan.json").is_file() and (folder / "report.html").is_file()
    return folder


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_out_that_is_a_file_is_refused_before_the_model(command, tmp_path, capsys):
    f = tmp_path / "taken"
    f.write_text("someone's notes\n")
    _refused([*COMMANDS[command], "--out", str(f)], capsys, "is an existing file", tmp_path)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_empty_out_is_refused_before_the_model(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _refused([*COMMANDS[command], "--out", ""], capsys, "is empty", tmp_path)
    assert not any(tmp_path.iterdir())  # nothing written into the working directory


@pytest.mark.parametrize("command", [c for c in COMMANDS if c != "scan"])
def test_a_scan_folder_is_not_another_commands_out(command, scan_folder, tmp_path, capsys):
    """Any other command into a finished scan's folder would replace its report.html: refused, naming the scan."""
    folder = _copy(scan_folder, tmp_path)
    line = _refused([*COMMANDS[command], "--out", str(folder)], capsys, "holds the results of `gna scan`", folder)
    assert "--fresh" in line


def test_a_scan_is_not_written_into_a_hybrid_plan_folder(plan_folder, tmp_path, capsys):
    folder = tmp_path / "plan"
    shutil.copytree(plan_folder, folder)
    line = _refused([*COMMANDS["scan"], "--out", str(folder)], capsys, "holds the results of `gna hybrid plan`", folder)
    assert "hybrid_plan.json" in line and "--fresh" in line


def test_fresh_replaces_another_commands_results_and_only_them(scan_folder, tmp_path, capsys):
    """--fresh deletes the scan's files (report and figures included) and keeps anything else in the folder."""
    folder = _copy(scan_folder, tmp_path)
    (folder / "my-notes.txt").write_text("mine\n")
    assert main([*COMMANDS["hybrid plan"], "--out", str(folder), "--fresh"]) == 0
    names = {p.name for p in folder.iterdir()}
    assert not names & set(RESULTS["scan"]), names
    assert {"hybrid_plan.json", "hybrid_plan.csv", "report.html", "my-notes.txt"} <= names
    assert "Hybrid" in (folder / "report.html").read_text() or "hybrid" in (folder / "report.html").read_text()


def test_a_finished_scan_without_its_checkpoint_is_not_overwritten(scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    assert not (folder / "scan.ckpt.json").exists()
    line = _refused([*COMMANDS["scan"], "--out", str(folder)], capsys, "holds a finished gna scan", folder)
    assert "--fresh" in line
    line = _refused([*COMMANDS["scan"], "--out", str(folder), "--resume"], capsys, "no checkpoint to resume", folder)


@pytest.mark.parametrize("command", ["scan", "hybrid plan", "eval"])
def test_a_folder_link_inside_out_is_refused(command, tmp_path, capsys):
    """`DIR/figures` linked to another run's figures: the command would overwrite that run's PNGs."""
    other = tmp_path / "other" / "figures"
    other.mkdir(parents=True)
    (other / "heatmap.png").write_bytes(b"\x89PNG colleague's figure")
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "figures").symlink_to(other, target_is_directory=True)
    _refused([*COMMANDS[command], "--out", str(folder)], capsys, "'figures' is a symbolic link", tmp_path)


def test_report_refuses_a_figures_link_and_leaves_its_target(scan_folder, tmp_path, capsys):
    other = tmp_path / "other"
    other.mkdir()
    (other / "heatmap.png").write_bytes(b"\x89PNG colleague's figure")
    folder = _copy(scan_folder, tmp_path)
    shutil.rmtree(folder / "figures", ignore_errors=True)
    (folder / "figures").symlink_to(other, target_is_directory=True)
    _refused(["report", str(folder)], capsys, "'figures' is a symbolic link", tmp_path)


def test_a_dangling_out_link_is_refused(tmp_path, capsys):
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    _refused([*COMMANDS["scan"], "--out", str(tmp_path / "gone")], capsys, "does not exist", tmp_path)


@pytest.mark.parametrize("command", ["scan", "hybrid plan", "compare-circuits"])
def test_a_name_too_long_for_the_file_system_is_refused(command, tmp_path, capsys):
    _refused([*COMMANDS[command], "--out", str(tmp_path / ("x" * 300))], capsys, "pick a shorter path", tmp_path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_parent_is_refused(tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        _refused([*COMMANDS["scan"], "--out", str(ro / "run")], capsys, "cannot write into", tmp_path)
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("kind", ["folder", "root", "dangling link", "link to a file"])
def test_patterns_out_is_checked_before_the_model_loads(kind, tmp_path, capsys):
    target = {"folder": tmp_path / "adir", "root": Path("/"), "dangling link": tmp_path / "dangling",
              "link to a file": tmp_path / "link"}[kind]
    if kind == "folder":
        target.mkdir()
    elif kind == "dangling link":
        target.symlink_to(tmp_path / "nowhere")
    elif kind == "link to a file":
        (tmp_path / "precious.html").write_text("keep me")
        target.symlink_to(tmp_path / "precious.html")
    needle = "is a folder" if kind in ("folder", "root") else "is a symbolic link"
    _refused(["patterns", "--model", ZOO, "--prompt", "a:1\nb:2\nThe value of the key 'a' is", "--out", str(target)],
             capsys, needle, tmp_path)


def test_compare_circuits_out_is_checked_before_the_circuits_and_the_model(scan_folder, tmp_path, capsys):
    f = tmp_path / "compare"
    f.write_text("not a folder")
    _refused(["compare-circuits", str(scan_folder), str(scan_folder), "--out", str(f)], capsys, "is an existing file",
             tmp_path, scan_folder)


def test_run_folder_checks_touch_nothing(scan_folder, tmp_path):
    """The checks read only: a refused or accepted check leaves the folder as it was (no lock, no folder made)."""
    fresh = tmp_path / "new" / "run"
    RunFolder(fresh, "scan").check()
    assert not (tmp_path / "new").exists()
    before = _snapshot(scan_folder)
    RunFolder(scan_folder, "scan").check(fresh=True)
    assert _snapshot(scan_folder) == before
    assert check_out_file(tmp_path / "p.html") == tmp_path / "p.html" and not (tmp_path / "p.html").exists()


# ---- one validating reader: every field against its schema, the files of one run tied by its run id -----------

def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _set(key, value):
    def change(doc):
        doc[key] = value
    return change


def _report_refused(folder: Path, capsys, needle: str) -> str:
    return _refused(["report", str(folder), "--no-png"], capsys, needle, folder)


def _damaged_json_refused(scan_folder: Path, tmp_path: Path, capsys, name: str, change, needle: str) -> None:
    """A copy of the scan folder whose ``name`` was edited by ``change``: `gna report` refuses it, naming the file."""
    folder = _copy(scan_folder, tmp_path)
    _edit_json(folder / name, change)
    assert name in _report_refused(folder, capsys, needle)


@pytest.fixture(scope="module")
def second_run(tiny_models, tmp_path_factory) -> Path:
    """Another saved circuit of the same model and heads (its own run id)."""
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    return write_scan_folder(tmp_path_factory.mktemp("scan2") / "run", model, model.heads())


@pytest.mark.parametrize("name", ["scan.json", "views.pt"])
def test_a_file_from_another_run_is_refused(name, scan_folder, second_run, tmp_path, capsys):
    """Same model, same heads, same head count: only the run id tells the copied file apart."""
    folder = _copy(scan_folder, tmp_path)
    shutil.copy(second_run / name, folder / name)
    line = _report_refused(folder, capsys, "comes from another run")
    assert name in line and "mixes two runs" in line


CIRCUIT_CASES = [
    ("scan_rows as text", _set("scan_rows", "12"), "field 'scan_rows': '12' is not of type 'integer'"),
    ("scan_rows negative", _set("scan_rows", -1), "field 'scan_rows'"),
    ("model missing", lambda d: d.pop("model"), "'model' is a required property"),
    ("model a number", _set("model", 7), "field 'model'"),
    ("task a list", _set("task", []), "field 'task'"),
    ("baseline a list", _set("baseline", [0.5]), "field 'baseline'"),
    ("baseline text value", lambda d: d["baseline"].update(accuracy="0.9"), "field 'baseline/accuracy'"),
    ("rule with an unknown field", lambda d: d["rule"].update(x=1), "field 'rule'"),
    ("rule value text", lambda d: d["rule"].update(aggregate_min="high"), "field 'rule/aggregate_min'"),
    ("circuit head misspelt", _set("circuit", ["L1H1", "head seven"]), "field 'circuit/1'"),
    ("notes not text", _set("notes", ["fine", 2]), "field 'notes/1'"),
    ("generic_fraction above 1", _set("generic_fraction", 3.5), "field 'generic_fraction'"),
    ("heads rows not objects", _set("heads", [{}, 2]), "field 'heads/1'"),
    ("curve a string", _set("curve", "top"), "field 'curve'"),
    ("run id missing", lambda d: d.pop("run_id"), "'run_id' is a required property"),
    ("run id not hex", _set("run_id", "../../x"), "field 'run_id'"),
    ("calibration chooses no row", _set("calibration", {"rows": [], "chosen": 0}), "field 'calibration/rows'"),
    ("formats entry not an object", _set("formats", ["format0.json"]), "field 'formats/0'"),
    ("views a number", _set("views", 7), "field 'views'"),
]


@pytest.mark.parametrize("change, needle", [c[1:] for c in CIRCUIT_CASES], ids=[c[0] for c in CIRCUIT_CASES])
def test_circuit_json_fields_are_checked(change, needle, scan_folder, tmp_path, capsys):
    _damaged_json_refused(scan_folder, tmp_path, capsys, "circuit.json", change, needle)


@pytest.mark.parametrize("literal, needle", [("NaN", "NaN is not a JSON number"), ("Infinity", "Infinity"),
                                             ("1e999", "overflows a float"), ("-1e400", "overflows a float")])
def test_non_finite_numbers_are_refused(literal, needle, scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    text = (folder / "circuit.json").read_text()
    doc = json.loads(text)
    doc["baseline"]["accuracy"] = "@@"
    (folder / "circuit.json").write_text(json.dumps(doc).replace('"@@"', literal))
    _report_refused(folder, capsys, needle)


def test_json_nested_too_deeply_is_refused(scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    _edit_json(folder / "circuit.json", _set("twin", "@@"))
    text = (folder / "circuit.json").read_text().replace('"@@"', "[" * 100000 + "]" * 100000)
    (folder / "circuit.json").write_text(text)
    _report_refused(folder, capsys, "nests its JSON too deeply")


SCAN_CASES = [
    ("heads a string", _set("heads", "L1H1"), "field 'heads'"),
    ("a head misspelt", lambda d: d["heads"].__setitem__(0, "L1X"), "field 'heads/0'"),
    ("model missing", lambda d: d.pop("model"), "'model' is a required property"),
    ("estimates text", lambda d: d.__setitem__("estimates", {"L0H0": "big"}), "field 'estimates/L0H0'"),
    ("per-sample bools as numbers", lambda d: d["baseline"].__setitem__("correct", [1, 0, 1, 1]),
     "field 'baseline/correct/0'"),
    ("an unknown per-sample list", lambda d: d["baseline"].__setitem__("extra", [1]), "field 'baseline'"),
    ("a shorter exact list", lambda d: next(iter(d["exact"].values()))["logit_diff"].pop(),
     "per-sample values where the baseline has 4"),
    ("results for a head not scanned", lambda d: d["exact"].__setitem__("L9H9", d["baseline"]),
     "L9H9, which is not among the scanned heads"),
    ("a baseline of uneven lists", lambda d: d["baseline"]["logit_diff"].append(1.0), "different lengths"),
]


@pytest.mark.parametrize("change, needle", [c[1:] for c in SCAN_CASES], ids=[c[0] for c in SCAN_CASES])
def test_scan_json_fields_are_checked(change, needle, scan_folder, tmp_path, capsys):
    _damaged_json_refused(scan_folder, tmp_path, capsys, "scan.json", change, needle)


VIEWS_CASES = [
    ("segments not a list", lambda d: d.__setitem__("segments", "x"), "field 'segments'"),
    ("gold negative", lambda d: d.__setitem__("gold", [-1, 0]), "field 'gold/0'"),
    ("a token not text", lambda d: d["patterns"]["str_tokens"][0].__setitem__(0, 7), "field 'patterns/str_tokens/0/0'"),
    ("patterns not a tensor", lambda d: d["patterns"].__setitem__("patterns", [[0.5]]), "field 'patterns/patterns'"),
    ("pair of three", lambda d: d.__setitem__("pair", ["L0H0", "L0H1", "L1H0"]), "field 'pair'"),
    ("why missing", lambda d: d.pop("why"), "'why' is a required property"),
]


@pytest.mark.parametrize("change, needle", [c[1:] for c in VIEWS_CASES], ids=[c[0] for c in VIEWS_CASES])
def test_views_fields_are_checked(change, needle, scan_folder, tmp_path, capsys):
    import torch

    folder = _copy(scan_folder, tmp_path)
    doc = torch.load(folder / "views.pt", weights_only=True)
    change(doc)
    torch.save(doc, folder / "views.pt")
    line = _report_refused(folder, capsys, needle)
    assert "views.pt" in line


# ---- the model cache: a damaged entry is named with the fix, a read-only cache is found before the work ----------

def _fake_gguf(tmp_path: Path) -> Path:
    """A file that passes the GGUF magic check (what happens after it is the cache's business)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 64)
    return path


def test_a_damaged_cache_entry_is_named_with_the_fix(tiny_dirs, tmp_path, monkeypatch, capsys):
    from gna_interp.models.loading import _gguf_cache_key

    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "cache"))
    gguf = _fake_gguf(tmp_path)
    entry = tmp_path / "cache" / "gguf" / _gguf_cache_key(gguf)
    shutil.copytree(tiny_dirs["llama"], entry)
    weights = next(entry.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 3])  # a copy cut short
    line = _refused(["patterns", "--model", str(gguf), "--prompt", "a:1", "--out", str(tmp_path / "p.html")], capsys,
                    "cannot be loaded", tmp_path)
    assert str(entry) in line and "delete that folder and rerun" in line


def test_a_cache_that_cannot_be_written_is_refused_before_the_conversion(tmp_path, monkeypatch, capsys):
    (tmp_path / "not-a-folder").write_text("x")
    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "not-a-folder" / "cache"))
    gguf = _fake_gguf(tmp_path)
    line = _refused(["patterns", "--model", str(gguf), "--prompt", "a:1", "--out", str(tmp_path / "p.html")], capsys,
                    "cannot be written", tmp_path, seconds=5)
    assert "set GNA_CACHE" in line


def test_an_offline_hub_id_in_the_local_cache_loads(tiny_dirs, tmp_path, monkeypatch):
    """With the hub unreachable (HF_HUB_OFFLINE), a hub id that the Hugging Face cache holds loads from it, with the
    same logits as its folder; one that it does not hold is refused saying so."""
    import torch
    from huggingface_hub import constants

    from gna_interp import load_model
    from gna_interp.errors import ModelUnavailableError

    repo = tmp_path / "hub" / "models--someone--tiny-llama"
    snap = repo / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_dirs["llama"], snap)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    model = load_model("someone/tiny-llama", device="cpu")
    ref = load_model(str(tiny_dirs["llama"]), device="cpu")
    ids = torch.tensor([[1, 5, 9, 2, 7]])
    assert torch.equal(model.forward(ids), ref.forward(ids))
    with pytest.raises(ModelUnavailableError, match="not in the local Hugging Face cache"):
        load_model("someone/not-downloaded", device="cpu")


# ---- more hostile result folders ------------------------------------------------------------------------------

REVIEW_CIRCUIT_CASES = [
    ("a negative layer in a table row", lambda d: d["heads"][0].update(layer=-1), "field 'heads/0/layer'"),
    ("a row's layer contradicts its name", lambda d: d["heads"][0].update(layer=d["heads"][0]["layer"] + 1),
     "do not agree"),
    ("the circuit names a head never scanned", lambda d: d["circuit"].insert(0, "L9H9"), "not among the"),
    ("an unknown task kind", lambda d: d["task"].update(kind="evil"), "field 'task/kind'"),
    ("a boolean count", _set("n_samples", True), "field 'n_samples'"),
    ("views named by an empty string", _set("views", ""), "field 'views'"),
    ("a task that cannot be rebuilt", lambda d: d["task"]["args"].update(max_value=10 ** 30), "field 'task'"),
    ("a model name of a million characters", _set("model", "m" * 1_000_000), "field 'model'"),
]


@pytest.mark.parametrize("change, needle", [c[1:] for c in REVIEW_CIRCUIT_CASES], ids=[c[0] for c in REVIEW_CIRCUIT_CASES])
def test_circuit_json_contradictions_are_refused(change, needle, scan_folder, tmp_path, capsys):
    _damaged_json_refused(scan_folder, tmp_path, capsys, "circuit.json", change, needle)


def test_a_key_written_twice_is_refused(scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    text = (folder / "circuit.json").read_text()
    (folder / "circuit.json").write_text(text.replace('{', '{"model": "zoo:mamba2-kv", ', 1))
    _report_refused(folder, capsys, "appears twice")


@pytest.mark.parametrize("kind", ["folder", "fifo"])
def test_a_result_file_that_is_no_regular_file_is_named_so(kind, scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    (folder / "scan.json").unlink()
    if kind == "folder":
        (folder / "scan.json").mkdir()
    else:
        os.mkfifo(folder / "scan.json")
    _report_refused(folder, capsys, "is a folder" if kind == "folder" else "not a regular file")


def test_a_file_linked_from_another_run_is_refused_before_it_is_opened(scan_folder, second_run, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    (folder / "scan.json").unlink()
    (folder / "scan.json").symlink_to(second_run / "scan.json")
    _report_refused(folder, capsys, "is a symbolic link")


@pytest.mark.parametrize("damage, needle", [
    (lambda d: d["patterns"].__setitem__("patterns", d["patterns"]["patterns"][..., :-1]), "not ["),
    (lambda d: d["patterns"]["patterns"].__setitem__((0, 0, 0, 0), float("nan")), "NaN or infinite"),
    (lambda d: d.__setitem__("gold", [99] * len(d["gold"])), "not among its"),
    (lambda d: d.__setitem__("view", ["L2H0"] + d["view"][1:]) if "L2H0" not in d["patterns"]["heads"] else
     d.__setitem__("view", ["L9H9"]), "holds no pattern"),
], ids=["shape", "nan", "answer", "view head"])
def test_views_that_contradict_themselves_are_refused(damage, needle, scan_folder, tmp_path, capsys):
    import torch

    folder = _copy(scan_folder, tmp_path)
    doc = torch.load(folder / "views.pt", weights_only=True)
    damage(doc)
    torch.save(doc, folder / "views.pt")
    line = _report_refused(folder, capsys, needle)
    assert "views.pt" in line


def test_a_pickle_payload_is_refused_in_one_line(scan_folder, tmp_path, capsys):
    import pickle

    folder = _copy(scan_folder, tmp_path)
    marker = tmp_path / "PWNED"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (folder / "views.pt").write_bytes(pickle.dumps(Payload()))
    _report_refused(folder, capsys, "cannot be read as a tensor bundle")
    assert not marker.exists()


@pytest.mark.parametrize("where", ["figures is a file", "figures is a dangling link", "report.html is a folder"])
def test_report_targets_that_cannot_take_its_files_are_refused_before_writing(where, scan_folder, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    shutil.rmtree(folder / "figures", ignore_errors=True)
    if where == "figures is a file":
        (folder / "figures").write_text("not a folder")
    elif where == "figures is a dangling link":
        (folder / "figures").symlink_to(tmp_path / "nowhere")
    else:
        (folder / "report.html").unlink()
        (folder / "report.html").mkdir()
    _report_refused(folder, capsys, "figures" if "figures" in where else "report.html")


def test_report_waits_for_a_live_writer(scan_folder, tmp_path, capsys):
    from made_up import held_lock

    folder = _copy(scan_folder, tmp_path)
    with held_lock(folder):
        _report_refused(folder, capsys, "in use by another gna process")


def test_a_png_that_is_a_link_is_replaced_not_written_through(scan_folder, tmp_path):
    from gna_interp.report import build_report
    from gna_interp.viz.export import png_export_problem

    if png_export_problem():
        pytest.skip(png_export_problem())
    folder = _copy(scan_folder, tmp_path)
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"a colleague's figure")
    (folder / "figures").mkdir(exist_ok=True)
    (folder / "figures" / "heatmap.png").unlink(missing_ok=True)
    (folder / "figures" / "heatmap.png").symlink_to(victim)
    build_report(folder)
    assert victim.read_bytes() == b"a colleague's figure"
    png = folder / "figures" / "heatmap.png"
    assert not png.is_symlink() and png.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("fresh", [False, True])
def test_compare_circuits_out_may_not_be_one_of_its_inputs(fresh, scan_folder, second_run, tmp_path, capsys):
    folder = _copy(scan_folder, tmp_path)
    argv = ["compare-circuits", str(folder), str(second_run), "--out", str(folder)] + (["--fresh"] if fresh else [])
    _refused(argv, capsys, "is the input", tmp_path)


def test_sweep_runs_on_the_circuits_own_model(scan_folder, monkeypatch, tmp_path, capsys):
    """Without --model, `gna sweep --circuit DIR` removes the heads from the model the circuit was found on."""
    import gna_interp.experiments.sweep as sweep_mod
    from gna_interp.circuits import Circuit
    from gna_interp.errors import InputError

    def fake(spec, **kwargs):
        raise InputError(f"sweep would run on {spec}")

    monkeypatch.setattr(sweep_mod, "sweep", fake)
    main(["sweep", "--circuit", str(scan_folder), "--out", str(tmp_path / "sw"), "--pairs", "4", "--max-value", "20"])
    assert f"sweep would run on {Circuit.load(scan_folder).model}" in capsys.readouterr().err


@pytest.mark.parametrize("names", ["L0H3,", "L0H3,,L1H3", ","])
def test_an_empty_head_name_between_commas_is_refused(names):
    from gna_interp.errors import HeadError
    from gna_interp.models.heads import parse_heads

    with pytest.raises(HeadError):
        parse_heads(names)


def test_a_device_as_model_is_named_so(capsys, tmp_path):
    _refused(["patterns", "--model", "/dev/null", "--prompt", "a:1", "--out", str(tmp_path / "p.html")], capsys,
             "neither a file nor a folder", tmp_path)
