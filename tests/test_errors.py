"""Bad input gets one clear line, and nothing is lost: a table of bad inputs to the `gna` command line and to
the Python API. Each CLI case asserts the exit code, one `gna: error:` line naming the bad value, no traceback,
and that no file of an earlier scan's output folder changed; each API case the `GnaError` subclass and that
the message names the bad value."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import gna_interp as gna
from made_up import held_lock
from gna_interp.cli import main
from gna_interp.errors import GnaError, HeadError, InputError, ModelPathError, OptionError, UnknownModelError
from gna_interp.tasks import Question

SCAN = ["scan", "--allow-chance", "--samples", "3", "--pairs", "3", "--max-value", "20", "--top-k", "2", "--seeds", "1",
        "--batch-size", "3", "--no-control", "--no-png"]


@pytest.fixture(scope="module")
def earlier(tiny_dirs, tmp_path_factory) -> Path:
    """An output folder holding a finished scan of the tiny Llama (and its checkpoint)."""
    out = tmp_path_factory.mktemp("earlier") / "run"
    assert main(["--device", "cpu", *SCAN, "--model", str(tiny_dirs["llama"]), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("files")
    trunc = d / "truncated.jsonl"
    trunc.write_text('{"question": "q1", "choices": ["a", "b"], "answer": 0}\n{"question": "q2", "choi')
    plain = d / "plain.txt"
    plain.write_text("not a folder\n")
    bad_circuit = d / "bad_circuit"
    bad_circuit.mkdir()
    (bad_circuit / "circuit.json").write_text('{"format": "circuit", "format_version": 1, "model": "x"')
    (bad_circuit / "scan.csv").write_text("layer,head,kind,name\n0,0,attn,L0H0\n")
    return {"truncated": trunc, "plain": plain, "bad_circuit": bad_circuit}


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


# (id, argv with {model}/{out}/{earlier}/... placeholders, exit code, text the message must contain)
CLI_CASES = [
    ("pairs-1", [*SCAN, "--pairs", "1"], 2, "--pairs"),
    ("pairs-0", [*SCAN, "--pairs", "0"], 2, "got 0"),
    ("samples-0", [*SCAN, "--samples", "0"], 2, "--samples"),
    ("seeds-negative", [*SCAN, "--seeds", "-1"], 2, "got -1"),
    ("seeds-0", [*SCAN, "--seeds", "0"], 2, "--seeds"),
    ("threads-negative", [*SCAN, "--threads", "-1"], 2, "--threads"),
    ("threads-0", [*SCAN, "--threads", "0"], 2, "--threads"),
    ("top-k-0", [*SCAN, "--top-k", "0"], 2, "--top-k"),
    ("batch-size-0", [*SCAN, "--batch-size", "0"], 2, "--batch-size"),
    ("max-exact-0", [*SCAN, "--max-exact", "0"], 2, "--max-exact"),
    ("verify-negative", [*SCAN, "--verify", "-3"], 2, "got -3"),
    ("certify-not-int", [*SCAN, "--certify", "ten"], 2, "'ten'"),
    ("shots-negative", [*SCAN, "--shots", "-2"], 2, "--shots"),
    ("too-few-values", [*SCAN, "--pairs", "30", "--max-value", "9"], 2, "--max-value 9"),
    ("empty-model", [*SCAN, "--model", ""], 2, "--model"),
    ("blank-model", [*SCAN, "--model", "   "], 2, "empty"),
    ("missing-model-dir", [*SCAN, "--model", "{missing}"], 2, "does-not-exist"),
    ("unknown-zoo-model", [*SCAN, "--model", "zoo:nosuch"], 2, "nosuch"),
    ("out-is-a-file", [*SCAN, "--out", "{plain}"], 2, "plain.txt"),
    ("unknown-strategy", [*SCAN, "--strategy", "fast"], 2, "'fast'"),
    ("unknown-task", [*SCAN, "--task", "qa"], 2, "'qa'"),
    ("resume-and-fresh", [*SCAN, "--resume", "--fresh"], 2, "--fresh"),
    ("checkpoint-kept", [*SCAN, "--out", "{earlier}"], 2, "--resume"),
    ("checkpoint-kept-typo", [*SCAN, "--out", "{earlier}", "--model", "{missing}"], 2, "--resume"),
    ("missing-questions", [*SCAN, "--task", "mc", "--questions", "{missing}.jsonl"], 2, "does-not-exist"),
    ("truncated-questions", [*SCAN, "--task", "mc", "--questions", "{truncated}"], 2, "truncated.jsonl"),
    ("unknown-flag", [*SCAN, "--frobnicate"], 2, "--frobnicate"),
    ("cuda-without-gpu", ["--device", "cuda", *SCAN], 2, "'cuda'"),
    ("bad-device", ["--device", "toaster", *SCAN], 2, "'toaster'"),
    ("patterns-empty-heads", ["patterns", "--prompt", "a:1\nb:2", "--heads", ",", "--out", "{out}/p.html"], 2, "','"),
    ("patterns-layer-out-of-range", ["patterns", "--prompt", "hi", "--heads", "L9H0", "--out", "{out}/p.html"], 2,
     "layer 9"),
    ("patterns-head-out-of-range", ["patterns", "--prompt", "hi", "--heads", "L0H99", "--out", "{out}/p.html"], 2,
     "99"),
    ("patterns-bad-name", ["patterns", "--prompt", "hi", "--heads", "L0X1", "--out", "{out}/p.html"], 2, "L0X1"),
    ("patterns-bad-form", ["patterns", "--prompt", "hi", "--form", "fuzzy"], 2, "'fuzzy'"),
    ("report-missing", ["report", "{missing}"], 2, "does-not-exist"),
    ("report-truncated", ["report", "{bad_circuit}"], 2, "circuit.json"),
    ("compare-missing", ["compare-circuits", "{earlier}", "{missing}"], 2, "does-not-exist"),
    ("compare-top-k-0", ["compare-circuits", "{earlier}", "{earlier}", "--top-k", "0"], 2, "--top-k"),
    ("zoo-unknown", ["zoo", "train", "nosuch"], 2, "nosuch"),
    ("zoo-steps-0", ["zoo", "train", "transformer-kv", "--steps", "0", "--out", "{out}/z"], 2, "--steps"),
    ("zoo-out-is-a-file", ["zoo", "train", "transformer-kv", "--steps", "1", "--out", "{plain}"], 2, "plain.txt"),
    ("unknown-command", ["frobnicate"], 2, "frobnicate"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_cli_refuses_bad_input_in_one_line_without_touching_files(case, tiny_dirs, earlier, files, tmp_path, capsys):
    _, argv, code, needle = case
    places = {"model": str(tiny_dirs["llama"]), "out": str(tmp_path / "out"), "earlier": str(earlier),
              "missing": str(tmp_path / "does-not-exist"), **{k: str(v) for k, v in files.items()}}
    argv = [a.format(**places) for a in argv]
    if argv[0] in ("scan", "patterns", "--device") and "--model" not in argv:
        argv = [*argv, "--model", places["model"]]
    if argv[0] == "scan" and "--out" not in argv:
        argv = [*argv, "--out", places["out"]]
    before = snapshot(earlier)
    assert main(argv) == code
    cap = capsys.readouterr()
    err = cap.err.strip().splitlines()
    assert err and err[-1].startswith("gna: error: "), cap.err
    assert needle in err[-1], err[-1]
    assert "Traceback" not in cap.err + cap.out
    assert snapshot(earlier) == before
    assert not (tmp_path / "out" / "scan.ckpt.json").exists()


def test_debug_shows_the_traceback(capsys):
    assert main(["--debug", "report", "/definitely/not/here"]) == 2
    assert "Traceback" in capsys.readouterr().err


def test_fresh_starts_over_and_resume_continues(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["--device", "cpu", *SCAN, "--model", str(tiny_dirs["llama"]), "--out", str(out)]
    assert main(argv) == 0
    first = json.loads((out / "scan.ckpt.json").read_text())
    assert main(argv) == 2 and "--fresh" in capsys.readouterr().err
    assert main(argv + ["--resume"]) == 0
    assert main(argv + ["--fresh"]) == 0
    assert json.loads((out / "scan.ckpt.json").read_text())["exact"] == first["exact"]
    assert not (out / ".gna.lock").exists()


def test_a_second_scan_into_a_folder_in_use_is_refused(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "run"
    out.mkdir()
    argv = ["--device", "cpu", *SCAN, "--model", str(tiny_dirs["llama"]), "--out", str(out)]
    with held_lock(out):  # a live process holds it
        assert main(argv) == 2 and "in use by another gna process" in capsys.readouterr().err
    (out / ".gna.lock").write_text("999999999")  # a lock file left behind, nobody holding it: no obstacle
    assert main(argv) == 0 and not (out / ".gna.lock").exists()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_scan_says_how_to_resume_and_keeps_its_progress(tiny_dirs, tmp_path, sig):
    """A signal during the scan (after the first heads are saved): exit 130, the exact resume command, the
    checkpoint kept, the lock released; the printed command then finishes the scan."""
    out = tmp_path / "run"
    argv = ["--device", "cpu", *SCAN, "--model", str(tiny_dirs["llama"]), "--strategy", "exact", "--out", str(out)]
    script = textwrap.dedent(f"""
        import os, sys
        import gna_interp.circuits.scan as scan
        real = scan._Run.record_exact
        def done(self, results):
            real(self, results)
            if len(self.scan.exact) >= 2:
                os.kill(os.getpid(), {int(sig)})
        scan._Run.record_exact = done
        from gna_interp.cli import main
        sys.exit(main({argv!r}))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and "--resume" in proc.stderr
    resume = proc.stderr.strip().splitlines()[-1].split()
    assert resume[0] == "gna" and resume[-1] == "--resume"
    saved = json.loads((out / "scan.ckpt.json").read_text())
    assert len(saved["exact"]) >= 2 and not (out / ".gna.lock").exists()
    assert main(resume[1:]) == 0 and (out / "circuit.json").is_file()


