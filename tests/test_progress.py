"""Progress as users expect it: one helper decides (gna_interp.progress); TQDM_DISABLE and
``gna --quiet`` turn every bar off; logs and pipes get plain lines; transformers' GGUF bar is quiet off a terminal."""

from __future__ import annotations

import io
import re

import pytest

import gna_interp.circuits.search.prune as circuits_prune
import gna_interp.circuits.scan as circuits_scan
import gna_interp.progress as progress
from gna_interp.cli import main

# tqdm's time stamp, in its bars and in our plain lines alike: "[00:03<00:10, " or "[00:03, "
BAR = re.compile(r"\[\d+:\d\d(<|, )")
CHEAP_SCAN = ["scan", "--model", "zoo:transformer-kv", "--samples", "6", "--pairs", "6", "--calibrate", "0",
              "--strategy", "exact", "--top-k", "1", "--seeds", "1", "--no-control", "--threads", "1", "--no-png"]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    progress.set_quiet(False)
    yield
    progress.set_quiet(False)


def _run(bar_args: dict, **kwargs) -> str:
    out = io.StringIO()
    bar = progress.tqdm(range(5), desc="stage", unit="step", file=out, **bar_args, **kwargs)
    for _ in bar:
        pass
    return out.getvalue()


def test_off_a_terminal_a_bar_is_plain_lines():
    text = _run({})
    lines = text.splitlines()
    assert "\r" not in text and "\x1b" not in text
    assert lines[0].startswith("stage: 0/5 step (0%)") and lines[-1].startswith("stage: 5/5 step (100%)"), lines


@pytest.mark.parametrize("off", [{"progress": False}, {"disable": True}])
def test_the_caller_turns_a_bar_off(off):
    assert _run(off) == ""


@pytest.mark.parametrize("value, shown", [("1", False), ("true", False), ("0", True), ("", True), ("false", True)])
def test_tqdm_disable_is_honoured_though_our_bars_pass_disable(monkeypatch, value, shown):
    monkeypatch.setenv("TQDM_DISABLE", value)
    assert bool(_run({"disable": False})) is shown
    assert progress.enabled() is shown


def test_set_quiet_turns_every_bar_off_and_says_what_it_was():
    assert progress.set_quiet(True) is False
    assert _run({}) == "" and not progress.enabled() and not progress.terminal_bars()
    assert progress.set_quiet(False) is True
    assert _run({}) != ""


def test_gguf_bar_is_silenced_off_a_terminal():
    gguf_utils = pytest.importorskip("transformers.modeling_gguf_pytorch_utils")
    from gna_interp.models.loading import gguf_bars_quiet_unless_terminal

    real = gguf_utils.tqdm
    with gguf_bars_quiet_unless_terminal():  # pytest's stderr is no terminal
        assert gguf_utils.tqdm([1, 2]).disable
    assert gguf_utils.tqdm is real


def _bars(text: str) -> list[str]:
    return [line for line in re.split(r"[\r\n]", text) if BAR.search(line)]


def test_every_bar_goes_through_the_one_helper():
    assert circuits_scan.tqdm is progress.tqdm and circuits_prune.tqdm is progress.tqdm


@pytest.mark.slow
def test_gna_scan_prints_no_bar_with_tqdm_disable_or_quiet(tmp_path, capsys, monkeypatch):
    """The same cheap scan three times: bars (plain lines, stderr is no terminal here), then none with
    TQDM_DISABLE=1, then none with ``gna --quiet``; the scan's own report lines stay."""
    assert main(["--device", "cpu", *CHEAP_SCAN, "--out", str(tmp_path / "shown")]) == 0
    shown = capsys.readouterr()
    assert _bars(shown.err + shown.out), "the scan printed no progress at all: the test would prove nothing"
    assert "\r" not in shown.err  # plain lines off a terminal

    monkeypatch.setenv("TQDM_DISABLE", "1")
    assert main(["--device", "cpu", *CHEAP_SCAN, "--out", str(tmp_path / "env")]) == 0
    env = capsys.readouterr()
    assert not _bars(env.err + env.out), _bars(env.err + env.out)
    monkeypatch.delenv("TQDM_DISABLE")

    assert main(["--device", "cpu", "--quiet", *CHEAP_SCAN, "--out", str(tmp_path / "quiet")]) == 0
    quiet = capsys.readouterr()
    assert not _bars(quiet.err + quiet.out), _bars(quiet.err + quiet.out)
    assert not progress.quiet()  # --quiet lasts for its command only
    assert quiet.out.strip() and (tmp_path / "quiet" / "scan.csv").is_file()
    assert (tmp_path / "quiet" / "report.html").is_file() and not (tmp_path / "quiet" / "figures").exists()  # --no-png
