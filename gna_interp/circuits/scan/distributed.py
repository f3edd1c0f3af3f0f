"""Sharded head scans over the ranks of a ``torch.distributed`` job (``torchrun``, one node or several).

``torchrun --nproc-per-node N -m gna_interp scan ...`` starts ``N`` processes with ``WORLD_SIZE=N`` (and
``RANK``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) in their environment. :func:`active` sees
``WORLD_SIZE > 1`` and joins the job (``init_process_group``; backend ``gloo``, or ``cpu:gloo,cuda:nccl``
when CUDA is available -- the scan only exchanges small Python objects, which travel over the CPU
backend either way); from then on :func:`~gna_interp.circuits.scan.scan_heads` in that process is
*sharded*:

- every rank loads the model and runs the cheap, sequential parts of the scan identically: the task
  plan, the clean prefixes, the attribution pass, the decisions of ``auto`` (which heads to settle
  next). Rank 0 broadcasts the baseline, the attribution estimates and the replay check, so every rank
  decides from the same numbers even where a device's kernels are not bitwise reproducible;
- each *exact phase* (a list of heads to ablate exactly, cut into the same replay groups as in one
  process: a group is up to ``stack`` heads of one layer, stacked in one replay) is split by whole
  groups: :func:`assign` gives each group to a rank, a pure function of the group list and the world
  size (largest estimated cost first, to the least-loaded rank). A head is therefore scored in exactly the
  batch composition and stack it has in a single process, and the numbers are bitwise the same;
- after each phase the ranks all-gather their per-sample results, so every rank holds the whole scan
  and takes the next decision from the same state. The call returns the complete scan on every rank.

Checkpoints: with ``checkpoint=PATH`` each rank writes its own file :func:`rank_path`
(``scan.ckpt.rank1-of-4.json`` beside ``scan.ckpt.json``) atomically after every finished group; at the end
rank 0 writes the merged scan to ``PATH`` (what a single process leaves) and the rank files are deleted.
A scan -- sharded or not, with any number of ranks -- started with the same arguments merges ``PATH``
and every rank file of :func:`rank_files` that belongs to the same scan (the fingerprint: model, task,
method, reference, heads) and skips the heads they hold; a rank file of another scan is refused.

Only ``scan_heads`` is sharded. :func:`leave` ends this process's part in the job: later scans in it run
alone (``gna scan`` leaves after the head scan; rank 0 then runs the control scan, roles, curve and
report on its own while the other ranks exit).

Bitwise equality with one process also needs the same floating-point environment: the same device
type, dtype and torch build, and the same CPU thread count (``torchrun`` sets ``OMP_NUM_THREADS=1`` per
rank when it is unset; compare with a single process run with ``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence, TypeVar

import torch

from gna_interp.errors import GnaError, InputError

__all__ = ["Shard", "active", "assign", "check_world", "leave", "local_device", "rank_files", "rank_path", "run_job"]

T = TypeVar("T")
R = TypeVar("R")

TIMEOUT_ENV = "GNA_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 4 * 3600  # a rank waits this long for the others at a gather (the slowest share of a phase)
_RANK_FILE = re.compile(r"\.rank(\d+)-of-(\d+)$")


@dataclass(frozen=True)
class Shard:
    """This process's place in a distributed job, and the collectives the scan uses.

    Attributes:
        rank: this process's index, ``0 .. world - 1`` (torchrun's ``RANK``); rank 0 leads.
        world: how many processes share the job (torchrun's ``WORLD_SIZE``, at least 2).
    """

    rank: int
    world: int

    @property
    def lead(self) -> bool:
        """Rank 0: the rank that writes the merged outputs."""
        return self.rank == 0

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (picklable), in rank order, on every rank."""
        out: list[Any] = [None] * self.world
        torch.distributed.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank."""
        box = [obj]
        torch.distributed.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        """Wait until every rank gets here."""
        torch.distributed.barrier()


_STATE: dict[str, bool] = {"left": False, "owned": False}


def _world_from_env() -> int:
    text = os.environ.get("WORLD_SIZE", "").strip()
    if not text:
        return 1
    try:
        return int(text)
    except ValueError:
        raise InputError(f"WORLD_SIZE={text!r} is not an integer; launch sharded scans with torchrun "
                         f"(torchrun --nproc-per-node N -m gna_interp scan ...)") from None


def _timeout() -> timedelta:
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    try:
        seconds = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        raise InputError(f"{TIMEOUT_ENV}={text!r} is not a number of seconds") from None
    if seconds <= 0:
        raise InputError(f"{TIMEOUT_ENV}={text!r} must be a positive number of seconds")
    return timedelta(seconds=seconds)


def active() -> Shard | None:
    """This process's :class:`Shard`, or None when it runs alone.

    Alone: ``WORLD_SIZE`` unset or 1 and no process group initialised, or after :func:`leave`. Under
    ``torchrun`` (``WORLD_SIZE > 1``) the first call initialises the default process group (gloo; plus
    nccl for CUDA tensors where CUDA is available), with a collective timeout of ``GNA_DIST_TIMEOUT``
    seconds (default 4 hours); a process group initialised by the caller is used as it is.
    """
    if _STATE["left"]:
        return None
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        world = dist.get_world_size()
        return Shard(dist.get_rank(), world) if world > 1 else None
    world = _world_from_env()
    if world <= 1:
        return None
    if not dist.is_available():
        raise GnaError(f"WORLD_SIZE={world} asks for a sharded scan, but this torch build ({torch.__version__}) has no "
                       f"torch.distributed; run in one process (unset WORLD_SIZE) or install a torch with it")
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise InputError(f"WORLD_SIZE={world} is set but {', '.join(missing)} not: launch sharded scans with torchrun "
                         f"(torchrun --nproc-per-node N -m gna_interp scan ...), or unset WORLD_SIZE to run alone")
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    if cuda:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=_timeout())
    _STATE["owned"] = True
    return Shard(dist.get_rank(), dist.get_world_size())


def leave() -> None:
    """End this process's part in the distributed job: later scans here run alone. Destroys the process
    group if :func:`active` created it. Call it once every rank is past its last collective."""
    if _STATE["owned"] and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    _STATE["owned"] = False
    _STATE["left"] = True


def run_job(shard: Shard | None, lock: Callable[[], ContextManager[Any]], prepare: Callable[[], None],
            sharded: Callable[[], T], lead: Callable[[T | None, float], R]) -> R | None:
    """Run a command whose first part is sharded over the ranks of ``shard``'s job (alone when ``shard`` is None).

    Every rank waits until all have checked their inputs; the lead rank (alone: this process) takes ``lock()``
    (e.g. the output folder's) and holds it to the end; every rank runs ``prepare()`` (e.g. deleting stale
    checkpoints) and waits for the others, so that no rank reads what another is deleting. Under torchrun every
    rank then runs ``sharded()`` and leaves the job (:func:`leave`); the other ranks return None, the lead returns
    ``lead(what sharded() returned, its seconds)``. Alone: ``lead(None, 0.0)``.
    """
    leads = shard is None or shard.lead
    if shard is not None:
        shard.barrier()  # every rank has checked its inputs before the lead locks the output
    with lock() if leads else contextlib.nullcontext():
        prepare()
        if shard is None:
            return lead(None, 0.0)
        shard.barrier()  # what prepare() deletes is gone before any rank reads it
        started = time.perf_counter()
        first = sharded()
        seconds = time.perf_counter() - started
        leave()
        return lead(first, seconds) if leads else None


def local_device(device: str | None) -> str | None:
    """The device a rank loads its model on: ``cuda:LOCAL_RANK`` when ``device`` is None or ``"cuda"`` and
    CUDA is available (one GPU per rank), else ``device`` unchanged."""
    if device not in (None, "cuda") or not torch.cuda.is_available():
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % torch.cuda.device_count()}"


def check_world(world: int, n_heads: int) -> None:
    """Refuse more ranks than heads to scan (:class:`InputError`)."""
    if world > n_heads:
        raise InputError(f"{world} ranks for a scan of {n_heads} head(s): every rank needs a head to score; launch at "
                         f"most {n_heads} (torchrun --nproc-per-node {n_heads}) or scan more heads")


def assign(costs: Sequence[float], world: int) -> list[int]:
    """The rank of each unit of work: largest cost first (ties: earlier unit first), each to the rank
    with the least cost so far (ties: the lower rank). A pure function of ``costs`` and ``world``."""
    load = [0.0] * world
    owner = [0] * len(costs)
    for i in sorted(range(len(costs)), key=lambda i: (-costs[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        owner[i] = r
        load[r] += costs[i]
    return owner


def rank_path(path: str | os.PathLike, rank: int, world: int) -> Path:
    """The checkpoint of ``rank`` of ``world`` beside ``path``: ``scan.ckpt.json`` -> ``scan.ckpt.rank0-of-2.json``."""
    p = Path(path)
    return p.with_name(f"{p.stem}.rank{rank}-of-{world}{p.suffix}")


def rank_files(path: str | os.PathLike) -> list[Path]:
    """The rank checkpoints of ``path`` that exist (any world size), sorted by world size, then rank."""
    p = Path(path)
    if not p.parent.is_dir():
        return []
    found = []
    for f in p.parent.glob(f"{p.stem}.rank*-of-*{p.suffix}"):
        m = _RANK_FILE.search(f.name[: len(f.name) - len(p.suffix)] if p.suffix else f.name)
        if m and f.name == rank_path(p, int(m[1]), int(m[2])).name and f.is_file():
            found.append((int(m[2]), int(m[1]), f))
    return [f for _, _, f in sorted(found)]