# (id, call on the tiny Llama model, error type, text the message must contain)
API_CASES = [
    ("kv-pairs-1", lambda m, f: gna.KVRetrieval(1, 2), InputError, "n_pairs"),
    ("kv-samples-0", lambda m, f: gna.KVRetrieval(3, 0), InputError, "n_samples=0"),
    ("kv-words-string", lambda m, f: gna.KVRetrieval(3, 2, words="apple"), InputError, "'apple'"),
    ("kv-words-ints", lambda m, f: gna.KVRetrieval(3, 2, words=[1, 2, 3, 4]), InputError, "int"),
    ("kv-too-few-values", lambda m, f: gna.KVRetrieval(30, 2, max_value=9), InputError, "max_value"),
    ("kv-template", lambda m, f: gna.KVRetrieval(3, 2, template="poem"), InputError, "'poem'"),
    ("ids-out-of-vocab", lambda m, f: m.forward(torch.tensor([[1, 2, 10 ** 7]])), InputError, "10000000"),
    ("ids-negative", lambda m, f: m.forward(torch.tensor([[1, -2]])), InputError, "-2"),
    ("ids-float", lambda m, f: m.forward(torch.tensor([[1.0, 2.0]])), InputError, "float32"),
    ("prompt-not-text", lambda m, f: gna.patterns(m, 3, heads="L0H0"), InputError, "int"),
    ("prompt-list-of-ints", lambda m, f: m.tokenize(["a", 5]), InputError, "int"),
    ("evaluate-not-a-task", lambda m, f: gna.evaluate(m, 5), InputError, "int"),
    ("evaluate-batch-0", lambda m, f: gna.evaluate(m, gna.KVRetrieval(3, 2), batch_size=0), InputError, "batch_size"),
    ("patterns-typo", lambda m, f: gna.patterns(m, "hi", heads="L0H0", fomr="exact"), OptionError, "'form'"),
    ("patterns-bad-head", lambda m, f: gna.patterns(m, "hi", heads="L9H0"), HeadError, "layer 9"),
    ("mask-nan", lambda m, f: gna.mask_pattern(m, {"L0H0": torch.full((1, 2, 2), float("nan"))}).__enter__(),
     InputError, "NaN"),
    ("mask-not-mapping", lambda m, f: gna.mask_pattern(m, [1, 2]).__enter__(), HeadError, "list"),
    ("mc-truncated-file", lambda m, f: gna.MultipleChoice.from_file(f["truncated"]), InputError, "truncated.jsonl"),
    ("mc-missing-file", lambda m, f: gna.MultipleChoice.from_file("/no/such/q.jsonl"), InputError, "q.jsonl"),
    ("mc-choices-string", lambda m, f: Question("q", "ab", 0), InputError, "'ab'"),
    ("mc-answer-range", lambda m, f: Question("q", ("a", "b"), 5), InputError, "answer 5"),
    ("mc-format", lambda m, f: gna.MultipleChoice([Question("q", ("a", "b"), 0)], format="essay"), InputError, "'essay'"),
    ("load-empty", lambda m, f: gna.load_model(""), UnknownModelError, "empty"),
    ("load-none", lambda m, f: gna.load_model(None), UnknownModelError, "NoneType"),
    ("load-missing-path", lambda m, f: gna.load_model("/no/such/model_dir"), ModelPathError, "model_dir"),
    ("scan-strategy", lambda m, f: gna.scan_heads(m, gna.KVRetrieval(3, 2), strategy="fast"), OptionError, "'fast'"),
    ("scan-typo", lambda m, f: gna.scan_heads(m, gna.KVRetrieval(3, 2), stretegy="auto"), OptionError, "'strategy'"),
    ("scan-not-a-task", lambda m, f: gna.scan_heads(m, "kv"), InputError, "str"),
    ("discover-k", lambda m, f: gna.discover(m, gna.KVRetrieval(3, 2), k=-1), OptionError, "-1"),
    ("discover-twin", lambda m, f: gna.discover(m, gna.KVRetrieval(3, 2), twin="cloze"), OptionError, "str"),
    ("ablate-layer", lambda m, f: gna.ablate(m, ["L9H0"]).__enter__(), HeadError, "layer 9"),
    ("ablate-method", lambda m, f: gna.ablate(m, ["L0H0"], method="vanish").__enter__(), GnaError, "'vanish'"),
    ("head-name", lambda m, f: gna.HeadRef.parse("X1"), HeadError, "'X1'"),
    ("heads-empty", lambda m, f: m.check_heads(","), HeadError, "','"),
    ("circuit-missing", lambda m, f: gna.Circuit.load("/no/such/run"), InputError, "/no/such/run"),
    ("circuit-truncated", lambda m, f: gna.Circuit.load(f["bad_circuit"]), InputError, "circuit.json"),
]


