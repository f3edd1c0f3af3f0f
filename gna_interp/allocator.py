"""The C allocator's rule for large temporaries, fixed for a process that runs scans.

glibc's ``malloc`` serves a large block from ``mmap`` (returned to the system when freed) only above a threshold
that it raises, up to 32 MiB, each time such a block is freed. Past that, a loop that makes one large temporary after
another with small allocations in between -- the blockwise head: a ``rows x 2048`` block of logits and a row of
log-sum-exps for every block of the vocabulary -- takes each block from the heap, the next small allocation splits
the freed block, and the heap grows by about one block per iteration. Measured with a random Gemma-3 head of 262,144
tokens on 2,698 rows: the process peaked at 3.4 GB for one pass over the vocabulary instead of 0.6 GB. A fixed
threshold (:func:`pin_mmap_threshold`, ``mallopt(M_MMAP_THRESHOLD, ...)``) turns the raising off: blocks of 4 MiB or
more come from ``mmap`` and go back when freed, so the heap holds at most a block of each smaller size.

A block served from ``mmap`` costs its pages' faults each time it is made: one pass of an edge circuit on SmolLM2,
which makes tens of large temporaries per block (stacked receiver streams, per-sender writes, their sums), faulted
2.3 M pages (a third of the pass's 9.1 s). Code that makes the same large blocks over and over keeps them (an edge
circuit's sender rows, gathers, products and sums). Inside :func:`heap_temporaries` blocks below 32 MiB (glibc's
largest threshold) come from the heap and the heap keeps its free memory (``M_TRIM_THRESHOLD``), so later blocks
reuse pages already mapped; on exit the pinned rule returns and the heap is trimmed (``malloc_trim``). ``gna
circuit`` runs every stage so: its node circuits' replays faulted 12.7 M pages of SmolLM2's run under the pin and 0.2
M inside, at the same peak memory (its loops keep no small result per large temporary, the pattern that grows the
heap).
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
from typing import Any, Iterator

__all__ = ["HEAP_THRESHOLD", "MMAP_THRESHOLD", "heap_temporaries", "pin_mmap_threshold"]

MMAP_THRESHOLD = 4 << 20  # bytes: allocations this large or larger come from mmap
HEAP_THRESHOLD = 32 << 20  # bytes: the same inside heap_temporaries (glibc's largest mmap threshold)
KEEP_FREE = 2**31 - 1  # bytes of free heap top kept inside heap_temporaries (M_TRIM_THRESHOLD; mallopt takes an int)
TRIM_THRESHOLD = 128 << 10  # glibc's default M_TRIM_THRESHOLD, restored on exit
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers


def _libc() -> Any:
    """The C library, or None off Linux or where it has no ``mallopt``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None)
        lib.mallopt.argtypes, lib.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
        lib.malloc_trim.argtypes, lib.malloc_trim.restype = [ctypes.c_size_t], ctypes.c_int
    except (OSError, AttributeError):
        return None
    return lib


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc ``malloc``'s mmap threshold at ``nbytes`` for this process (see the module); returns whether it was
    applied (False off Linux, or where the C library has no ``mallopt``)."""
    lib = _libc()
    return lib is not None and bool(lib.mallopt(_M_MMAP_THRESHOLD, int(nbytes)))


@contextlib.contextmanager
def heap_temporaries() -> Iterator[bool]:
    """While inside, blocks below :data:`HEAP_THRESHOLD` come from the heap and the heap keeps its free memory (see
    the module); on exit, also on an exception, the pinned rule (:func:`pin_mmap_threshold`) and glibc's default trim
    threshold return and the heap is trimmed. Yields whether the rule was applied (False off glibc)."""
    lib = _libc()
    applied = lib is not None and bool(lib.mallopt(_M_MMAP_THRESHOLD, HEAP_THRESHOLD)) \
        and bool(lib.mallopt(_M_TRIM_THRESHOLD, KEEP_FREE))
    try:
        yield applied
    finally:
        if lib is not None:
            lib.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
            lib.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
            lib.malloc_trim(0)
