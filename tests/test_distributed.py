"""Sharded scans on torch.distributed (gloo, CPU, 2 ranks): the same bytes as one process, resume after a
killed rank without recomputing its finished heads, and the errors of a bad launch.

Ranks are forked from the test process (the model is loaded once, before the fork) except in the
command-line test, which launches ``torchrun --nproc-per-node 2 -m gna_interp scan`` for real."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from gna_interp import load_model
from gna_interp.circuits import scan as scan_mod
from gna_interp.circuits import scan_heads
from gna_interp.circuits.scan.distributed import assign, rank_files, rank_path
from gna_interp.cli import main
from gna_interp.errors import InputError
from gna_interp.tasks import KVRetrieval

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or sys.platform != "linux",
                                reason="needs torch.distributed and fork (Linux)")

STACK = 2  # two heads per replay: a layer of the zoo transformer is two groups, 4 units of work in all


@pytest.fixture(scope="module")
def zoo():
    model = load_model("zoo:transformer-kv", device="cpu")
    return model, KVRetrieval(6, 8, seed=3, max_value=9, words=model.kv_words)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank: int, world: int, port: int, fn, args) -> None:
    """One forked rank: the torchrun environment, then ``fn(rank, *args)``."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    fn(rank, *args)


def _launch(fn, *args, world: int = 2) -> None:
    mp.start_processes(_rank, args=(world, _free_port(), fn, args), nprocs=world, start_method="fork")


def _scan(model, task, ckpt: Path | None = None, **kw):
    return scan_heads(model, task, strategy="exact", stack=STACK, batch_size=4, checkpoint=ckpt, progress=False, **kw)


def _counting(monkeypatch_target, log: list[str], die_after: int | None = None):
    """Wrap ``_exact_group``: log the heads it scores; SIGKILL this process when called ``die_after + 1``
    times (after ``die_after`` finished groups)."""
    real = monkeypatch_target._exact_group

    def counting(runner, group):
        if die_after is not None and len(log) >= die_after * STACK:
            os.kill(os.getpid(), signal.SIGKILL)
        log.extend(r.site.head.name for r in group)
        return real(runner, group)

    return counting


def _frame_bytes(scan) -> bytes:
    return scan.to_frame().to_csv(index=False).encode()


# ---- forked rank bodies (module level: they run in the children) -----------------------------------------
def _scan_rank(rank: int, model, task, ckpt: Path, out: Path, die_rank: int | None) -> None:
    log: list[str] = []
    scan_mod._exact_group = _counting(scan_mod, log, die_after=1 if rank == die_rank else None)
    scan = _scan(model, task, ckpt)
    (out / f"computed{rank}.json").write_text(json.dumps(log))
    (out / f"frame{rank}.csv").write_bytes(_frame_bytes(scan))


def _too_many_ranks(rank: int, model, task) -> None:
    scan_heads(model, task, heads=["L0H1"], strategy="exact", progress=False)


