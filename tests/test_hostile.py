"""Hostile input: tokens that try to become script in an HTML page, Ctrl-C at any moment, question files
whose values would be coerced into other values, and names that should not parse. Each refusal is one
``gna: error:`` line (exit 2) naming what is wrong, with no traceback and no file written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gna_interp.cli import main
from gna_interp.errors import HeadError, InputError, UnknownModelError
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.spec import resolve_spec, zoo_dir
from gna_interp.tasks.mmlu import file_questions
from gna_interp.viz.html import circuitsvis_widget, script_json

CHROMIUM = os.environ.get("GNA_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-quic", "--no-first-run"]

# Each would run script if a page wrote it as markup, or end the <script> that carries it.
HOSTILE = ["</script><script>window.__pwned = 'script'; alert(1)</script>",
           "<img src=x onerror=\"window.__pwned = 'img'\">",
           "<!--<script>",
           "</SCRIPT ><svg onload=\"window.__pwned = 'svg'\">",
           "a\u2028b\u2029c",
           "&lt;&amp;"]


def _one_error_line(err: str, needle: str) -> str:
    """The single ``gna: error:`` line of ``err`` (which must contain ``needle``), and nothing else."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gna: error: "), err
    assert needle in lines[0] and "Traceback" not in err, err
    return lines[0]


# ---- (a) every string that reaches HTML is escaped, circuitsvis props included --------------------------------

def test_script_json_keeps_the_value_and_cannot_end_the_script():
    value = {"tokens": [*HOSTILE, "plain"], "n": [1.5, float("nan")]}
    text = script_json(value)
    assert not set(text) & set("<>&\u2028\u2029"), text
    back = json.loads(text)
    assert back["tokens"] == value["tokens"] and back["n"][0] == 1.5


def test_circuitsvis_widget_carries_tokens_as_inert_data():
    n = len(HOSTILE)
    widget = circuitsvis_widget("AttentionHeads", attention=np.ones((1, n, n)) / n, tokens=HOSTILE)
    assert widget.count("<script") == 1 and widget.lower().count("</script") == 1 and "<img" not in widget
    assert "<!--" not in widget and "<svg" not in widget


@pytest.fixture(scope="module")
def hostile_pages(tiny_models, tmp_path_factory) -> dict[str, Path]:
    """A report folder whose ``views.pt`` tokens and candidates are hostile, its report.html, and a patterns page
    of the same tokens."""
    from made_up import write_scan_folder

    from gna_interp.circuits.search.views import CardViews
    from gna_interp.report import build_report
    from gna_interp.viz import patterns_page

    model = tiny_models["llama"]
    folder = write_scan_folder(tmp_path_factory.mktemp("hostile") / "run", model, model.heads())
    views = CardViews.load(folder / "views.pt")
    for tokens in views.patterns.str_tokens:  # every token hostile: the cards' segments show some of each
        tokens[:] = [HOSTILE[i % len(HOSTILE)] for i in range(len(tokens))]
    views.candidates = [(HOSTILE[0], *c[1:]) for c in views.candidates]
    views.save(folder / "views.pt", json.loads((folder / "circuit.json").read_text())["run_id"])  # same run
    standalone = patterns_page(views.patterns, HOSTILE[0], views.view[:2], note=HOSTILE[1]).save(folder / "p.html")
    return {"report": build_report(folder, png=False), "patterns": standalone}


