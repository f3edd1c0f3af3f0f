"""The C allocator's rule for large temporaries, fixed for a process that runs scans.

glibc's ``malloc`` serves a large block from ``mmap`` (returned to the system when freed) only above a threshold
that it raises, up to 32 MiB, each time such a block is freed. Past that, a loop that makes one large temporary after
another with small allocations in between -- the blockwise head: a ``rows x 2048`` block of logits and a row of
log-sum-exps for every block of the vocabulary -- takes each block from the heap, the next small allocation splits
the freed block, and the heap grows by about one block per iteration. Measured with a random Gemma-3 head of 262,144
tokens on 2,698 rows: the process peaked at 3.4 GB for one pass over the vocabulary instead of 0.6 GB. A fixed
threshold (:func:`pin_mmap_threshold`, ``mallopt(M_MMAP_THRESHOLD, ...)``) turns the raising off: blocks of 4 MiB or
more come from ``mmap`` and go back when freed, so the heap holds at most a block of each smaller size.
"""

from __future__ import annotations

import ctypes
import sys

__all__ = ["MMAP_THRESHOLD", "pin_mmap_threshold"]

MMAP_THRESHOLD = 4 << 20  # bytes: allocations this large or larger come from mmap
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number


def pin_mmap_threshold(nbytes: int = MMAP_THRESHOLD) -> bool:
    """Fix glibc ``malloc``'s mmap threshold at ``nbytes`` for this process (see the module); returns whether it was
    applied (False off Linux, or where the C library has no ``mallopt``)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, int(nbytes)))
