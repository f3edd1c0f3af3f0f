"""A hostile sweep of four surfaces: ``gna circuit`` (its options, its scan folder, its --out folder), the result
files it writes and reads (``Faithfulness``, ``PathEffects``, ``Interactions``, a circuit's edge tables), the hand-off
of heads and edges to other tools (``gna_interp.models.handoff``) and the Model's TransformerLens calls.

Every case ends clean: a :class:`~gna_interp.errors.GnaError` naming what is wrong, raised before any work (on the
command line: exit 2, one ``gna: error:`` line, no traceback, and for an argument before the model loads), or a
result checked against an independent computation; and no file or link outside the output folder changes."""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pandas as pd
import pytest
import torch

import gna_interp as gna
from gna_interp.circuits.scan.interactions import Interactions
from gna_interp.circuits.edges.paths import Edge, PathEffects
from gna_interp.circuits.search.sufficiency import Faithfulness
from gna_interp.cli import main
from gna_interp.errors import GnaError, HeadError, InputError
from gna_interp.models.handoff import Address, ablated_modules, ablation_hooks, edge_addresses, head_addresses
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import TokenBatch

LIGHT = ["--sizes", "1,2", "--seeds", "0", "--minimality", "0", "--edges", "0", "--verify", "6", "--edge-seeds", "0",
         "--edge-minimality", "0", "--samples", "3", "--threshold", "0.5", "--threads", "1"]
REACHED = "the model load was reached"  # what the stand-in loader says: every check before it passed


# ---- shared: the scan, a finished run, the sentinel tree -----------------------------------------------------------

@pytest.fixture(scope="module")
def scan(tiny_models, tmp_path_factory) -> Path:
    """A `gna scan` folder of the tiny Llama (made-up drops, real files); never written to by any case."""
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    return write_scan_folder(tmp_path_factory.mktemp("scan") / "scan", model, model.heads(), n_cards=1)


@pytest.fixture(scope="module")
def other_scan(tiny_models, tmp_path_factory) -> Path:
    """Another scan of the same model (its own run id)."""
    from made_up import write_scan_folder

    model = tiny_models["llama"]
    return write_scan_folder(tmp_path_factory.mktemp("other") / "scan", model, model.heads(), n_cards=0)


@pytest.fixture(scope="module")
def done(scan, tmp_path_factory) -> Path:
    """One finished light `gna circuit` run of ``scan``."""
    out = tmp_path_factory.mktemp("done") / "c"
    assert main(["circuit", str(scan), "--out", str(out), *LIGHT]) == 0
    return out


@pytest.fixture
def loader(monkeypatch) -> None:
    """The model loader replaced by one that refuses with :data:`REACHED`: a case that gets there passed every check
    that comes before the model."""
    import gna_interp.cli.args as cli_args
    import gna_interp.cli.circuit as cli_circuit

    def reached(*_a: Any, **_k: Any) -> Any:
        raise InputError(REACHED)

    monkeypatch.setattr(cli_args, "load_for", reached)
    monkeypatch.setattr(cli_circuit, "load_for", reached)


def _tree(*roots: Path, skip: Path | None = None) -> dict[str, Any]:
    """Every file and link under ``roots`` (links not followed) with its content or target and its mtime; folders
    by name (``skip``: a subtree left out)."""
    out: dict[str, Any] = {}
    for root in roots:
        for dirpath, dirs, files in os.walk(root):
            for name in dirs + files:
                p = Path(dirpath) / name
                if skip is not None and p.is_relative_to(skip):
                    continue
                st = os.lstat(p)
                out[str(p)] = (os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else "dir",
                               st.st_mtime_ns if not p.is_dir() or p.is_symlink() else None)
    return out


@pytest.fixture
def outside(tmp_path) -> Path:
    """A sentinel tree beside --out: files (one named like an output), a nested folder and links to files outside
    it; every case compares it before and after."""
    victim = tmp_path / "victim.txt"
    victim.write_text("a colleague's file")
    root = tmp_path / "outside"
    (root / "nested").mkdir(parents=True)
    (root / "notes.txt").write_text("keep")
    (root / "faithfulness.json").write_text('{"not": "gna"}')
    (root / "nested" / "report.html").write_text("<p>theirs</p>")
    (root / "link-to-victim").symlink_to(victim)
    (root / "nested" / "edge_screen.csv").symlink_to(victim)
    return root


@dataclass
class Ctx:
    """What a command-line case builds on: its own folder, the shared scan and finished run, another scan."""

    tmp: Path
    scan: Path
    done: Path
    other: Path

    @property
    def out(self) -> Path:
        return self.tmp / "out"

    def argv(self, *extra: str, scan: Path | str | None = None, out: Path | str | None = None) -> list[str]:
        return ["circuit", str(self.scan if scan is None else scan), "--out", str(self.out if out is None else out),
                *extra]

    def copy(self, src: Path, name: str) -> Path:
        return Path(shutil.copytree(src, self.tmp / name, symlinks=True))


@pytest.fixture
def ctx(tmp_path, scan, done, other_scan, outside) -> Ctx:
    return Ctx(tmp_path, scan, done, other_scan)


def _one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gna: error: ") and "Traceback" not in err, err
    return lines[0]


def _refused(c: Ctx, argv: list[str], capsys: pytest.CaptureFixture, needle: str, reach: bool = False,
             skip: Path | None = None) -> str:
    """``gna argv`` exits 2 with one error line holding ``needle``; before the model loads unless ``reach`` (then
    exactly at it); nothing under the case's folder (but ``skip``), the scan or the finished run changed."""
    before = _tree(c.tmp, c.scan, c.done, skip=skip)
    code = main(argv)
    line = _one_line(capsys.readouterr().err)
    assert code == 2 and needle in line, line
    assert (REACHED in line) == reach, line
    assert _tree(c.tmp, c.scan, c.done, skip=skip) == before
    return line


# ---- 1. gna circuit: options -----------------------------------------------------------------------------------

def _cores() -> int:
    from gna_interp.cli.args import _cores as cores

    return cores()


OPTIONS = [  # (id, the options, what the message says); each refused by the parser, before the scan is read
    ("threshold 0", ["--threshold", "0"], "expected a fraction in (0, 1], got '0'"),
    ("threshold past 1", ["--threshold", "1.5"], "got '1.5'"),
    ("threshold nan", ["--threshold", "nan"], "got 'nan'"),
    ("threshold -inf", ["--threshold=-inf"], "got '-inf'"),
    ("threshold underflowing to 0", ["--threshold", "1e-400"], "got '1e-400'"),
    ("threshold a word", ["--threshold", "most"], "got 'most'"),
    ("sizes a float", ["--sizes", "1.5"], "comma-separated integers, got '1.5'"),
    ("sizes negative", ["--sizes", "2,-1"], "integers >= 0, got '2,-1'"),
    ("sizes only commas", ["--sizes", ",,"], "integers >= 0"),
    ("sizes past any model", ["--sizes", "1,99999999999"], "at most 1,000,000"),
    ("samples negative", ["--samples", "-1"], "must be at least 0, got -1"),
    ("samples past the scan by one", ["--samples", "5"], "has 4 prompts; pass at most 4"),
    ("samples past the bound", ["--samples", "1000001"], "at most 1,000,000"),
    ("seeds past the bound", ["--seeds", "1001"], "at most 1,000"),
    ("minimality in e-notation", ["--minimality", "1e3"], "'1e3' is not an integer"),
    ("edges past the bound", ["--edges", "1000001"], "at most 1,000,000"),
    ("verify negative", ["--verify", "-1"], "must be at least 0"),
    ("ig-steps past the bound", ["--ig-steps", "1001"], "at most 1,000"),
    ("edge-seeds a word", ["--edge-seeds", "x"], "'x' is not an integer"),
    ("edge-precision 1", ["--edge-precision", "1"], "expected a share in [0, 1), got '1'"),
    ("edge-precision nan", ["--edge-precision", "nan"], "got 'nan'"),
    ("edge-minimality negative", ["--edge-minimality", "-5"], "must be at least 0, got -5"),
    ("batch-size 0", ["--batch-size", "0"], "must be at least 1, got 0"),
    ("threads 0", ["--threads", "0"], "must be at least 1, got 0"),
    ("threads past the cores", ["--threads", str(_cores() + 1)], f"at most {_cores()}"),
    ("method resample", ["--method", "resample"], "invalid choice: 'resample'"),
    ("model empty", ["--model", " "], "argument --model: is empty"),
    ("resume and fresh", ["--resume", "--fresh"], "not allowed with argument --resume"),
    ("quick with samples past the scan", ["--quick", "--samples", "9"], "has 4 prompts"),
]


