"""The scan executor: runs each exact phase of a head scan in one process, or split over torchrun ranks.

A phase is a list of *units* (heads scored together: one replay group, or one head of the naive loop). In one
process every unit runs here in order. Under torchrun (:mod:`gna_interp.circuits.scan.distributed`) the units are
assigned to ranks by whole units (:func:`~gna_interp.circuits.scan.distributed.assign`, balanced by cost), each rank
runs its own, and the ranks all-gather the results so every rank holds the whole phase, in the order one process
records it. Rank 0's verdicts (the baseline, the estimates, whether replays reproduce the model) are broadcast, so
every rank takes the same ``auto`` decisions.
"""

from __future__ import annotations

from typing import Any, Callable

from gna_interp.circuits.scan.distributed import Shard, assign
from gna_interp.engine.replay import PlanRunner
from gna_interp.circuits.scan.result import HeadScan
from gna_interp.interventions.ablation import Replacement
from gna_interp.models.heads import HeadRef
from gna_interp.engine.metrics import Results
from gna_interp.engine.plan import CandidateScores

__all__ = ["Executor", "Unit"]

Unit = list[Replacement]  # heads scored together: one replay group, or one head of the naive loop


class Executor:
    """Runs scan phases here (``shard`` None) or as one rank of a torchrun job."""

    def __init__(self, shard: Shard | None = None) -> None:
        self.shard = shard

    @property
    def lead(self) -> bool:
        """Whether this process reports and writes (rank 0, or the only process)."""
        return self.shard is None or self.shard.lead

    def run(self, units: list[Unit], compute: Callable[[Unit], dict[HeadRef, CandidateScores]],
            record: Callable[[dict[HeadRef, CandidateScores]], None], store: dict[HeadRef, Results],
            cost: Callable[[Unit], float]) -> int:
        """Score each unit with ``compute`` and ``record`` it (into ``store``). Under a shard this rank runs only
        the units assigned to it (by ``cost``), then the ranks all-gather and ``store`` takes every unit's heads in
        the order one process records them. Returns how many heads arrived from other ranks."""
        if self.shard is None:
            for unit in units:
                record(compute(unit))
            return 0
        owner = assign([cost(u) for u in units], self.shard.world)
        mine: dict[HeadRef, Results] = {}
        for unit, rank in zip(units, owner):
            if rank == self.shard.rank:
                record(compute(unit))
                mine.update({r.site.head: store[r.site.head] for r in unit})
        got = {h: v for part in self.shard.gather(mine) for h, v in part.items()}
        phase = [r.site.head for unit in units for r in unit]
        kept = {h: v for h, v in store.items() if h not in got}
        store.clear()
        store.update(kept)
        store.update({h: got[h] for h in phase})
        return len(phase) - len(mine)

    def agree(self, scan: HeadScan) -> None:
        """Rank 0's baseline, estimates and sizes on every rank (``auto`` decides from them)."""
        if self.shard is not None:
            scan.baseline, scan.estimates, scan.sizes = self.shard.broadcast((scan.baseline, scan.estimates,
                                                                              scan.sizes))

    def replay_problem(self, runner: PlanRunner) -> str | None:
        """None when ``runner``'s replays reproduce the model, else why not (under a shard: rank 0's verdict)."""
        why = None if runner.fast else str(runner.mismatch or "the runner does not replay")
        return self.shard.broadcast(why) if self.shard is not None else why

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank (``value`` itself in one process)."""
        return self.shard.broadcast(value) if self.shard is not None else value
