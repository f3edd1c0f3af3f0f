"""One folder, one owner: every command that writes into ``--out`` claims it (the folder checks and an OS lock on
``.gna.lock``) before its model loads and holds it until it ends. A folder in use or holding another command's
results is refused by every one of them; a lock file left by a run that died blocks nothing and its contents are
never read as a number; reading a folder takes no lock."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gna_interp.cli import build_parser, main
from gna_interp.errors import InputError
from gna_interp.run_folder import LOCK_FILE, RESULTS, Lock, RunFolder
from made_up import held_lock
from test_hostile_folders import COMMANDS, _refused, scan_folder  # noqa: F401 -- scan_folder is a fixture

EVERY = [*COMMANDS, "report"]


def _argv(command: str, folder: Path) -> list[str]:
    return ["report", str(folder), "--no-png"] if command == "report" else [*COMMANDS[command], "--out", str(folder)]


def test_every_writing_command_is_enumerated():
    """Each subcommand with an output folder (``--out``, or ``gna report``'s DIR) is in RESULTS and in the lists of
    this test; ``gna patterns`` writes one file by an atomic rename (its --out is a file, checked, not locked)."""
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices
    writing = set()
    for name, p in sub.items():
        inner = next((a for a in p._actions if isinstance(a, argparse._SubParsersAction)), None)
        for sub_name, sp in (inner.choices.items() if inner else [(None, p)]):
            if any("--out" in a.option_strings for a in sp._actions):
                writing.add(f"{name} {sub_name}" if sub_name else name)
    assert writing - {"patterns"} == set(RESULTS) == set(COMMANDS)
    assert "report" in EVERY


@pytest.mark.parametrize("command", EVERY)
def test_every_writing_command_refuses_a_folder_in_use(command, scan_folder, tmp_path, capsys):
    import shutil

    folder = tmp_path / "out"
    if command == "report":
        shutil.copytree(scan_folder, folder)
    else:
        folder.mkdir()
    with held_lock(folder):
        _refused(_argv(command, folder), capsys, "in use by another gna process", folder)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_writing_command_refuses_another_commands_folder(command, tmp_path, capsys):
    other = next(c for c in RESULTS if c != command)
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / RESULTS[other][0]).write_text("{}")
    (folder / "report.html").write_text("<p>their page</p>")
    _refused(_argv(command, folder), capsys, f"holds the results of `gna {other}`", folder)


def test_a_command_holds_the_folder_from_its_claim_to_its_end(tmp_path):
    """A slow command (here: one claimed, still loading) keeps a second one out; after it ends the folder is free and
    no lock file is left."""
    out = tmp_path / "o"
    first = RunFolder(out, "scan").claim()
    with pytest.raises(InputError, match="in use by another gna process"):
        _claim_in_child(out, "hybrid plan")
    first.release()
    assert not (out / LOCK_FILE).exists()
    assert _claim_in_child(out, "hybrid plan") == "claimed"


def _claim_in_child(out: Path, command: str) -> str:
    code = ("import sys\nfrom gna_interp.run_folder import RunFolder\nfrom gna_interp.errors import InputError\n"
            "try:\n    RunFolder(sys.argv[1], sys.argv[2]).claim(); print('claimed')\n"
            "except InputError as e:\n    print('refused', e)\n")
    got = subprocess.run([sys.executable, "-c", code, str(out), command], capture_output=True, text=True,
                         timeout=60).stdout.strip()
    if got.startswith("refused"):
        raise InputError(got)
    return got


@pytest.mark.parametrize("contents", ["", "12345678901234567890123456789", "999999999", "not a pid \x1b[2J",
                                      "this process's own id"])
def test_a_lock_file_nobody_holds_is_no_obstacle_whatever_it_says(contents, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / LOCK_FILE).write_text(str(os.getpid()) if contents == "this process's own id" else contents)
    Lock(out).check()
    with Lock(out) as lock:
        assert lock.held
    assert not (out / LOCK_FILE).exists()


def test_a_killed_holder_leaves_nothing_that_blocks(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    with held_lock(out) as proc:
        with pytest.raises(InputError, match="in use"):
            Lock(out).check()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert (out / LOCK_FILE).exists()  # left behind by the killed process
        with Lock(out):
            pass


def test_the_refusal_names_no_number_from_the_file(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    with held_lock(out):
        (out / LOCK_FILE).write_text("9" * 40)
        with pytest.raises(InputError) as e:
            Lock(out).acquire()
    assert "9" * 10 not in str(e.value)


def test_reading_a_folder_takes_no_lock(scan_folder, tmp_path):
    """A folder in use by a writer, or one that cannot be written, is still read."""
    import shutil

    import gna_interp as gna

    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    with held_lock(folder):
        assert gna.Circuit.load(folder).heads
    os.chmod(folder, 0o555)
    try:
        assert gna.Circuit.load(folder).heads
    finally:
        os.chmod(folder, 0o755)


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into read-only folders")
def test_a_read_only_folder_is_refused_in_one_line(scan_folder, tmp_path, capsys):
    import shutil

    folder = tmp_path / "run"
    shutil.copytree(scan_folder, folder)
    os.chmod(folder, 0o555)
    try:
        _refused(["report", str(folder), "--no-png"], capsys, "cannot", folder)
    finally:
        os.chmod(folder, 0o755)


def test_a_claimed_folder_that_stays_empty_is_removed_again(tmp_path, capsys):
    """A command refused after its claim (here: a bad --order/--scan pair) leaves no folder behind."""
    out = tmp_path / "new" / "plan"
    assert main(["hybrid", "plan", "--model", "config:llama-3.2-1b", "--order", "random", "--out", str(out)]) == 2
    assert "--seed" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
