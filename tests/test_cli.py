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