def test_report_writes_hostile_tokens_only_as_escaped_text(hostile_pages):
    html = hostile_pages["report"].read_text(encoding="utf-8")
    for token in HOSTILE[:4]:
        assert token not in html, token
    assert "<img src=x" not in html and "onerror=\"window" not in html


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium); .ci/run installs it")
@pytest.mark.parametrize("which", ["report", "patterns"])
def test_hostile_tokens_run_no_script_in_headless_chromium(hostile_pages, which):
    """The page loads without an error, no hostile script runs (no ``window.__pwned``, no alert), and the widget gets
    the tokens as they are, as text: circuitsvis receives them unchanged and the prompt shows them literally."""
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    record = """(() => { window.__props = []; let cv;
      Object.defineProperty(window, 'CircuitsVis', {configurable: true, get() { return cv; }, set(v) {
        cv = new Proxy(v, {get(t, k) { return k !== 'render' ? t[k]
          : (id, el, props) => { window.__props.push(props); return t.render(id, el, props); }; }}); }});
    })();"""
    errors, dialogs = [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page()
            tab.add_init_script(record)
            tab.on("pageerror", lambda e: errors.append(str(e)))
            tab.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
            tab.goto(hostile_pages[which].as_uri(), wait_until="load", timeout=120_000)
            tab.wait_for_function("document.querySelectorAll('.cv-widget canvas').length >= 1", timeout=120_000)
            tab.wait_for_timeout(300)
            seen = tab.evaluate("""() => ({
                pwned: window.__pwned === undefined ? null : String(window.__pwned),
                tokens: window.__props.map(p => p.tokens),
                text: document.body.innerText + [...document.querySelectorAll('.js-plotly-plot')]
                    .map(p => p.textContent).join(' '),
                injected: document.querySelectorAll('img, [onload], [onerror]').length,
            })""")
        finally:
            browser.close()
    assert not errors, errors
    assert seen["pwned"] is None and not dialogs, (seen["pwned"], dialogs)
    assert seen["tokens"] and all(t == [HOSTILE[i % len(HOSTILE)] for i in range(len(t))] for t in seen["tokens"])
    for token in HOSTILE[:4]:  # shown as text (the prompt; a card's segment labels, cut at 24 characters)
        assert token[:20] in seen["text"], token
    assert seen["injected"] == 0


# ---- (b) Ctrl-C at any moment: exit 130, one line, no traceback ----------------------------------------------

def _interrupt_at(patch: str, argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``gna argv`` through the console-script entry point in a child that sends itself SIGINT from ``patch``
    (Python run first, with ``interrupt()`` defined)."""
    script = textwrap.dedent("""
        import os, signal, sys, time
        def interrupt(*a, **k):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)
    """) + textwrap.dedent(patch) + f"\nfrom gna_interp._entry import main\nsys.exit(main({argv!r}))\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_ctrl_c_while_the_commands_import_is_one_line(tmp_path):
    proc = _interrupt_at("import gna_interp.cli.parser as cli\ncli._load_command_modules = interrupt\n",
                         ["patterns", "--prompt", "x", "--out", str(tmp_path / "p.html")])
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "gna: interrupted\n" and proc.stdout == ""
    assert not (tmp_path / "p.html").exists()


def test_ctrl_c_during_the_model_load_says_so(tmp_path):
    out = tmp_path / "p.html"
    proc = _interrupt_at("import gna_interp.models as models\nmodels.load_model = interrupt\n",
                         ["patterns", "--model", "zoo:transformer-kv", "--prompt", "x", "--out", str(out)])
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr == "gna: interrupted\n" and not out.exists()


def test_ctrl_c_in_a_scan_says_it_once(tmp_path):
    """A command that reports its interruption itself (what it saved) gets no second line."""
    out = tmp_path / "run"
    proc = _interrupt_at("import gna_interp.circuits as circuits\ncircuits.discover = interrupt\n",
                         ["--device", "cpu", "scan", "--model", "zoo:transformer-kv", "--allow-chance",
                          "--samples", "2", "--pairs", "3", "--max-value", "20", "--calibrate", "0", "--top-k", "1",
                          "--seeds", "1", "--no-control",
                          "--out", str(out)])
    assert proc.returncode == 130, proc.stderr
    assert proc.stderr.count("gna: interrupted") == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "nothing was saved" in proc.stderr  # the scan's own line, not the generic one


def test_the_entry_point_keeps_the_other_exit_codes():
    proc = subprocess.run([sys.executable, "-m", "gna_interp", "scan", "--seeds", "x"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2
    _one_error_line(proc.stderr, "'x'")


def test_the_console_script_uses_the_entry_point():
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    assert 'gna = "gna_interp._entry:main"' in pyproject


# ---- (c) strict question files --------------------------------------------------------------------------------

GOOD = {"question": "Which is a fruit?", "choices": ["apple", "stone"], "answer": 0}

# (id, the second row's changes, text the message must contain besides the row)
BAD_ROWS = [
    ("answer-float", {"answer": 1.9}, "answer 1.9"),
    ("answer-integral-float", {"answer": 1.0}, "answer 1.0"),
    ("answer-true", {"answer": True}, "answer True"),
    ("answer-text-digit", {"answer": "1"}, "write an index as a number"),
    ("answer-null", {"answer": None}, "missing"),
    ("answer-out-of-range", {"answer": 2}, "answer 2 is not an index"),
    ("answer-negative", {"answer": -1}, "answer -1 is not an index"),
    ("question-null", {"question": None}, "'question' is missing"),
    ("question-blank", {"question": "  "}, "'question' is empty"),
    ("question-number", {"question": 7}, "'question' must be text"),
    ("choice-empty", {"choices": ["apple", ""]}, "choice 1 (B) is empty"),
    ("choice-number", {"choices": ["apple", 4]}, "choice 1 (B) must be text"),
    ("choice-null", {"choices": ["apple", None]}, "choice 1 (B) is missing"),
    ("choices-one", {"choices": ["apple"]}, "2..26 choices, got 1"),
    ("choices-text", {"choices": "apple"}, "must be a list"),
    ("subject-number", {"subject": 3}, "'subject' must be text"),
]


@pytest.mark.parametrize("case", BAD_ROWS, ids=[c[0] for c in BAD_ROWS])
def test_question_files_refuse_values_that_would_be_coerced(case, tmp_path):
    _, change, needle = case
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **change}) + "\n")
    with pytest.raises(InputError) as e:
        file_questions(path)
    assert str(e.value).startswith("'q.jsonl' line 2: ") and needle in str(e.value), e.value


def test_csv_cells_are_text_so_digits_name_an_index(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text("question,A,B,C,answer\nWhich is a fruit?,stone,apple,,1\nWhich is red?,sky,grass,blood,c\n")
    assert [(q.choices, q.answer) for q in file_questions(path)] == [(("stone", "apple"), 1),
                                                                    (("sky", "grass", "blood"), 2)]
    path.write_text("question,A,B,C,answer\nWhich is a fruit?,stone,apple,,1\nWhich is red?,sky,,blood,1.9\n")
    with pytest.raises(InputError, match=r"^'q.csv' row 2: option B is empty but a later one is given"):
        file_questions(path)
    path.write_text("question,A,B,answer\nWhich is a fruit?,stone,apple,1.9\n")
    with pytest.raises(InputError, match=r"^'q.csv' row 1: answer '1.9' is neither an option index"):
        file_questions(path)


def test_json_files_keep_their_types(tmp_path):
    path = tmp_path / "q.json"
    pd.DataFrame([GOOD, {**GOOD, "answer": 1}]).to_json(path)  # pandas' own layout: {column: {index: value}}
    assert [q.answer for q in file_questions(path)] == [0, 1]
    path.write_text(json.dumps([GOOD, {**GOOD, "answer": True}]))
    with pytest.raises(InputError, match=r"^'q.json' item 2: answer True \(bool\)"):
        file_questions(path)
    path.write_text(json.dumps(GOOD))
    with pytest.raises(InputError, match="holds a JSON dict; a .json question file holds a list"):
        file_questions(path)
    path.write_text("[" * 100_000)
    with pytest.raises(InputError, match="'q.json' is not valid JSON"):
        file_questions(path)


def test_parquet_nulls_are_refused_not_turned_into_text(tmp_path):
    path = tmp_path / "q.parquet"
    pd.DataFrame([GOOD, {**GOOD, "question": None}]).to_parquet(path)
    with pytest.raises(InputError, match=r"^'q.parquet' row 2: 'question' is missing"):
        file_questions(path)


def test_a_question_object_needs_an_integer_answer():
    from gna_interp.tasks import Question

    for answer in (True, 1.0):
        with pytest.raises(InputError, match="answer must be an integer"):
            Question("q", ("a", "b"), answer)  # type: ignore[arg-type]


@pytest.mark.parametrize("row,needle", [({"answer": 1.9}, "line 2: answer 1.9"),
                                        ({"question": None}, "line 2: 'question'"),
                                        ({"answer": True}, "line 2: answer True")])
def test_scan_refuses_a_bad_question_file_in_one_line(row, needle, tiny_dirs, tmp_path, capsys):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, **row}) + "\n")
    out = tmp_path / "out"
    argv = ["--device", "cpu", "scan", "--model", str(tiny_dirs["llama"]), "--task", "mc", "--questions", str(path),
            "--mc-form", "stated", "--shots", "0", "--samples", "2", "--allow-chance", "--no-control",
            "--top-k", "1", "--seeds", "1", "--out", str(out)]
    assert main(argv) == 2
    cap = capsys.readouterr()
    _one_error_line(cap.err, needle)
    assert not out.exists() and "Traceback" not in cap.out


# ---- (d) names that should not parse --------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["L\u0660H\u0663", "L1H\u0663", "L\uff11H\uff12", "L\u00b2H1", "L1H2\n+3",
                                  "L1H2+\u0663"])
def test_head_names_take_ascii_digits_only(name):
    with pytest.raises(HeadError, match="malformed head name"):
        HeadRef.parse(name)


def test_head_numbers_too_long_for_any_model_are_refused():
    with pytest.raises(HeadError, match="more than 9 digits"):
        HeadRef.parse("L1H" + "9" * 5000)  # int() itself would refuse it with a ValueError


@pytest.mark.parametrize("spec", ["L1H2,L3H4,L1H2", ["L1H2", HeadRef(1, 2)], "L1H2, L1H2 "])
def test_a_head_named_twice_is_refused(spec):
    with pytest.raises(HeadError, match="L1H2 is named twice"):
        parse_heads(spec)
    assert parse_heads("L1H2,L1S2,L1H3") == [HeadRef(1, 2), HeadRef(1, 2, "ssm2"), HeadRef(1, 3)]


@pytest.mark.parametrize("spec", ["zoo:../zoo/transformer-kv", "zoo:transformer-kv/", "zoo:./transformer-kv", "zoo:",
                                  "zoo:.", "zoo:~"])
def test_zoo_takes_shipped_names_only(spec):
    with pytest.raises(UnknownModelError, match="is not shipped with this install"):
        resolve_spec(spec)


def test_zoo_refuses_a_path_to_another_folder(tiny_dirs):
    for spec in (f"zoo:{tiny_dirs['llama']}", f"zoo:{os.path.relpath(tiny_dirs['llama'], zoo_dir())}"):
        with pytest.raises(UnknownModelError, match="not a path; to load a folder, pass its path without zoo:"):
            resolve_spec(spec)
    assert resolve_spec("zoo:transformer-kv").location == str(zoo_dir() / "transformer-kv")


@pytest.mark.parametrize("extra,needle", [(["--heads", "L0H1,L0H1"], "L0H1 is named twice"),
                                          (["--heads", "L\u0660H\u0661"], "malformed head name"),
                                          (["--model", "zoo:../zoo/transformer-kv"], "not shipped"),
                                          (["--model", "zoo:/etc"], "not a path")])
def test_patterns_refuses_bad_names_in_one_line(extra, needle, tmp_path, capsys):
    out = tmp_path / "p.html"
    argv = ["--device", "cpu", "patterns", "--model", "zoo:transformer-kv", "--prompt", "a:1\nb:2", "--out", str(out),
            *extra]
    assert main(argv) == 2
    cap = capsys.readouterr()
    _one_error_line(cap.err, needle)
    assert not out.exists() and not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, bound", [
    (["scan", "--seeds", "1000000000"], "1,000"),
    (["scan", "--samples", "1000000000"], "100,000"),
    (["scan", "--max-value", "1" + "0" * 30], "1,000,000"),
    (["scan", "--top-k", "99999999"], "1,000,000"),
    (["scan", "--batch-size", "10000000"], "1,000,000"),
    (["compare-circuits", "a", "b", "--seeds", "1000000000"], "1,000"),
    (["sweep", "--seeds", "5000"], "1,000"),
    (["mask", "--samples", "1000001"], "100,000"),
    (["hybrid", "plan", "--ks", "0,10000000"], "1,000,000"),
])
def test_count_arguments_are_bounded_before_any_work(argv, bound, tmp_path, capsys):
    """A huge count is refused by the parser (exit 2, one line naming the bound and why), before any model loads or
    anything is written."""
    import time as _time

    from gna_interp.cli import main

    start = _time.perf_counter()
    assert main([*argv, "--out", str(tmp_path / "out")] if argv[0] != "hybrid" else argv) == 2
    err = capsys.readouterr().err
    assert err.count("gna: error:") == 1 and "Traceback" not in err
    assert f"at most {bound}" in err and "(" in err
    assert not (tmp_path / "out").exists() and _time.perf_counter() - start < 10


@pytest.mark.parametrize("key, value", [("views", "../../../../etc/passwd"), ("control", "/etc/hostname"),
                                        ("delegation", "../other/delegation.json"), ("views", 7)])
def test_a_circuit_folder_cannot_point_outside_itself(key, value, tmp_path, capsys):
    """circuit.json's views / control / delegation name the files saved beside it; any other path is refused
    (exit 2, one line naming the field) before anything is opened, and the folder is left as it was."""
    import json as _json

    from gna_interp import discover, load_model
    from gna_interp.cli import main
    from gna_interp.tasks import KVRetrieval

    model = load_model("zoo:transformer-kv", device="cpu")
    c = discover(model, KVRetrieval(4, 4, seed=0, words=model.kv_words), control=False, k=1, seeds=1, progress=False)
    folder = c.save(tmp_path / "c")
    doc = _json.loads((folder / "circuit.json").read_text())
    doc[key] = value
    (folder / "circuit.json").write_text(_json.dumps(doc))
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["report", str(folder), "--no-png"]) == 2
    err = capsys.readouterr().err
    assert err.count("gna: error:") == 1 and repr(key) in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
