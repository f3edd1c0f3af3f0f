"""Stage lines for ``gna scan``: every stage of :func:`~gna_interp.circuits.discover` says when it ends and how long
it took. On a terminal a stage still running also says so every :data:`HEARTBEAT_S` seconds, so the screen never
sits silent for longer than that while the roles, control, curve, paths and views stages run (they have no bar of
their own); in a log or a pipe (stdout no terminal) there is no such line, only the end lines. Stages with bars of
their own (the head scan's attribution and exact bars) get the end line only.

The lines are printed by the command line, around :data:`gna_interp.circuits.search.discovery.STAGES` (the stage table
that :func:`~gna_interp.circuits.discover` reads when it runs); ``--quiet`` keeps the end lines and drops the
heartbeat, as it drops bars."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any, Callable, Iterator

HEARTBEAT_S = 8.0  # on a terminal, a stage still running prints a line this often

# what each stage of discover does, in the words of its line
WHAT = {
    "check": "the intact model solves the task",
    "scan": "every head's drop",
    "formats": "the heads on the other formats",
    "roles": "gather / aggregate scores of the top heads",
    "control": "every head's LM-loss rise on neutral prose",
    "curve": "top-k heads removed together vs random heads",
    "paths": "path patching among the top heads",
    "twin": "knowledge control with the circuit removed",
    "delegation": "which head kind takes which role",
    "views": "patterns for the report",
}
HAS_BARS = frozenset({"scan"})  # stages whose own progress bars already show that they run


def to_terminal() -> bool:
    """Whether stdout is a terminal (not a log file or a pipe): where heartbeats show."""
    from gna_interp.progress import on_terminal

    return on_terminal(sys.stdout)


@contextlib.contextmanager
def heartbeat(say: Callable[[str], Any], label: str, every: float | None = None, on: bool = True) -> Iterator[None]:
    """While the block runs, ``say("LABEL: running, N s")`` every ``every`` seconds (default :data:`HEARTBEAT_S`)
    from a daemon thread (stopped and joined on exit, exceptions included); only on a terminal: nothing in a log or
    a pipe, with ``on=False`` or under ``--quiet``."""
    from gna_interp.progress import quiet

    if not on or quiet() or not to_terminal():
        yield
        return
    every = HEARTBEAT_S if every is None else every
    start = time.perf_counter()
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every):
            say(f"{label}: running, {time.perf_counter() - start:.0f} s")

    ticker = threading.Thread(target=beat, name="gna-heartbeat", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


@contextlib.contextmanager
def announced_stages(say: Callable[[str], Any], heartbeat_s: float | None = None) -> Iterator[None]:
    """Inside the block, each stage of ``discover`` that runs ends with the line ``[name] what: 12.3 s`` given to
    ``say``; on a terminal, a stage running longer than ``heartbeat_s`` (default :data:`HEARTBEAT_S`) says
    ``[name] what: running, 8 s`` every ``heartbeat_s`` seconds (not under ``--quiet``, nor for stages with bars of
    their own: :func:`heartbeat`). The stage table is restored on exit."""
    from gna_interp.circuits.search import discovery

    saved = discovery.STAGES

    def wrap(name: str, stage: Callable[[Any], bool]) -> Callable[[Any], bool]:
        what = WHAT.get(name, name)

        def run(d: Any) -> bool:
            start = time.perf_counter()
            with heartbeat(say, f"[{name}] {what}", heartbeat_s, on=name not in HAS_BARS):
                ran = stage(d)
            if ran:
                say(f"[{name}] {what}: {time.perf_counter() - start:.1f} s")
            return ran

        run.__name__ = getattr(stage, "__name__", name)
        return run

    discovery.STAGES = tuple((name, wrap(name, stage)) for name, stage in saved)
    try:
        yield
    finally:
        discovery.STAGES = saved