# ---- tests ----------------------------------------------------------------------------------------------
def test_two_ranks_equal_one_process_and_resume_after_a_killed_rank(zoo, tmp_path, monkeypatch):
    model, task = zoo
    single = _scan(model, task)
    heads = [h.name for h in single.heads]

    # 2 ranks, every head: each rank returns the whole scan, byte for byte the single process's
    run = tmp_path / "run"
    run.mkdir()
    _launch(_scan_rank, model, task, run / "scan.ckpt.json", run, None)
    computed = [json.loads((run / f"computed{r}.json").read_text()) for r in (0, 1)]
    assert sorted(computed[0] + computed[1]) == sorted(heads) and computed[0] and computed[1], computed
    for r in (0, 1):
        assert (run / f"frame{r}.csv").read_bytes() == _frame_bytes(single)
    assert rank_files(run / "scan.ckpt.json") == []  # merged into scan.ckpt.json, then deleted
    assert sorted(json.loads((run / "scan.ckpt.json").read_text())["exact"]) == sorted(heads)

    # rank 1 is SIGKILLed in its second group: its first group is in its rank file, nothing else of it
    dead = tmp_path / "dead"
    dead.mkdir()
    ckpt = dead / "scan.ckpt.json"
    with pytest.raises(mp.ProcessExitedException):
        _launch(_scan_rank, model, task, ckpt, dead, 1)
    groups = [["L0H0", "L0H1"], ["L0H2", "L0H3"], ["L1H0", "L1H1"], ["L1H2", "L1H3"]]  # costs: heads x blocks re-run
    first_of_rank1 = next(g for g, r in zip(groups, assign([4.0, 4.0, 2.0, 2.0], 2)) if r == 1)
    assert first_of_rank1 == ["L0H2", "L0H3"]
    assert sorted(json.loads(rank_path(ckpt, 1, 2).read_text())["exact"]) == first_of_rank1
    assert not ckpt.exists() and not list(dead.glob("computed*"))
    saved = set().union(*(json.loads(f.read_text())["exact"] for f in rank_files(ckpt)))
    assert 2 <= len(saved) < len(heads)
    alone = tmp_path / "alone"
    shutil.copytree(dead, alone)

    # the same launch again: only the unsaved heads are computed, the output is the single process's bytes
    _launch(_scan_rank, model, task, ckpt, dead, None)
    again = [json.loads((dead / f"computed{r}.json").read_text()) for r in (0, 1)]
    assert sorted(again[0] + again[1]) == sorted(set(heads) - saved)
    assert (dead / "frame0.csv").read_bytes() == (dead / "frame1.csv").read_bytes() == _frame_bytes(single)
    assert rank_files(ckpt) == [] and len(json.loads(ckpt.read_text())["exact"]) == len(heads)

    # another world size (one process) merges the same rank files
    log: list[str] = []
    monkeypatch.setattr(scan_mod, "_exact_group", _counting(scan_mod, log))
    resumed = _scan(model, task, alone / "scan.ckpt.json")
    assert sorted(log) == sorted(set(heads) - saved)
    assert _frame_bytes(resumed) == _frame_bytes(single)
    assert rank_files(alone / "scan.ckpt.json") == []


def test_torchrun_scan_writes_the_single_process_scan_csv(tmp_path):
    """`torchrun --nproc-per-node 2 -m gna_interp scan` (auto: attribution on every rank, exact heads split)
    writes the bytes of `scan.csv` that one process writes."""
    args = ["scan", "--model", "zoo:transformer-kv", "--samples", "8", "--pairs", "6", "--no-control", "--seeds", "1",
            "--top-k", "1", "--no-png"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             "-m", "gna_interp", *args, "--out", str(tmp_path / "two")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        assert main([*args, "--out", str(tmp_path / "one")]) == 0  # meanwhile, one process here
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:  # torchrun and its ranks
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, stdout[-3000:] + stderr[-3000:]
    assert "sharded over 2 ranks" in stdout and "rank 1: head scan done" in stdout
    two, one = (tmp_path / "two" / "scan.csv").read_bytes(), (tmp_path / "one" / "scan.csv").read_bytes()
    assert two == one and one.count(b",exact,") == 8
    assert rank_files(tmp_path / "two" / "scan.ckpt.json") == [] and (tmp_path / "two" / "report.html").is_file()


def test_bad_launches_are_refused(zoo, tmp_path):
    model, task = zoo
    with pytest.raises(mp.ProcessRaisedException, match="2 ranks for a scan of 1 head"):
        _launch(_too_many_ranks, model, task)

    ckpt = tmp_path / "scan.ckpt.json"  # a rank file left by a scan of other heads
    _scan(model, task, tmp_path / "other.json", heads=["L0H0", "L1H1"])
    (tmp_path / "other.json").rename(rank_path(ckpt, 1, 2))
    with pytest.raises(InputError, match=r"scan\.ckpt\.rank1-of-2\.json.*different scan"):
        _scan(model, task, ckpt)


def test_assign_balances_whole_units_deterministically():
    costs = [4.0, 4.0, 3.0, 2.0, 2.0, 1.0]
    owner = assign(costs, 2)
    assert owner == assign(list(costs), 2)
    load = [sum(c for c, r in zip(costs, owner) if r == k) for k in (0, 1)]
    assert sorted(load) == [8.0, 8.0]
    assert assign([1.0, 1.0, 1.0], 3) == [0, 1, 2] and assign([5.0], 4) == [0]