@pytest.fixture(scope="module")
def llama(tiny_models):
    return tiny_models["llama"]


@pytest.mark.parametrize("case", API_CASES, ids=[c[0] for c in API_CASES])
def test_api_raises_a_typed_error_naming_the_bad_value(case, llama, files):
    _, call, kind, needle = case
    with pytest.raises(kind) as info:
        call(llama, files)
    assert needle in str(info.value), str(info.value)


def test_the_table_is_large_enough():
    assert len(CLI_CASES) + len(API_CASES) >= 40


@pytest.mark.parametrize("direct_url, hint", [
    ('{"url": "file:///src/gna_interp", "dir_info": {}}', "pip install '/src/gna_interp[figures]'"),
    ('{"url": "file:///src/gna%20interp", "dir_info": {"editable": true}}', "pip install -e '/src/gna interp[figures]'"),
    ('{"url": "file:///dl/gna_interp-0.1.0-py3-none-any.whl", "archive_info": {}}',
     "pip install '/dl/gna_interp-0.1.0-py3-none-any.whl[figures]'"),
    ('{"url": "https://example.org/gna_interp-0.1.0.tar.gz", "archive_info": {}}',
     "pip install 'gna-interp[figures] @ https://example.org/gna_interp-0.1.0.tar.gz'"),
    (None, "pip install 'gna-interp[figures]'"),  # from a package index: no direct_url.json
    ("not json", "pip install 'gna-interp[figures]'"),
])
def test_install_hint_names_where_the_package_was_installed_from(monkeypatch, direct_url, hint):
    """The command that adds an extra works for the way gna_interp was installed: the README installs it from its
    source folder (``pip install .``), where ``pip install 'gna-interp[figures]'`` would look for it on an index."""
    import importlib.metadata

    from gna_interp.errors import install_hint

    class Dist:
        def read_text(self, name):
            assert name == "direct_url.json"
            return direct_url

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    assert install_hint("figures") == hint


def test_install_hint_without_an_installed_distribution(monkeypatch):
    import importlib.metadata

    from gna_interp.errors import install_hint

    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    assert install_hint("eval") == "pip install 'gna-interp[eval]'"
