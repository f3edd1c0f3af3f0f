"""The `gna` command line on tiny models."""

from __future__ import annotations

import pytest

from gna_interp.cli import main


def test_models_describes_families(tiny_dirs, capsys):
    assert main(["models", str(tiny_dirs["bamba"]), str(tiny_dirs["mamba"])]) == 0
    out = capsys.readouterr().out
    assert "BambaForCausalLM" in out and "1x attn" in out and "2x ssm2" in out and "8 ssm2" in out
    assert "MambaForCausalLM" in out and "128 ssm1" in out


def test_models_reports_bad_spec(capsys):
    assert main(["models", "definitely not a model"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gna: error: 'definitely not a model': ") and "unknown model spec" in err


def test_patterns_page_is_standalone(tiny_dirs, tmp_path, capsys):
    out = tmp_path / "p.html"
    assert main(["patterns", "--model", str(tiny_dirs["llama"]), "--prompt", "key:value\nThe value is",
                 "--heads", "L0H1,L2H3", "--out", str(out)]) == 0
    html = out.read_text()
    assert "CircuitsVis.render(" in html and '"L0H1"' in html and '"L2H3"' in html
    assert "var CircuitsVis" in html and html.count("var CircuitsVis") == 1
    assert "unpkg.com" not in html and "cdn" not in html.split("<body>")[1].lower()


def test_patterns_bad_head_exits_with_message(tiny_dirs, tmp_path, capsys):
    code = main(["patterns", "--model", str(tiny_dirs["llama"]), "--prompt", "hi", "--heads", "L0H9",
                 "--out", str(tmp_path / "x.html")])
    assert code == 2
    assert "L0H9 is out of range" in capsys.readouterr().err


def test_gna_version(capsys):
    import gna_interp

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"gna {gna_interp.__version__}"


def test_global_options_go_before_or_after_the_subcommand():
    from gna_interp.cli import build_parser

    for argv in (["--quiet", "scan"], ["scan", "--quiet"], ["zoo", "train", "transformer-kv", "--quiet"]):
        assert build_parser(argv).parse_args(argv).quiet is True, argv
    args = build_parser(["--device", "cpu", "scan", "--debug"]).parse_args(["--device", "cpu", "scan", "--debug"])
    assert (args.device, args.debug, args.quiet) == ("cpu", True, False)
    argv = ["scan", "--device", "meta"]
    assert build_parser(argv).parse_args(argv).device == "meta"  # given after the subcommand, it counts
    argv = ["lm-eval", "run", "--quiet"]  # lm-eval's own command line is handed over whole
    assert build_parser(argv).parse_args(argv).harness_args[-1] == "--quiet"


def test_quiet_silences_transformers_and_hub_bars_and_gives_them_back():
    import huggingface_hub.utils as hub
    import transformers

    from gna_interp.progress import set_quiet

    assert transformers.utils.logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()
    was = set_quiet(True)
    try:
        assert not transformers.utils.logging.is_progress_bar_enabled() and hub.are_progress_bars_disabled()
    finally:
        set_quiet(was)
    assert transformers.utils.logging.is_progress_bar_enabled() and not hub.are_progress_bars_disabled()


def test_every_stage_says_it_ran_and_a_long_one_keeps_saying_so(monkeypatch):
    import time

    from gna_interp.circuits.search import discovery
    from gna_interp.cli.stages import announced_stages

    lines: list[str] = []
    table = (("roles", lambda d: True), ("curve", lambda d: time.sleep(0.35) or True), ("twin", lambda d: False))
    monkeypatch.setattr(discovery, "STAGES", table)
    monkeypatch.setattr("gna_interp.cli.stages.to_terminal", lambda: True)  # a log gets no heartbeat; a terminal does
    with announced_stages(lines.append, heartbeat_s=0.1):
        assert [stage(None) for _, stage in discovery.STAGES] == [True, True, False]
    assert discovery.STAGES is table
    assert lines[0].startswith("[roles] gather / aggregate scores") and lines[-1].startswith("[curve] top-k")
    beats = [x for x in lines if "running" in x]
    assert len(beats) >= 2 and all(x.startswith("[curve]") for x in beats)
    assert not any(x.startswith("[twin]") for x in lines)  # a stage that did not run says nothing


def test_a_missing_png_export_names_the_extra(monkeypatch, tmp_path):
    import sys

    from gna_interp.errors import install_hint
    from gna_interp.viz.export import png_note

    monkeypatch.setitem(sys.modules, "kaleido", None)  # as if not installed
    note = png_note(tmp_path)
    assert note is not None and f"{install_hint('figures')} adds it" in note and "[figures]" in note
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "scores.png").write_bytes(b"\x89PNG")
    assert png_note(tmp_path) is None


def test_the_cache_follows_gna_cache_then_xdg(monkeypatch, tmp_path):
    from gna_interp.models.spec import cache_dir

    monkeypatch.delenv("GNA_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    if sys_platform() == "linux":
        assert cache_dir() == tmp_path / "xdg" / "gna_interp"
    monkeypatch.setenv("GNA_CACHE", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"


def sys_platform() -> str:
    import sys

    return sys.platform


@pytest.mark.slow
def test_a_closed_stdout_leaves_a_complete_run_folder(tmp_path):
    """``gna scan | head -1``: the reader goes away after one line; the scan finishes, writes every output and
    exits 0 without a BrokenPipeError traceback."""
    import os
    import subprocess
    import sys

    from gna_interp.models import zoo_names

    if "transformer-kv" not in zoo_names():
        pytest.skip("the zoo Transformer is not installed")
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "gna_interp", "scan", "--model", "zoo:transformer-kv",
                             "--threads", "1", "--samples", "12", "--calibrate", "0", "--no-control", "--no-png", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert proc.stdout is not None and proc.stdout.readline()
    proc.stdout.close()  # as head -1 does
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert b"BrokenPipeError" not in err and b"Traceback" not in err
    for name in ("scan.csv", "scan.json", "circuit.json", "views.pt", "summary.md", "report.html"):
        assert (out / name).is_file(), name
