"""What a stage of work costs, measured: wall and CPU seconds, the blocks the model ran (calls, rows, tokens) and the
peak memory the stage reached.

Every forward, full or a replay from a layer, runs the model's blocks one call at a time (``model.blocks()[i](x)``),
so the count of block calls and of the rows and tokens they carried is the stage's work in the model's own unit: a
full forward of ``b`` prompts of ``p`` tokens is ``n_layers`` calls of ``b`` rows and ``b * p`` tokens; a replay
from layer ``L`` is ``n_layers - L`` calls. Peak memory is the process's resident set (Linux resets its high-water
mark at each stage start, ``/proc/self/clear_refs``; elsewhere it is the process's peak so far) and, on a GPU,
torch's peak allocation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

__all__ = ["Cost", "Meter"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


@dataclass
class Cost:
    """One stage's cost: ``wall_s`` and ``cpu_s`` (the process's CPU seconds, every thread), ``block_calls`` (blocks
    run), ``block_rows`` (prompt rows they carried, summed over calls), ``block_tokens`` (rows times positions),
    ``peak_rss_mb`` (resident memory at its peak) and ``peak_cuda_mb`` (torch's peak GPU allocation; None on CPU)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    block_calls: int = 0
    block_rows: int = 0
    block_tokens: int = 0
    peak_rss_mb: float | None = None
    peak_cuda_mb: float | None = None

    def __add__(self, other: "Cost") -> "Cost":
        """Two runs of one stage: times and counts summed, the larger peak."""
        def peak(a: float | None, b: float | None) -> float | None:
            return max(x for x in (a, b) if x is not None) if a is not None or b is not None else None

        return Cost(self.wall_s + other.wall_s, self.cpu_s + other.cpu_s, self.block_calls + other.block_calls,
                    self.block_rows + other.block_rows, self.block_tokens + other.block_tokens,
                    peak(self.peak_rss_mb, other.peak_rss_mb), peak(self.peak_cuda_mb, other.peak_cuda_mb))

    def to_dict(self) -> dict[str, Any]:
        """The fields, times rounded to 10 ms and memory to 0.1 MB."""
        out = dataclasses.asdict(self)
        for k in ("wall_s", "cpu_s"):
            out[k] = round(out[k], 2)
        for k in ("peak_rss_mb", "peak_cuda_mb"):
            out[k] = None if out[k] is None else round(out[k], 1)
        return out

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "Cost":
        """The cost :meth:`to_dict` wrote (unknown keys ignored)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


class Meter:
    """Counts the block calls of ``model`` while entered (forward pre-hooks on its blocks, removed on exit, also on
    an exception) and measures stages: ``with meter.stage() as cost: ...`` fills ``cost`` when the block ends."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self._calls = self._rows = self._tokens = 0
        self._handles: list[Any] = []

    def __enter__(self) -> "Meter":
        for block in self.model.blocks():
            self._handles.append(block.register_forward_pre_hook(self._count, with_kwargs=True))
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _count(self, _module: Any, args: tuple, kwargs: dict) -> None:
        x = args[0] if args else kwargs.get("hidden_states")
        self._calls += 1
        if isinstance(x, torch.Tensor) and x.dim() >= 2:
            self._rows += int(x.shape[0])
            self._tokens += int(x.shape[0]) * int(x.shape[1])

    @contextlib.contextmanager
    def stage(self) -> Iterator[Cost]:
        """Measure the block: its :class:`Cost`, filled in on exit."""
        cost = Cost()
        calls, rows, tokens = self._calls, self._rows, self._tokens
        cuda = torch.cuda.is_available() and getattr(self.model, "device", torch.device("cpu")).type == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        _reset_peak_rss()
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield cost
        finally:
            cost.wall_s, cost.cpu_s = time.perf_counter() - wall, time.process_time() - cpu
            cost.block_calls, cost.block_rows = self._calls - calls, self._rows - rows
            cost.block_tokens = self._tokens - tokens
            cost.peak_rss_mb = _peak_rss_mb()
            cost.peak_cuda_mb = torch.cuda.max_memory_allocated() / 2**20 if cuda else None


def _reset_peak_rss() -> None:
    """Reset the process's resident-memory high-water mark where Linux allows it (else nothing)."""
    try:
        _CLEAR_REFS.write_text("5")  # a kernel interface, not a file: the one write here that the store need not make
    except OSError:
        pass


def _peak_rss_mb() -> float:
    """The resident-memory high-water mark since the last reset (Linux), else the process's peak."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024
