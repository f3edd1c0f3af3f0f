"""What ``gna scan`` prints: stage lines, a three-line result and where the report is, on a terminal and in a log
alike; the whole summary goes to summary.md (``--verbose`` prints it); heartbeats only on a terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from gna_interp.cli import stages

SCAN = ["scan", "--model", "zoo:transformer-kv", "--threads", "1", "--no-png"]
PERIOD_S = 0.02  # the heartbeat period of the log run: far below its longest stages
# the log run, in a child whose stdout and stderr are files: the heartbeat period lowered, the scan as typed
LOGGED = ("import sys; import gna_interp.cli.stages as s; s.HEARTBEAT_S = {period}; from gna_interp.cli import main; "
          "sys.exit(main(sys.argv[1:]))")
STAGE = re.compile(r"^\[(\w+)\] .*: (\d+\.\d) s$")


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": ""}


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, Path]:
    """``gna scan --model zoo:transformer-kv`` once, its stdout and stderr written to files (a log): the stdout
    text, the stderr text and the output folder."""
    root = tmp_path_factory.mktemp("logged")
    out, log, err = root / "scan", root / "stdout.log", root / "stderr.log"
    with log.open("w") as o, err.open("w") as e:
        code = subprocess.run([sys.executable, "-c", LOGGED.format(period=PERIOD_S), *SCAN, "--out", str(out)],
                              stdout=o, stderr=e, env=_env(), timeout=600).returncode
    assert code == 0, err.read_text()
    return log.read_text(), err.read_text(), out


def _on_a_terminal(argv: list[str], cols: int = 120) -> str:
    """Run ``python -m gna_interp ARGV`` with stdout and stderr on a pseudo-terminal ``cols`` wide; what it
    showed, with the terminal's CR LF line ends as LF."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gna_interp", *argv], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=_env())
    os.close(slave)
    chunks = []
    try:
        while chunk := os.read(master, 4096):
            chunks.append(chunk)
    except OSError:  # Linux: EIO once the child has closed the terminal
        pass
    finally:
        os.close(master)
    assert proc.wait(timeout=600) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.mark.slow
def test_a_log_gets_stage_lines_and_no_heartbeat(logged):
    out, err, _ = logged
    assert "running," not in out + err
    took = [float(m.group(2)) for m in map(STAGE.match, out.splitlines()) if m]
    assert max(took) >= 3 * PERIOD_S, "no stage outlasted the heartbeat period: the test would prove nothing"
    assert {"scan", "curve", "paths", "views", "calibrate"} <= {m.group(1) for m in map(STAGE.match, out.splitlines())
                                                                if m}


@pytest.mark.slow
def test_a_log_gets_a_short_result_and_the_summary_stays_in_its_file(logged):
    out, err, folder = logged
    lines = out.splitlines()
    assert len(lines) <= 15 and len(lines + err.splitlines()) <= 20, out + err
    assert [x for x in lines if x.startswith(("top heads (", "removing the top", "controls: "))]
    assert lines[-1] == f"wrote {folder / 'report.html'}: open it in a browser; the full summary is in " \
                        f"{folder / 'summary.md'}"
    summary = (folder / "summary.md").read_text()
    assert summary.startswith("# G&A circuit:") and "| rank | head |" in summary and "## Task form" in summary
    assert "# G&A" not in out and "| rank |" not in out and "\\" not in out


@pytest.mark.slow
def test_a_terminal_shows_at_most_15_lines_and_no_markdown(tmp_path):
    out = tmp_path / "scan"
    text = _on_a_terminal([*SCAN, "--out", str(out)])
    lines = text.rstrip("\n").split("\n")
    assert len(lines) <= 15, text
    assert f"{out / 'report.html'}: open it in a browser" in lines[-1] and str(out / "summary.md") in lines[-1]
    assert "\\" not in text and "# G&A" not in text and "|---" not in text, text
    assert "\x1b" not in text.replace("\x1b[A", "")  # tqdm's bar moves the cursor up; nothing else drives it
    assert (out / "summary.md").read_text().startswith("# G&A circuit:")


def test_verbose_is_a_scan_option():
    from gna_interp.cli import build_parser

    argv = [*SCAN, "--verbose"]
    assert build_parser(argv).parse_args(argv).verbose
    assert not build_parser(SCAN).parse_args(SCAN).verbose


def _beats(monkeypatch, terminal: bool) -> list[str]:
    """The lines a heartbeat of period 0.01 s gives during 0.1 s, with stdout a terminal or not."""
    monkeypatch.setattr(stages, "to_terminal", lambda: terminal)
    lines: list[str] = []
    with stages.heartbeat(lines.append, "[curve] work", every=0.01):
        time.sleep(0.1)
    return lines


def test_a_heartbeat_shows_on_a_terminal_only(monkeypatch):
    beats = _beats(monkeypatch, terminal=True)
    assert len(beats) >= 2 and all(re.fullmatch(r"\[curve\] work: running, \d+ s", x) for x in beats), beats
    assert _beats(monkeypatch, terminal=False) == []


def test_the_heartbeat_period_is_read_when_it_starts(monkeypatch):
    monkeypatch.setattr(stages, "HEARTBEAT_S", 0.01)
    monkeypatch.setattr(stages, "to_terminal", lambda: True)
    lines: list[str] = []
    with stages.heartbeat(lines.append, "loading"):
        time.sleep(0.1)
    assert len(lines) >= 2
