"""Stage lines for ``gna scan``: every stage of :func:`~gna_interp.circuits.discover` says when it ends and how long
it took, and a stage still running says so every :data:`HEARTBEAT_S` seconds, so a terminal or a log never sits
silent for longer than that while the roles, control, curve, paths and views stages run (they have no bar of their
own). Stages with bars of their own (the head scan's attribution and exact bars) get the end line only.

The lines are printed by the command line, around :data:`gna_interp.circuits.discovery.STAGES` (the stage table
that :func:`~gna_interp.circuits.discover` reads when it runs); ``--quiet`` keeps the end lines and drops the
heartbeat, as it drops bars."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable, Iterator

HEARTBEAT_S = 8.0  # a stage still running prints a line this often (under the 10 s a log may stay silent)

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


@contextlib.contextmanager
def heartbeat(say: Callable[[str], Any], label: str, every: float = HEARTBEAT_S, on: bool = True) -> Iterator[None]:
    """While the block runs, ``say("LABEL: running, N s")`` every ``every`` seconds from a daemon thread (stopped
    and joined on exit, exceptions included); nothing with ``on=False`` or under ``--quiet``."""
    from gna_interp.progress import quiet

    if not on or quiet():
        yield
        return
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
def announced_stages(say: Callable[[str], Any], heartbeat_s: float = HEARTBEAT_S) -> Iterator[None]:
    """Inside the block, each stage of ``discover`` that runs ends with the line ``[name] what: 12.3 s`` given to
    ``say``; a stage running longer than ``heartbeat_s`` says ``[name] what: running, 8 s`` every ``heartbeat_s``
    seconds (not under ``--quiet``, nor for stages with bars of their own). The stage table is restored on exit."""
    from gna_interp.circuits import discovery

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