@pytest.mark.parametrize("extra, needle", [c[1:] for c in OPTIONS], ids=[c[0] for c in OPTIONS])
def test_an_option_out_of_bounds_is_refused_before_the_model(extra, needle, ctx, loader, capsys):
    _refused(ctx, ctx.argv(*extra), capsys, needle)
    assert not ctx.out.exists()


ACCEPTED = [  # (id, the options): at a bound or past what exists, taken as they are: the run goes on to the model
    ("threshold 1", ["--threshold", "1"]),
    ("edge-precision 0", ["--edge-precision", "0"]),
    ("sizes 0", ["--sizes", "0"]),
    ("sizes with an empty item", ["--sizes", "1,,2"]),
    ("samples as many as the scan has", ["--samples", "4"]),
    ("quick on a smaller scan", ["--quick"]),
    ("edges past the heads", ["--edges", "100"]),
    ("verify past the edges", ["--verify", "5000"]),
]


@pytest.mark.parametrize("extra", [c[1] for c in ACCEPTED], ids=[c[0] for c in ACCEPTED])
def test_an_option_at_its_bound_reaches_the_model_and_writes_nothing(extra, ctx, loader, capsys):
    _refused(ctx, ctx.argv(*extra), capsys, REACHED, reach=True)
    assert not ctx.out.exists()  # the folder the lock made is gone again


def test_sizes_parse_to_the_listed_sizes():
    from gna_interp.cli.circuit import _sizes

    assert _sizes("1,,2") == [1, 2] and _sizes(" 0 , 4") == [0, 4]


def test_sizes_past_the_models_heads_are_refused_before_fresh_deletes_anything(ctx, capsys):
    """Past the model's heads is known once it loaded: refused there, before --fresh empties the folder."""
    out = ctx.copy(ctx.done, "again")
    sizes = [a if a != "1,2" else "1,13" for a in LIGHT]
    line = _refused(ctx, ctx.argv(*sizes, "--fresh", out=out), capsys, "--sizes 13:")
    assert "has 12 heads" in line


# ---- 1. gna circuit: the scan folder ----------------------------------------------------------------------------

def _edit(folder: Path, name: str, change: Callable[[dict], Any]) -> Path:
    doc = json.loads((folder / name).read_text())
    change(doc)
    (folder / name).write_text(json.dumps(doc))
    return folder


def _scan_case(make: Callable[[Ctx], Path], needle: str) -> tuple[Callable[[Ctx], Path], str]:
    return make, needle


def _text(name: str, text: Callable[[str], str]) -> Callable[[Ctx], Path]:
    def make(c: Ctx) -> Path:
        d = c.copy(c.scan, "bad")
        (d / name).write_text(text((d / name).read_text()))
        return d
    return make


def _swap(name: str, by: Callable[[Ctx, Path], None]) -> Callable[[Ctx], Path]:
    def make(c: Ctx) -> Path:
        d = c.copy(c.scan, "bad")
        p = d / name
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()
        by(c, p)
        return d
    return make


