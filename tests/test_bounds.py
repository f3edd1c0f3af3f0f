"""Bounds everywhere: every number read from a result folder is range-checked by its schema (accuracies in
[0, 1], counts bounded, no integer past int64), a lock that is a folder is refused, prompt counts are bounded before
any work, and a damaged model folder (a config asking for 200,000 layers or negative heads, a truncated safetensors
file) is refused naming the broken file -- each within seconds, as a GnaError (exit 2 from the CLI)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any, Callable

import pytest

import gna_interp as gna
from gna_interp.cli import main
from gna_interp.errors import GnaError, InputError, ModelPathError

CAL = {"rows": [{"form": {"template": "completion", "n_pairs": 4}, "task": "kv4", "accuracy": 0.8, "chance": 0.25,
                 "n_samples": 16, "tokens": 40.0, "verdict": "chosen"}], "chosen": 0, "named": {}, "saturated": 0.95,
       "seconds": 1.0, "skipped": []}


@pytest.fixture(scope="module")
def scan_folder(tiny_models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    return write_scan_folder(tmp_path_factory.mktemp("bounds") / "run", model, model.heads())


def _row(**change: Any) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        cal = json.loads(json.dumps(CAL))
        cal["rows"][0].update(change)
        doc["calibration"] = cal
    return edit


def _at(*path: Any, value: Any) -> Callable[[dict], None]:
    def edit(doc: dict) -> None:
        node = doc
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


CASES = [
    ("calibration accuracy 7.5", _row(accuracy=7.5), "field 'calibration/rows/0/accuracy': 7.5 is greater than"),
    ("calibration accuracy -3", _row(accuracy=-3), "field 'calibration/rows/0/accuracy': -3 is less than"),
    ("calibration chance 2", _row(chance=2), "field 'calibration/rows/0/chance'"),
    ("calibration prompts 10**9", _row(n_samples=10**9), "field 'calibration/rows/0/n_samples'"),
    ("baseline accuracy above 1", _at("baseline", "accuracy", value=1.5), "field 'baseline/accuracy'"),
    ("baseline chance 3 (was: math domain error)", _at("baseline", "chance", value=3), "field 'baseline/chance'"),
    ("a huge integer (was: OverflowError)", _at("baseline", "logit_diff", value=10**400),
     "field 'baseline' (at 'baseline/logit_diff') holds an integer of 401 digits"),
    ("a huge seed", _at("seed", value=-(10**30)), "field 'seed' holds an integer of 31 digits"),
    ("a task of 10**9 prompts", _at("task", "args", "n_samples", value=10**9), "field 'task/args/n_samples'"),
    ("n_samples 10**9", _at("n_samples", value=10**9), "field 'n_samples'"),
    ("a curve of 10**12 heads", lambda d: d["curve"][0].update(k=10**12), "field 'curve/0/k'"),
    ("a curve accuracy of 5", lambda d: d["curve"][0].update(accuracy=5), "field 'curve/0/accuracy'"),
    ("a role score that is an object", lambda d: d["roles"][0].update(gather={"x": 1}), "field 'roles/0/gather'"),
    ("a twin without its numbers", _at("twin", value={"accuracy": 5, "task": "x"}), "field 'twin'"),
]


@pytest.mark.parametrize("edit, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_numbers_out_of_range_are_refused_on_load_naming_the_field(edit, needle, scan_folder, tmp_path, capsys):
    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    doc = json.loads((folder / "circuit.json").read_text())
    edit(doc)
    (folder / "circuit.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="circuit.json") as e:
        gna.Circuit.load(folder)
    assert needle in str(e.value)
    start = time.perf_counter()
    assert main(["report", str(folder), "--no-png"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], lines
    assert time.perf_counter() - start < 10


def test_a_valid_calibration_still_renders(scan_folder, tmp_path):
    from gna_interp.report import build_report

    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    doc = json.loads((folder / "circuit.json").read_text())
    doc["calibration"] = CAL
    (folder / "circuit.json").write_text(json.dumps(doc))
    assert gna.Circuit.load(folder).calibration.rows[0].accuracy == 0.8
    assert build_report(folder, png=False).is_file()


@pytest.mark.parametrize("file, edit, needle", [
    ("scan.json", lambda d: d.__setitem__("baseline", None), "field 'baseline' is empty"),
    ("scan.json", lambda d: next(iter(d["exact"].values())).clear(), "'logit_diff' is a required property"),
    ("scan.json", lambda d: d["baseline"].__setitem__("logit_diff", [2.0, 10**400, 1.0, 1.0]), "401 digits"),
])
def test_scan_records_a_metric_cannot_read_are_refused(file, edit, needle, scan_folder, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    doc = json.loads((folder / file).read_text())
    edit(doc)
    (folder / file).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=file) as e:
        gna.Circuit.load(folder)
    assert needle in str(e.value)


def test_a_lock_that_is_a_folder_is_refused(scan_folder, tmp_path, capsys):
    from gna_interp.run_folder import Lock

    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    (folder / ".gna.lock").mkdir()
    with pytest.raises(InputError, match="is a folder, not gna's lock file"):
        Lock(folder).check()
    with pytest.raises(InputError, match="is a folder, not gna's lock file"):
        with Lock(folder):
            pass
    assert main(["report", str(folder), "--no-png"]) == 2
    assert "is a folder, not gna's lock file" in capsys.readouterr().err
    assert (folder / ".gna.lock").is_dir()  # left where it was


def test_prompt_counts_and_values_are_bounded_before_any_work():
    start = time.perf_counter()
    for args, needle in [((5, 10**9), "too large"), ((10_001, 2), "too large"), ((10_000, 100_000), "dictionary lines"), ((50, 10_000), "dictionary lines"),
                         ((5, 8, 0, "official", 10**12), "max_value must be in")]:
        with pytest.raises(InputError, match=needle):
            gna.KVRetrieval(*args)
    assert gna.KVRetrieval(3, 2, max_value=10**9).samples  # a wide value range draws without a billion-item list
    assert time.perf_counter() - start < 5


def _damaged(tiny_dirs: dict[str, Path], tmp_path: Path, edit: Callable[[Path], None]) -> Path:
    folder = tmp_path / "model"
    shutil.copytree(tiny_dirs["llama"], folder)
    edit(folder)
    return folder


def _config(**change: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        cfg = json.loads((folder / "config.json").read_text())
        cfg.update(change)
        (folder / "config.json").write_text(json.dumps(cfg))
    return edit


def _truncate(keep: float) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        f = folder / "model.safetensors"
        data = f.read_bytes()
        f.write_bytes(data[:int(len(data) * keep)])
    return edit


@pytest.mark.parametrize("edit, file, needle, meta_too", [
    (_config(num_hidden_layers=200_000), "config.json", "field 'num_hidden_layers' is 200000", True),
    (_config(num_attention_heads=-4), "config.json", "field 'num_attention_heads' is -4", True),
    (_config(hidden_size="64"), "config.json", "field 'hidden_size'", True),
    (lambda f: (f / "config.json").write_text('{"model_type": "lla'), "config.json", "cannot be read as JSON", True),
    (_truncate(0.5), "model.safetensors", "not a complete safetensors file", False),
    (_truncate(0.0), "model.safetensors", "not a complete safetensors file", False),
], ids=["200000 layers", "negative heads", "hidden size as text", "config cut short", "weights cut in half",
        "weights empty"])
def test_a_damaged_model_folder_is_refused_naming_the_file(tiny_dirs, tmp_path, edit, file, needle, meta_too):
    folder = _damaged(tiny_dirs, tmp_path, edit)
    for device in ("cpu", "meta") if meta_too else ("cpu",):
        start = time.perf_counter()
        with pytest.raises(ModelPathError) as e:
            gna.load_model(folder, device=device)
        assert str(folder / file) in str(e.value) and needle in str(e.value)
        assert time.perf_counter() - start < 10


def test_estimate_bounds_its_arguments(tiny_models):
    from gna_interp.models.estimate import estimate_scan

    for kw in ({"samples": 10**9}, {"tokens": 10**12}, {"samples": 1.5}):
        with pytest.raises(GnaError, match="must be an integer >= 1 and at most"):
            estimate_scan(tiny_models["llama"], **{"samples": 4, "tokens": 32, **kw})