SCANS = [  # (id, how the scan folder is made, what the message says)
    ("missing", lambda c: c.tmp / "nowhere", "is not a folder"),
    ("a file", lambda c: Path(shutil.copy(c.scan / "scan.csv", c.tmp / "scan.csv")), "is not a folder"),
    ("an empty folder", lambda c: Path(os.makedirs(c.tmp / "empty") or c.tmp / "empty"), "has no circuit.json"),
    ("a gna circuit run", lambda c: c.copy(c.done, "run"), "has no circuit.json"),
    ("circuit.json cut in half", _text("circuit.json", lambda t: t[:len(t) // 2]), "cannot be read as JSON"),
    ("circuit.json empty", _text("circuit.json", lambda t: ""), "cannot be read as JSON"),
    ("circuit.json a JSON list", _text("circuit.json", lambda t: "[" + t + "]"), "holds a list"),
    ("a NaN literal", _text("circuit.json", lambda t: t.replace('"scan_rows": 12', '"scan_rows": NaN')),
     "NaN is not a JSON number"),
    ("off-schema", lambda c: _edit(c.copy(c.scan, "bad"), "circuit.json", lambda d: d["task"].update(n_samples=-4)),
     "field 'task/n_samples'"),
    ("scan.json of another run", lambda c: Path(shutil.copy(c.other / "scan.json", c.copy(c.scan, "bad"))).parent,
     "comes from another run"),
    ("scan.json a FIFO", _swap("scan.json", lambda c, p: os.mkfifo(p)), "is no regular file"),
    ("views.pt a folder", _swap("views.pt", lambda c, p: p.mkdir()), "is a folder"),
    ("circuit.json a link to another scan's", _swap("circuit.json", lambda c, p: p.symlink_to(c.other / p.name)),
     "is a symbolic link"),
    ("scan.json a dangling link", _swap("scan.json", lambda c, p: p.symlink_to(c.tmp / "gone.json")),
     "is a symbolic link"),
]


@pytest.mark.parametrize("make, needle", [c[1:] for c in SCANS], ids=[c[0] for c in SCANS])
def test_a_scan_folder_that_is_none_is_refused_naming_its_own_file(make, needle, ctx, loader, capsys):
    src = make(ctx)
    line = _refused(ctx, ctx.argv(scan=src), capsys, needle)
    assert str(src) in line and "gna-scan-" not in line  # the user's path, never the private copy's
    assert not ctx.out.exists()


def test_an_empty_scan_argument_is_refused(ctx, loader, capsys, monkeypatch):
    monkeypatch.chdir(ctx.tmp)
    _refused(ctx, ctx.argv(scan=""), capsys, "the scan folder must be a file or folder path")


def test_a_scan_locked_by_another_gna_process_is_refused(ctx, loader, capsys):
    from made_up import held_lock

    src = ctx.copy(ctx.scan, "busy")
    with held_lock(src):
        _refused(ctx, ctx.argv(scan=src), capsys, "is being written by another gna process")


# ---- 1. gna circuit: the --out folder ---------------------------------------------------------------------------

def _out_with(setup: Callable[[Ctx, Path], Any]) -> Callable[[Ctx], Path]:
    def make(c: Ctx) -> Path:
        c.out.mkdir()
        setup(c, c.out)
        return c.out
    return make


def _from_done(setup: Callable[[Ctx, Path], Any]) -> Callable[[Ctx], Path]:
    def make(c: Ctx) -> Path:
        shutil.copytree(c.done, c.out)
        setup(c, c.out)
        return c.out
    return make


def _nothing(c: Ctx, p: Path) -> None:
    return None


def _edge_stage(out: Path, **change: Any) -> None:
    """An edges stage recorded as finished in ``out``, its edge table one row of ``change``."""
    pd.DataFrame([_edge_row(**change)]).to_csv(out / "edges.csv", index=False)
    (out / "roles.csv").write_text("name,causal_role\n")
    _edit(out, "circuit_run.json", lambda d: d["stages"].update(edges={}))


OUTS = [  # (id, how --out is made, options, what the message says)
    ("a file", lambda c: Path(shutil.copy(c.scan / "scan.csv", c.tmp / "out")), [], "is an existing file"),
    ("a parent that is a file", lambda c: Path(shutil.copy(c.scan / "scan.csv", c.tmp / "f")) / "out", [],
     "cannot write into"),
    ("the scan itself", lambda c: c.scan, [], "is the input"),
    ("inside the scan", lambda c: c.scan / "circuit", [], "lies inside the input"),
    ("the folder holding the scan", lambda c: c.scan.parent, [], "holds the input"),
    ("empty text", lambda c: "", [], "--out is empty"),
    ("a folder link deep inside", _out_with(lambda c, p: (p / "a" / "b").mkdir(parents=True) or
                                           (p / "a" / "b" / "c").symlink_to(c.tmp / "outside")), [],
     "'a/b/c' is a symbolic link"),
    ("whole_circuit a file", _out_with(lambda c, p: (p / "whole_circuit").write_text("x")), [],
     "'whole_circuit' is a file where gna writes a folder"),
    ("whole_circuit a link", _out_with(lambda c, p: (p / "whole_circuit").symlink_to(c.tmp / "outside")), [],
     "'whole_circuit' is a symbolic link"),
    ("faithfulness.json a folder", _out_with(lambda c, p: (p / "faithfulness.json").mkdir()), [],
     "'faithfulness.json' is a folder where gna writes a file"),
    ("another command's results", _out_with(lambda c, p: (p / "prune.json").write_text("{}")), [],
     "holds the results of `gna prune`"),
    ("a lock that is a dangling link", _out_with(lambda c, p: (p / ".gna.lock").symlink_to(c.tmp / "nowhere")), [],
     "is a symbolic link, not gna's lock file"),
    ("a lock that is a folder", _out_with(lambda c, p: (p / ".gna.lock").mkdir()), [], "is a folder, not gna's lock"),
    ("an earlier run", _from_done(_nothing), [], "holds an earlier `gna circuit` run"),
    ("resume with another threshold", _from_done(_nothing), ["--resume", "--threshold", "0.6"],
     "threshold 0.5 there, 0.6 now"),
    ("resume with another model", _from_done(_nothing), ["--resume", "--model", "zoo:transformer-kv"],
     "'zoo:transformer-kv' now"),
    ("resume in another dtype", _from_done(_nothing), ["--resume", "--dtype", "bfloat16"],
     "dtype 'float32' there, 'bfloat16' now"),
    ("resume with other sizes", _from_done(_nothing), ["--resume", "--sizes", "1,3"], "sizes [1, 2] there, [1, 3] now"),
    ("resume a run of another scan",
     _from_done(lambda c, p: _edit(p, "circuit_run.json", lambda d: d.update(scan_run_id="0" * 32))), ["--resume"],
     "a gna circuit run of another scan"),
    ("resume a truncated faithfulness.json", _from_done(lambda c, p: (p / "faithfulness.json").write_text("{")),
     ["--resume"], "faithfulness.json' cannot be read as JSON"),
    ("resume a faithfulness.json gone", _from_done(lambda c, p: (p / "faithfulness.json").unlink()), ["--resume"],
     "faithfulness.json' does not exist"),
    ("resume a screen table that is a FIFO",
     _from_done(lambda c, p: (p / "edge_screen.csv").unlink() or os.mkfifo(p / "edge_screen.csv")), ["--resume"],
     "edge_screen.csv', which a finished stage wrote, is gone or no regular file"),
    ("resume a screen record that is text",
     _from_done(lambda c, p: _edit(p, "circuit_run.json", lambda d: d["stages"]["screen"].update(intact="x"))),
     ["--resume"], "records the screen's intact metric as 'x'"),
    ("resume an edge curve of another pool",
     _from_done(lambda c, p: _edit(p, "edge_faithfulness.json", lambda d: d.update(n_heads=3))), ["--resume"],
     "not the 3 of the pool"),
    ("circuit_run.json a list", _from_done(lambda c, p: (p / "circuit_run.json").write_text("[]")), ["--resume"],
     "holds a list"),
    ("resume an edge table far outside its interval", _from_done(lambda c, p: _edge_stage(p, effect=-40.0)),
     ["--resume"], "edges.csv': row 0: its effect -40.0 lies far outside its own interval"),
    ("resume an edge table of an unscanned head", _from_done(lambda c, p: _edge_stage(p, receiver="L2H9")),
     ["--resume"], "not among the 12 scanned heads"),
]


@pytest.mark.parametrize("make, extra, needle", [c[1:] for c in OUTS], ids=[c[0] for c in OUTS])
def test_an_out_that_cannot_take_the_run_is_refused_before_the_model(make, extra, needle, ctx, loader, capsys):
    out = make(ctx)
    _refused(ctx, ctx.argv(*LIGHT, *extra, out=out), capsys, needle)


@pytest.mark.parametrize("make", [_out_with(lambda c, p: (p / ".gna.lock").write_text("4242")),
                                  _out_with(lambda c, p: (p / "report.html").write_text("<p>mine</p>")),
                                  _from_done(_nothing)],
                         ids=["a lock file left by a crashed run", "a page of its own", "an earlier run to resume"])
def test_an_out_that_can_take_the_run_reaches_the_model(make, ctx, loader, capsys):
    out = make(ctx)
    extra = ["--resume"] if (out / "circuit_run.json").exists() else []
    _refused(ctx, ctx.argv(*LIGHT, *extra, out=out), capsys, REACHED, reach=True, skip=out / ".gna.lock")


def test_an_out_locked_by_another_gna_process_is_refused(ctx, loader, capsys):
    from made_up import held_lock

    ctx.out.mkdir()
    with held_lock(ctx.out):
        _refused(ctx, ctx.argv(*LIGHT), capsys, "is in use by another gna process")


def test_links_named_like_outputs_into_the_scan_are_replaced_and_the_scan_is_left_alone(ctx, capsys):
    """--out holding links named like its outputs, each to one of the scan's own files: --fresh replaces the links
    (never writes through them); the scan and everything outside --out stay as they were, and the run's curve is
    the one a clean folder gets."""
    ctx.out.mkdir()
    pairs = {"faithfulness.json": "circuit.json", "edge_screen.csv": "scan.csv", "circuit_run.json": "circuit.json",
             "faithfulness.md": "views.pt", "report.html": "scan.json"}
    for name, target in pairs.items():
        (ctx.out / name).symlink_to(ctx.scan / target)
    before = _tree(ctx.tmp, ctx.scan, skip=ctx.out)
    assert main(ctx.argv(*LIGHT, "--fresh")) == 0
    assert _tree(ctx.tmp, ctx.scan, skip=ctx.out) == before
    for name in pairs:
        assert not (ctx.out / name).is_symlink(), name
    assert (ctx.out / "faithfulness.csv").read_text() == (ctx.done / "faithfulness.csv").read_text()
    capsys.readouterr()


def test_a_resumed_run_reads_every_stage_back_and_writes_the_same_files(ctx, capsys, monkeypatch):
    import gna_interp.circuits.edges.edge_screen as es
    import gna_interp.circuits.search.sufficiency as suff

    def never(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a finished stage ran again")

    for mod, name in ((suff, "faithfulness"), (suff, "edge_faithfulness"), (es, "screen_edges")):
        monkeypatch.setattr(mod, name, never)
    shutil.copytree(ctx.done, ctx.out)
    before = _tree(ctx.tmp, ctx.scan, skip=ctx.out)
    assert main(ctx.argv(*LIGHT, "--resume")) == 0
    assert "resumed: faithfulness, screen, edge_circuits" in capsys.readouterr().out
    assert _tree(ctx.tmp, ctx.scan, skip=ctx.out) == before
    for name in ("faithfulness.json", "edge_faithfulness.json", "edge_screen.csv"):
        assert (ctx.out / name).read_bytes() == (ctx.done / name).read_bytes(), name


# ---- 2. result files ---------------------------------------------------------------------------------------------

def _write(tmp: Path, doc: Any = None, text: str | None = None) -> Path:
    path = tmp / "faithfulness.json"
    path.write_text(text if text is not None else json.dumps(doc))
    return path


def _drop(key: str) -> Callable[[dict], Any]:
    return lambda d: d.pop(key)


def _set(key: str, value: Any) -> Callable[[dict], Any]:
    return lambda d: d.update({key: value})


def _point(i: int, **change: Any) -> Callable[[dict], Any]:
    return lambda d: d["points"][i].update(change)


REQUIRED = ("metric", "method", "n_heads", "threshold", "n_boot", "level", "intact", "empty", "points", "smallest",
            "minimality")
FAITHFULNESS = [  # (id, file, how its document is changed, what the message says)
    *[(f"{k} missing", "faithfulness.json", _drop(k), f"'{k}' is a required property") for k in REQUIRED],
    ("n_heads as text", "faithfulness.json", _set("n_heads", "12"), "'12' is not of type 'integer'"),
    ("n_heads 0", "faithfulness.json", _set("n_heads", 0), "field 'n_heads'"),
    ("a seed of a float", "faithfulness.json", _point(0, seed=1.5), "field 'points/0/seed'"),
    ("correct as integers", "faithfulness.json", lambda d: d["intact"].update(correct=[1] * len(d["intact"]["correct"])),
     "field 'intact/correct/0'"),
    ("an unknown series", "faithfulness.json", _point(1, series="best"), "field 'points/1/series'"),
    ("an unknown unit", "faithfulness.json", _set("unit", "neurons"), "field 'unit'"),
    ("another metric", "faithfulness.json", _set("metric", "accuracy"), "field 'metric'"),
    ("a threshold of 0", "faithfulness.json", _set("threshold", 0), "field 'threshold'"),
    ("a level of 1", "faithfulness.json", _set("level", 1), "field 'level'"),
    ("no resample", "faithfulness.json", _set("n_boot", 0), "field 'n_boot'"),
    ("no point", "faithfulness.json", _set("points", []), "field 'points'"),
    ("a misspelt member", "faithfulness.json", _point(1, heads=["L0X1"]), "malformed head name 'L0X1'"),
    ("a misspelt smallest", "faithfulness.json", _set("smallest", ["seven"]), "malformed head name 'seven'"),
    ("minimality of a misspelt head", "faithfulness.json", _set("minimality", {"x": 1.0}), "malformed head name"),
    ("minimality outside the circuit", "faithfulness.json", _set("minimality", {"L9H9": 0.5}),
     "outside the smallest circuit"),
    ("a member twice", "faithfulness.json", _point(2, heads=["L0H0", "L0H0"]), "has size 2 but 1 different members"),
    ("a size its members contradict", "faithfulness.json", _point(1, size=7), "has size 7 but 1"),
    ("per-sample lists of one point differ", "faithfulness.json",
     lambda d: d["points"][0]["results"]["logit_diff"].append(0.5), "differ in length"),
    ("a point of other samples", "faithfulness.json",
     lambda d: d["points"][0].update(results={k: v[:1] for k, v in d["points"][0]["results"].items()}),
     "other samples than the intact model's"),
    ("no sample", "faithfulness.json", lambda d: [r.update({k: [] for k in r}) for r in
                                                  [d["intact"], d["empty"], *(p["results"] for p in d["points"])]],
     "other samples than the intact model's ([0])"),
    ("a smallest circuit without its point", "faithfulness.json",
     lambda d: d.update(points=[p for p in d["points"] if p["series"] != "smallest"]), "disagree"),
    ("an edge order of repeats", "edge_faithfulness.json", lambda d: d.update(order=[d["order"][0]] * len(d["order"])),
     "different edges"),
    ("an edge order of another pool", "edge_faithfulness.json", _set("n_heads", 3), "not the 3 of the pool"),
    ("an edge point past the order", "edge_faithfulness.json", lambda d: d["points"][-1].update(size=10 ** 6),
     "has size 1000000"),
    ("an edge smallest that is no prefix", "edge_faithfulness.json", lambda d: d.update(smallest=d["order"][-1:]),
     "disagree"),
    ("an edge order misspelt", "edge_faithfulness.json", lambda d: d["order"].__setitem__(0, "L0H0 to logits"),
     "not an edge name"),
]


@pytest.mark.parametrize("name, change, needle", [c[1:] for c in FAITHFULNESS], ids=[c[0] for c in FAITHFULNESS])
def test_a_faithfulness_file_that_contradicts_itself_is_refused_naming_it(name, change, needle, done, tmp_path):
    doc = json.loads((done / name).read_text())
    change(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(InputError, match="is not a valid faithfulness file") as e:
        Faithfulness.load(path)
    assert needle in str(e.value) and str(path) in str(e.value), e.value


@pytest.mark.parametrize("text, needle", [
    (lambda t: t[: len(t) // 3], "cannot be read as JSON"),
    (lambda t: "", "cannot be read as JSON"),
    (lambda t: f"[{t}]", "holds a list"),
    (lambda t: t.replace('"threshold": 0.5', '"threshold": NaN'), "NaN is not a JSON number"),
    (lambda t: t.replace('"threshold": 0.5', '"threshold": 1e999'), "overflows a float"),
    (lambda t: t.replace('"n_boot": 2000', '"n_boot": 1' + "0" * 40), "41 digits"),
    (lambda t: t.replace('"format": "faithfulness"', '"format": "scan"'), "not a gna_interp faithfulness file"),
    (lambda t: t.replace('"format_version": 2', '"format_version": 1'), "format version 1"),
], ids=["truncated", "empty", "a list", "a NaN literal", "an overflowing number", "a huge integer", "another format",
        "an older version"])
def test_a_faithfulness_file_that_is_not_one_is_refused(text, needle, done, tmp_path):
    path = _write(tmp_path, text=text((done / "faithfulness.json").read_text()))
    with pytest.raises(InputError, match="faithfulness") as e:
        Faithfulness.load(path)
    assert needle in str(e.value), e.value


def test_a_faithfulness_path_that_is_no_file_is_refused(done, tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "dir" / "faithfulness.json").mkdir(parents=True)
    for path, needle in ((tmp_path / "fifo.json", "not a regular file"), (tmp_path / "missing.json", "does not exist"),
                         (tmp_path / "dir", "is a folder, not a file"), (tmp_path / "dir" / "x", "does not exist"),
                         (None, "got NoneType"), (42, "got int 42"), ("", "not empty")):
        with pytest.raises(InputError) as e:
            Faithfulness.load(path)  # type: ignore[arg-type]
        assert needle in str(e.value), (path, e.value)


def test_faithfulness_saves_only_where_it_may_and_reads_back_equal(done, tmp_path):
    fx = Faithfulness.load(done)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / "link.json").symlink_to(victim)
    assert fx.save(tmp_path / "link.json") == tmp_path / "link.json"
    assert victim.read_text() == "precious" and not (tmp_path / "link.json").is_symlink()
    assert Faithfulness.load(tmp_path / "link.json").to_dict() == fx.to_dict()
    assert Faithfulness.load(fx.save(tmp_path / "folder")).to_dict() == fx.to_dict()  # a folder: its file
    (tmp_path / "named.json").mkdir()
    assert fx.save(tmp_path / "named.json") == tmp_path / "named.json" / "faithfulness.json"
    for bad, needle in ((victim / "x.json", "is not a folder"), (None, "got NoneType"), (42, "got int 42")):
        with pytest.raises(InputError) as e:
            fx.save(bad)  # type: ignore[arg-type]
        assert needle in str(e.value), e.value
    assert victim.read_text() == "precious"
    efx = Faithfulness.load(done / "edge_faithfulness.json")
    assert Faithfulness.load(efx.save(tmp_path / "edge.json")).to_dict() == efx.to_dict()


def test_a_faithfulness_curve_read_back_gives_its_own_fractions(done):
    """The fraction of each point, recomputed by hand from the per-sample lists, is the table's."""
    fx = Faithfulness.load(done)
    doc = json.loads((done / "faithfulness.json").read_text())
    full, none = (sum(doc[k]["logit_diff"]) / len(doc[k]["logit_diff"]) for k in ("intact", "empty"))
    for pt, row in zip(doc["points"], fx.to_frame().itertuples()):
        kept = sum(pt["results"]["logit_diff"]) / len(pt["results"]["logit_diff"])
        assert math.isclose(row.fraction, (kept - none) / (full - none), rel_tol=1e-9, abs_tol=1e-12)


def _results(n: int, value: float) -> dict[str, torch.Tensor]:
    return {"logit_diff": torch.full((n,), value, dtype=torch.float64), "correct": torch.ones(n, dtype=torch.bool)}


@pytest.fixture(scope="module")
def effects_doc(tmp_path_factory) -> dict[str, Any]:
    pe = PathEffects("logit_diff", _results(4, 2.0), [[Edge("L0H1", "L1H2", "k", "items")], [Edge("L0H1")]],
                     [_results(4, 1.5), _results(4, 1.0)])
    return json.loads(pe.save(tmp_path_factory.mktemp("pe")).read_text())


@pytest.fixture(scope="module")
def interactions_doc(tmp_path_factory) -> dict[str, Any]:
    it = Interactions("m", "t", "logit_diff", "zero", [HeadRef(0, 1), HeadRef(1, 2)], _results(4, 2.0),
                      [_results(4, 1.0), _results(4, 1.5)], {(0, 1): _results(4, 0.2)})
    return json.loads(it.save(tmp_path_factory.mktemp("it")).read_text())


OTHER_RESULTS = [  # (id, the result type, how its document is changed, what the message says)
    ("effects: an unknown metric", "pe", _set("metric", "bleu"), "unknown metric 'bleu'"),
    ("effects: a level of 2", "pe", _set("level", 2), "strictly between 0 and 1"),
    ("effects: a key missing", "pe", _drop("baseline"), "KeyError: 'baseline'"),
    ("effects: sets a mapping", "pe", _set("sets", {}), "sets must be a list"),
    ("effects: an empty baseline", "pe", _set("baseline", {}), "per-sample results must be lists"),
    ("effects: results a list", "pe", lambda d: d["sets"][0].update(results=[1, 2]), "per-sample results"),
    ("effects: correct as integers", "pe", lambda d: d["baseline"].update(correct=[1, 1, 1, 1]), "correct of booleans"),
    ("effects: an unknown per-sample list", "pe", lambda d: d["baseline"].update(extra=[1, 2, 3, 4]),
     "per-sample results"),
    ("effects: lists of other lengths", "pe", lambda d: d["sets"][1]["results"]["logit_diff"].pop(), "differ in length"),
    ("effects: a receiver before its sender", "pe", lambda d: d["sets"][0]["edges"][0].update(receiver="L0H0"),
     "later layer than the sender"),
    ("effects: unknown positions", "pe", lambda d: d["sets"][0]["edges"][0].update(positions="everywhere"),
     "unknown positions"),
    ("interactions: a key missing", "it", _drop("singles"), "'singles' is a required property"),
    ("interactions: a head twice", "it", _set("heads", ["L1H2", "L1H2"]), "listed twice"),
    ("interactions: a pair twice", "it", lambda d: d["pairs"].append(d["pairs"][0]), "listed twice"),
    ("interactions: a pair past the heads", "it", lambda d: d["pairs"][0].update(j=5), "do not fit 2 heads"),
    ("interactions: an unknown metric", "it", _set("metric", "bleu"), "field 'metric'"),
    ("interactions: no resample", "it", _set("n_boot", 0), "field 'n_boot'"),
    ("interactions: an empty baseline", "it", _set("baseline", {}), "'logit_diff' is a required property"),
    ("interactions: lists of other lengths", "it", lambda d: d["singles"][1]["logit_diff"].pop(), "differ in length"),
]


@pytest.mark.parametrize("kind, change, needle", [c[1:] for c in OTHER_RESULTS], ids=[c[0] for c in OTHER_RESULTS])
def test_other_result_files_that_contradict_themselves_are_refused(kind, change, needle, effects_doc,
                                                                    interactions_doc, tmp_path):
    cls, doc = (PathEffects, effects_doc) if kind == "pe" else (Interactions, interactions_doc)
    doc = json.loads(json.dumps(doc))
    change(doc)
    path = tmp_path / cls.FILE
    path.write_text(json.dumps(doc))
    with pytest.raises(InputError) as e:
        cls.load(path)
    assert needle in str(e.value) and str(path) in str(e.value), e.value


def test_other_result_files_read_back_equal_with_their_effects(effects_doc, interactions_doc, tmp_path):
    (tmp_path / "path_effects.json").write_text(json.dumps(effects_doc))
    pe = PathEffects.load(tmp_path)
    assert pe.effects() == [0.5, 1.0] and pe.to_frame()["edge"].tolist() == ["L0H1 -> L1H2.k@items", "L0H1 -> logits"]
    (tmp_path / "interactions.json").write_text(json.dumps(interactions_doc))
    it = Interactions.load(tmp_path)
    row = it.to_frame().iloc[0]
    assert math.isclose(row["interaction"], (2.0 - 0.2) - (2.0 - 1.0) - (2.0 - 1.5))  # drop_ij - drop_i - drop_j


def _edge_row(**change: Any) -> dict[str, Any]:
    return {"edge": "L0H0 -> L1H1.k@items", "sender": "L0H0", "receiver": "L1H1", "input": "k", "positions": "items",
            "effect": 0.5, "low": 0.25, "high": 0.75, **change}


EDGE_TABLES = [  # (id, circuit.json's edge rows, what the message says)
    ("an effect far below its interval", [_edge_row(effect=-40.0)], "far outside its own interval"),
    ("a reversed interval", [_edge_row(low=0.9, high=0.1)], "interval is reversed"),
    ("an edge of an unscanned head", [_edge_row(receiver="L2H9", edge="L0H0 -> L2H9.k@items")],
     "not among the 12 scanned heads"),
    ("an edge into an earlier layer", [_edge_row(receiver="L0H1")], "later layer"),
    ("an edge measured twice", [_edge_row(), _edge_row()], "measures L0H0 -> L1H1.k@items again"),
]


@pytest.mark.parametrize("rows, needle", [c[1:] for c in EDGE_TABLES], ids=[c[0] for c in EDGE_TABLES])
def test_a_circuits_edge_table_that_cannot_be_is_refused_when_read(rows, needle, scan, tmp_path, capsys):
    from gna_interp.circuits import Circuit
    from made_up import edited_copy

    bad = edited_copy(scan, tmp_path / "bad", _set("edges", rows))
    with pytest.raises(InputError) as e:
        Circuit.load(bad)
    assert needle in str(e.value), e.value
    assert main(["circuit", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert needle in _one_line(capsys.readouterr().err) and not (tmp_path / "o").exists()


def test_a_whole_circuit_far_outside_its_interval_is_refused(done, tmp_path):
    from gna_interp.circuits import Circuit

    assert Circuit.load(done / "whole_circuit").whole is not None
    src = Path(shutil.copytree(done / "whole_circuit", tmp_path / "whole"))
    _edit(src, "circuit.json", lambda d: d["whole"].update(kept=50.0, low=0.1, high=0.2))
    with pytest.raises(InputError, match="lies far outside its own interval"):
        Circuit.load(src)


# ---- 3. the hand-off --------------------------------------------------------------------------------------------

from made_up import tiny_llama as _llama  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tiny_models, tiny_dirs) -> tuple[gna.Model, torch.nn.Module]:
    """The tiny Llama as a Model and as a separate plain Hugging Face model of the same checkpoint."""
    from transformers import AutoModelForCausalLM

    return tiny_models["llama"], AutoModelForCausalLM.from_pretrained(tiny_dirs["llama"]).eval()


@pytest.fixture(scope="module")
def others(tiny_dirs) -> dict[str, torch.nn.Module]:
    """Hugging Face models of other shapes than the tiny Llama."""
    from transformers import AutoModelForCausalLM

    return {"wider": _llama(hidden_size=128, num_attention_heads=8), "more heads": _llama(num_attention_heads=8),
            "shallower": _llama(num_hidden_layers=2), "fewer kv heads": _llama(num_key_value_heads=1),
            "mamba2": AutoModelForCausalLM.from_pretrained(tiny_dirs["mamba2"]).eval()}


def _no_hooks(module: torch.nn.Module) -> bool:
    return all(not m._forward_pre_hooks and not m._forward_hooks for m in module.modules())


HANDOFF_REFUSED = [  # (id, the call on (model, hf), the error, what the message says)
    ("head_addresses of no model", lambda m, hf: head_addresses(None, "L0H1"), InputError, "got NoneType"),
    ("head_addresses of a Hugging Face model", lambda m, hf: head_addresses(hf, "L0H1"), InputError,
     "wrap this LlamaForCausalLM first"),
    ("head_addresses of a spec", lambda m, hf: head_addresses("zoo:transformer-kv", "L0H1"), InputError,
     "load it first"),
    ("head_addresses of None heads", lambda m, hf: head_addresses(m, None), HeadError, "got NoneType"),
    ("head_addresses of a set", lambda m, hf: head_addresses(m, {"L0H1"}), HeadError, "got set"),
    ("head_addresses of a head past the layer", lambda m, hf: head_addresses(m, "L0H4"), HeadError,
     "valid indices 0..3"),
    ("head_addresses of a layer past the model", lambda m, hf: head_addresses(m, "L3H0"), HeadError,
     "layers 0..2"),
    ("head_addresses of an SSM head", lambda m, hf: head_addresses(m, "L1S0"), HeadError, "no 'ssm2' mixer"),
    ("head_addresses of a head twice", lambda m, hf: head_addresses(m, ["L1H1", HeadRef(1, 1)]), HeadError,
     "named twice"),
    ("ablation_hooks of no model", lambda m, hf: ablation_hooks(None, "L0H1"), InputError, "got NoneType"),
    ("ablation_hooks of a head past the layer", lambda m, hf: ablation_hooks(m, "L2H9"), HeadError, "out of range"),
    ("edge_addresses of no model", lambda m, hf: edge_addresses(None, [{"sender": "L0H1", "input": "logits"}]),
     InputError, "got NoneType"),
    ("edge_addresses of text", lambda m, hf: edge_addresses(m, "L0H1 -> L1H2.k"), InputError, "got str"),
    ("edge_addresses of names", lambda m, hf: edge_addresses(m, ["L0H1"]), InputError, "got str"),
    ("an edge at unknown positions", lambda m, hf: edge_addresses(
        m, [{"sender": "L0H1", "receiver": "L1H2", "input": "k", "positions": "everywhere"}]), InputError,
     "positions 'everywhere' are none of"),
    ("an edge at numbered positions", lambda m, hf: edge_addresses(
        m, [{"sender": "L0H1", "receiver": "L1H2", "input": "k", "positions": 3}]), InputError, "positions 3"),
    ("an edge whose effect is text", lambda m, hf: edge_addresses(
        m, [{"sender": "L0H1", "receiver": "logits", "input": "logits", "effect": "big"}]), InputError,
     "its effect must be a number"),
    ("an edge into its own layer", lambda m, hf: edge_addresses(
        m, [{"sender": "L2H0", "receiver": "L2H3", "input": "q"}]), HeadError, "later layer"),
    ("an edge to a head past the model", lambda m, hf: edge_addresses(
        m, [{"sender": "L0H0", "receiver": "L5H0", "input": "q"}]), HeadError, "layers 0..2"),
    ("an edge read through other", lambda m, hf: edge_addresses(
        m, [{"sender": "L0H0", "receiver": "L1H0", "input": "other"}]), InputError, "reads no input 'other'"),
    ("an edge from an MLP", lambda m, hf: edge_addresses(
        m, [{"sender": "MLP0", "receiver": "L1H0", "input": "v"}]), InputError, "'MLP0' is not a head"),
    ("an address with no head size", lambda m, hf: Address("L0H0", "output", "h", "m", "input", 0, 16, 64, 0),
     InputError, "head_dim must be an integer >= 1"),
    ("an address of no width", lambda m, hf: Address("L0H0", "output", "h", "m", "input", 0, 16, 0), InputError,
     "width must be an integer >= 1"),
]


@pytest.mark.parametrize("call, error, needle", [c[1:] for c in HANDOFF_REFUSED], ids=[c[0] for c in HANDOFF_REFUSED])
def test_the_hand_off_refuses_what_it_cannot_address(call, error, needle, tiny):
    with pytest.raises(error) as e:
        call(*tiny)
    assert isinstance(e.value, GnaError) and needle in str(e.value), e.value


def _address(m: gna.Model, **change: Any) -> dict[str, Any]:
    return {**head_addresses(m, "L1H2")[0].to_dict(), **change}


ABLATED_REFUSED = [  # (id, the model of (hf, others), the addresses of m, what the message says)
    ("no model", lambda hf, o: None, lambda m: head_addresses(m, "L1H2"), "got NoneType"),
    ("a gna Model", lambda hf, o: "model", lambda m: head_addresses(m, "L1H2"), "got Model"),
    ("addresses None", lambda hf, o: hf, lambda m: None, "got NoneType"),
    ("head names", lambda hf, o: hf, lambda m: "L1H2", "head_addresses(model, 'L1H2')"),
    ("an attention module", lambda hf, o: hf, lambda m: [_address(m, module="model.layers.1.self_attn")],
     "is a LlamaAttention, which declares no channels"),
    ("a module list", lambda hf, o: hf, lambda m: [_address(m, module="model.layers")], "is a ModuleList"),
    ("an empty module path", lambda hf, o: hf, lambda m: [_address(m, module="")], "has no module ''"),
    ("a wider model", lambda hf, o: o["wider"], lambda m: head_addresses(m, "L1H2"), "has 128 channels"),
    ("more heads", lambda hf, o: o["more heads"], lambda m: head_addresses(m, "L1H2"), "heads of 8 channels"),
    ("a shallower model", lambda hf, o: o["shallower"], lambda m: head_addresses(m, "L2H0"), "has 2 layers"),
    ("a Mamba-2 model", lambda hf, o: o["mamba2"], lambda m: head_addresses(m, "L1H2"), "Mamba2ForCausalLM has no"),
    ("fewer key-value heads", lambda hf, o: o["fewer kv heads"],
     lambda m: [edge_addresses(m, [{"sender": "L0H0", "receiver": "L1H3", "input": "k"}])[0]["receiver"]],
     "k_proj has 16 channels at its output; the address of L1H3 needs 32"),
    ("one good address and one past the model", lambda hf, o: hf,
     lambda m: [*head_addresses(m, "L0H0"), _address(m, module="model.layers.7.self_attn.o_proj")],
     "needs layer 7"),
]


@pytest.mark.parametrize("model, addresses, needle", [c[1:] for c in ABLATED_REFUSED],
                         ids=[c[0] for c in ABLATED_REFUSED])
def test_ablated_modules_refuses_before_any_hook_is_placed(model, addresses, needle, tiny, others):
    m, hf = tiny
    target = model(hf, others)
    target = m if target == "model" else target
    with pytest.raises(InputError) as e:
        with ablated_modules(target, addresses(m)):
            raise AssertionError("the block ran")
    assert needle in str(e.value), e.value
    for module in (hf, *others.values()):
        assert _no_hooks(module)


@pytest.mark.parametrize("escape", [RuntimeError, KeyboardInterrupt, GeneratorExit])
def test_ablated_modules_is_undone_however_the_block_ends(escape, tiny):
    m, hf = tiny
    with pytest.raises(escape):
        with ablated_modules(hf, head_addresses(m, "L0H1,L2H3")):
            assert not _no_hooks(hf)
            raise escape()
    assert _no_hooks(hf)


def test_the_hand_offs_zero_the_heads_as_gna_does(tiny):
    """ablation_hooks on the Model and ablated_modules on the separate Hugging Face copy give gna.ablate's logits;
    an address's channels are the head's own (its index times the head size, on the o_proj input)."""
    m, hf = tiny
    ids = torch.tensor([[5, 9, 3, 7, 11]])
    heads = ["L0H3", "L2H1"]
    with gna.ablate(m, heads):
        want = m(ids)
    assert torch.allclose(m.run_with_hooks(ids, fwd_hooks=ablation_hooks(m, heads)), want, atol=1e-5)
    with torch.no_grad(), ablated_modules(hf, head_addresses(m, heads)):
        assert torch.allclose(hf(ids).logits, want, atol=1e-5)
    assert _no_hooks(hf)
    d = hf.config.hidden_size // hf.config.num_attention_heads
    assert [(a.module, a.start, a.stop, a.width, a.head_dim) for a in head_addresses(m, heads)] == [
        ("model.layers.0.self_attn.o_proj", 3 * d, 4 * d, 64, d), ("model.layers.2.self_attn.o_proj", d, 2 * d, 64, d)]


def test_a_receivers_address_zeroes_what_the_bridge_hook_zeroes(tiny):
    """A k receiver's address on the Hugging Face copy zeroes the channels a hook on the bridge's k output zeroes by
    hand."""
    m, hf = tiny
    (row,) = edge_addresses(m, [{"sender": "L0H0", "receiver": "L1H3", "input": "k"}])
    r = row["receiver"]

    def zero(x: torch.Tensor, hook: Any = None) -> torch.Tensor:
        x = x.clone()
        x.view(*x.shape[:2], -1)[..., r["start"]:r["stop"]] = 0
        return x

    ids = torch.tensor([[5, 9, 3, 7, 11, 2]])
    want = m.run_with_hooks(ids, fwd_hooks=[(r["hook"], zero)])
    assert not torch.allclose(want, m(ids))
    with torch.no_grad(), ablated_modules(hf, r):
        assert torch.allclose(hf(ids).logits, want, atol=1e-5)
    assert _no_hooks(hf)


def test_the_packages_own_edges_are_accepted(tiny, scan, done):
    """An edge table measured by the package (path patching) and a whole circuit's head edges address as an
    independent computation of their channels says: a k/v receiver reads its key-value group's span."""
    from gna_interp.circuits import Circuit
    from gna_interp.circuits.edges.causal import measure_edges

    m, hf = tiny
    task = Circuit.load(scan).load_task()
    table = measure_edges(m, task, [HeadRef(0, 1), HeadRef(1, 3)], batch_size=4)
    rows = edge_addresses(m, table)
    assert [r["edge"] for r in rows] == list(table["edge"])
    d, group = 16, hf.config.num_attention_heads // hf.config.num_key_value_heads
    for row, edge in zip(rows, table.to_dict("records")):
        assert row["effect"] == edge["effect"]
        if edge["receiver"] != "logits":
            head = int(edge["receiver"].split("H")[1])
            start = (head if edge["input"] == "q" else head // group) * d
            assert (row["receiver"]["start"], row["receiver"]["stop"]) == (start, start + d)
    whole = Circuit.load(done / "whole_circuit").whole
    heads_only = [e for e in whole.edges if e.sender.startswith("L") and (e.receiver == "logits" or
                                                                          e.receiver.startswith("L"))]
    assert heads_only and [r["sender"]["head"] for r in edge_addresses(m, heads_only)] == [e.sender for e in heads_only]


# ---- 4. the Model's TransformerLens surface ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def zoo() -> gna.Model:
    return gna.load_model("zoo:transformer-kv", device="cpu")


@pytest.fixture(scope="module")
def zoo_hf() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    from gna_interp.models import zoo_dir

    return AutoModelForCausalLM.from_pretrained(zoo_dir() / "transformer-kv").eval()


@pytest.fixture(scope="module")
def prompt(zoo) -> str:
    a, b = zoo.kv_words[:2]
    return f"{a}:12\n{b}:7\n{a}:"


from made_up import no_forward as _no_forward  # noqa: E402


def _ids(m: gna.Model, text: str) -> torch.Tensor:
    return m.to_tokens(text)


def _fn(x: torch.Tensor, hook: Any = None) -> torch.Tensor:
    return x


U64 = getattr(torch, "uint64", torch.int64)
MODEL_REFUSED = [  # (id, the call on (model, prompt), what the message says)
    ("stop_at_layer at the layer count", lambda m, p: m.run_with_hooks(p, stop_at_layer=2), "in -2..1"),
    ("stop_at_layer past the first block", lambda m, p: m.run_with_hooks(p, stop_at_layer=-3), "got -3"),
    ("stop_at_layer a float", lambda m, p: m.run_with_cache(p, stop_at_layer=1.5, names_filter="blocks.0.hook_out"),
     "got 1.5"),
    ("stop_at_layer text", lambda m, p: m.run(p, stop_at_layer="1"), "got '1'"),
    ("stop_at_layer a bool", lambda m, p: m.run_with_hooks(p, stop_at_layer=True), "got True"),
    ("fwd_hooks a name", lambda m, p: m.run_with_hooks(p, fwd_hooks="blocks.0.hook_out"), "got str"),
    ("fwd_hooks one pair", lambda m, p: m.run_with_hooks(p, fwd_hooks=("blocks.0.hook_out", _fn)), "got one pair"),
    ("fwd_hooks of an unknown hook", lambda m, p: m.run_with_hooks(p, fwd_hooks=[("blocks.0.hook_ot", _fn)]),
     "did you mean 'blocks.0.hook_out'"),
    ("fwd_hooks of a hook past the model", lambda m, p: m(p, fwd_hooks=[("blocks.9.hook_out", _fn)]),
     "'blocks.9.hook_out', which is no hook"),
    ("fwd_hooks with no function", lambda m, p: m.run_with_hooks(p, fwd_hooks=[("blocks.0.hook_out", 3)]),
     "got the item"),
    ("fwd_hooks of three", lambda m, p: m.run_with_hooks(p, fwd_hooks=[("blocks.0.hook_out", _fn, 1)]),
     "got the item"),
    ("fwd_hooks None", lambda m, p: m.run_with_hooks(p, fwd_hooks=None), "got NoneType"),
    ("fwd_hooks a mapping", lambda m, p: m.run_with_hooks(p, fwd_hooks={"blocks.0.hook_out": _fn}), "got dict"),
    ("bwd_hooks of an unknown hook", lambda m, p: m.run_with_hooks(p, bwd_hooks=[("nope", _fn)]),
     "bwd_hooks names 'nope'"),
    ("hooks() of an unknown hook", lambda m, p: m.hooks([("hook_embd", _fn)]).__enter__(), "did you mean"),
    ("ids with no token", lambda m, p: m(torch.zeros((1, 0), dtype=torch.long)), "the token ids are empty"),
    ("ids with no row", lambda m, p: m.run_with_cache(torch.zeros((0, 3), dtype=torch.long)), "the token ids are empty"),
    ("ids 3-D", lambda m, p: m(_ids(m, p)[None]), "of shape (1, 1, 1, 5)"),
    ("ids as booleans", lambda m, p: m.run_with_hooks(_ids(m, p).bool()), "got torch.bool"),
    ("ids complex", lambda m, p: m(_ids(m, p).to(torch.complex64)), "got torch.complex64"),
    ("ids negative", lambda m, p: m(torch.tensor([[3, -1]])), "token ids [-1] are outside the vocabulary"),
    ("ids past the vocabulary in uint64", lambda m, p: m(torch.tensor([[3, 2 ** 40]], dtype=U64)),
     f"token ids [{2 ** 40}] are outside"),
    ("a packed batch of no token", lambda m, p: m(TokenBatch(torch.zeros((2, 0), dtype=torch.long),
                                                             torch.zeros((2, 0), dtype=torch.long))), "empty"),
    ("to_tokens of ids", lambda m, p: m.to_tokens(_ids(m, p)), "these are already token ids"),
    ("to_tokens move_to_device as text", lambda m, p: m.to_tokens(p, move_to_device="no"),
     "move_to_device must be True or False"),
    ("to_tokens prepend_bos as text", lambda m, p: m.to_tokens(p, prepend_bos="True"), "prepend_bos must be"),
    ("to_tokens padding_side capitalised", lambda m, p: m.to_tokens([p, p], padding_side="Left"), "padding_side must"),
    ("to_tokens truncate 1", lambda m, p: m.to_tokens(p, truncate=1), "truncate must be True or False"),
    ("to_tokens of a snowman", lambda m, p: m.to_tokens(p + "\u2603"), "outside zoo:transformer-kv's vocabulary"),
    ("to_tokens of a list of lists", lambda m, p: m.to_tokens([[p]]), "got list holding list"),
    ("to_string 3-D", lambda m, p: m.to_string(_ids(m, p)[None]), "of shape (1, 1, 5)"),
    ("to_string floats", lambda m, p: m.to_string(_ids(m, p).float()), "torch.float32"),
    ("to_string a bool", lambda m, p: m.to_string(True), "got bool"),
    ("to_string text", lambda m, p: m.to_string(p), "got str"),
    ("to_string past the vocabulary", lambda m, p: m.to_string([m.d_vocab]), "outside the vocabulary"),
    ("to_str_tokens booleans", lambda m, p: m.to_str_tokens(_ids(m, p)[0].bool()), "torch.bool"),
    ("to_str_tokens complex", lambda m, p: m.to_str_tokens(_ids(m, p)[0].to(torch.complex64)), "torch.complex64"),
    ("to_str_tokens two rows", lambda m, p: m.to_str_tokens(torch.cat([_ids(m, p)] * 2)), "shape (2, 5)"),
    ("to_str_tokens of ids with prepend_bos", lambda m, p: m.to_str_tokens(_ids(m, p), prepend_bos=True),
     "apply to text"),
    ("to_single_token of two tokens", lambda m, p: m.to_single_token(f"{m.kv_words[0]}:{m.kv_words[1]}"),
     "is 2 tokens"),
    ("to_single_token of a number", lambda m, p: m.to_single_token(5), "takes a string, got int"),
    ("to_single_token of nothing", lambda m, p: m.to_single_token(""), "tokenizes to nothing"),
    ("a word with a leading space", lambda m, p: m(" " + m.kv_words[0]), "the ' ' before it is what fails"),
    ("return_type probs", lambda m, p: m(p, return_type="probs"), "return_type must be"),
    ("names_filter a number", lambda m, p: m.run_with_cache(p, names_filter=42), "names_filter must be"),
    ("names_filter of an unknown hook", lambda m, p: m.run_with_cache(p, names_filter=["blocks.0.hook_out", "zz"]),
     "names 'zz'"),
    ("pos_slice past the prompt", lambda m, p: m.run_with_cache(p, names_filter="blocks.0.hook_out", pos_slice=99),
     "pos_slice=99 selects no positions of the input's 5"),
    ("pos_slice text", lambda m, p: m.run_with_cache(p, names_filter="blocks.0.hook_out", pos_slice="last"),
     "pos_slice='last'"),
    ("a cache device that is none", lambda m, p: m.run_with_cache(p, names_filter="blocks.0.hook_out",
                                                                   device="gpu0"), "is not a torch device"),
    ("a cache device past the machine's", lambda m, p: m.run_with_cache(p, names_filter="blocks.0.hook_out",
                                                                         device="cuda:64"), "CUDA device(s)"),
    ("logits_to_keep negative", lambda m, p: m.run(p, logits_to_keep=-1), "logits_to_keep must be a count >= 0"),
    ("logits_to_keep text", lambda m, p: m.run(p, logits_to_keep="last"), "logits_to_keep must be"),
    ("use_cache text", lambda m, p: m.run(p, use_cache="no"), "use_cache must be True, False or None"),
    ("incl_bwd with stop_at_layer", lambda m, p: m.run_with_cache(p, return_type="loss", incl_bwd=True,
                                                                   stop_at_layer=1), "leave one of them out"),
    ("an unknown keyword", lambda m, p: m.run_with_hooks(p, stop_at_layr=1), "did you mean 'stop_at_layer'"),
    ("generate of a negative count", lambda m, p: m.generate(p, max_new_tokens=-2), "must be >= 0, got -2"),
    ("generate of a float count", lambda m, p: m.generate(p, max_new_tokens=2.0), "whole number"),
    ("generate of a count as text", lambda m, p: m.generate(p, max_new_tokens="3"), "whole number"),
    ("generate of no count", lambda m, p: m.generate(p, max_new_tokens=None), "whole number"),
    ("generate past the context", lambda m, p: m.generate(p, max_new_tokens=10 ** 30), "the largest max_new_tokens"),
    ("generate of a batch", lambda m, p: m.generate([p]), "takes one prompt (a string), got list"),
    ("generate with sampling", lambda m, p: m.generate(p, top_k=5), "takes no top_k"),
]


@pytest.mark.parametrize("call, needle", [c[1:] for c in MODEL_REFUSED], ids=[c[0] for c in MODEL_REFUSED])
def test_the_model_refuses_a_call_it_cannot_make_before_any_forward(call, needle, zoo, prompt):
    with _no_forward(zoo), pytest.raises(InputError) as e:
        call(zoo, prompt)
    assert needle in str(e.value), e.value
    assert not zoo.bridge.hook_dict["blocks.0.hook_out"].fwd_hooks  # no hook left behind


def test_model_logits_are_the_hugging_face_forwards_for_every_integer_dtype(zoo, zoo_hf, prompt):
    ids = zoo.to_tokens(prompt)
    assert ids[0].tolist() == zoo.tokenizer(prompt)["input_ids"]
    with torch.no_grad():
        want = zoo_hf(ids).logits
    dtypes = [torch.int8, torch.uint8, torch.int16, torch.int32, *(getattr(torch, n) for n in ("uint16", "uint32",
                                                                                                  "uint64")
                                                                    if hasattr(torch, n))]
    for dtype in dtypes:
        assert torch.allclose(zoo(ids.to(dtype)), want, atol=1e-5), dtype
    assert torch.allclose(zoo.run(ids, logits_to_keep=1), want[:, -1:], atol=1e-5)
    assert zoo.to_string(ids[0]) == zoo.tokenizer.decode(ids[0].tolist())


def test_stop_at_layer_returns_the_residual_entering_that_block(zoo, prompt):
    _, cache = zoo.run_with_cache(prompt, names_filter=["blocks.0.hook_in", "blocks.1.hook_in"])
    for stop, hook in ((0, "blocks.0.hook_in"), (-2, "blocks.0.hook_in"), (1, "blocks.1.hook_in"),
                       (-1, "blocks.1.hook_in")):
        assert torch.allclose(zoo.run_with_hooks(prompt, stop_at_layer=stop), cache[hook], atol=1e-6), stop


def test_the_cache_options_that_are_taken_select_what_they_say(zoo, prompt):
    name = "blocks.0.hook_out"
    _, full = zoo.run_with_cache(prompt, names_filter=name)
    for cut, positions in ((-1, [4]), ((2, 5), [2, 3, 4]), ([0, 4], [0, 4]), (slice(None, None, 3), [0, 3])):
        _, part = zoo.run_with_cache(prompt, names_filter=name, pos_slice=cut, device="cpu")
        got = part[name].reshape(1, -1, zoo.cfg.d_model)
        assert torch.equal(got, full[name][:, positions]), cut


def test_a_hook_chosen_by_a_function_fires_on_every_hook_it_chooses(zoo, prompt):
    seen: list[str] = []
    zoo.run_with_hooks(prompt, fwd_hooks=[(lambda n: n.endswith(".hook_out") and n.count(".") == 2,
                                           lambda x, hook: seen.append(hook.name))])
    assert sorted(seen) == ["blocks.0.hook_out", "blocks.1.hook_out"]


def test_generate_is_the_greedy_continuation_by_hand(zoo, zoo_hf, prompt):
    ids = zoo.to_tokens(prompt)
    with torch.no_grad():
        for _ in range(3):
            ids = torch.cat([ids, zoo_hf(ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    new = ids[0, -3:].tolist()
    assert zoo.generate(prompt, max_new_tokens=3) == prompt + zoo.tokenizer.decode(new, skip_special_tokens=True)
    assert zoo.generate(prompt, max_new_tokens=torch.tensor(0).item()) == prompt
