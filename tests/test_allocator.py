"""The C allocator's rules (gna_interp.allocator), each measured in a process of its own: inside
``heap_temporaries`` a run of large temporaries reuses mapped pages instead of faulting fresh ones (under the pinned
rule each faults every page afresh); on exit, also after an exception, the pinned rule is back: the blockwise loop
does not grow the heap."""

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the rules are glibc's")


def _run(body: str) -> list[int]:
    script = textwrap.dedent("""
        import resource, torch
        from gna_interp.allocator import heap_temporaries, pin_mmap_threshold
        assert pin_mmap_threshold()
        torch.set_num_threads(1)

        def faults(n, size):
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(n):
                x = torch.empty(size // 4)
                x.fill_(1.0)
                del x
            return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

        def grown():
            x, w = torch.randn(1500, 16), torch.randn(96 * 2048, 16)
            torch.logsumexp(x @ w[:2048].T, -1)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            kept = [torch.logsumexp(x @ w[k:k + 2048].T, -1) for k in range(0, w.shape[0], 2048)]
            return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024
    """) + textwrap.dedent(body)
    got = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert got.returncode == 0, got.stderr
    return [int(v) for v in got.stdout.split()]


def test_large_temporaries_reuse_their_pages_inside_heap_temporaries():
    pinned, inside = _run("""
        pinned = faults(20, 16 << 20)
        with heap_temporaries() as applied:
            assert applied
            faults(20, 16 << 20)  # the heap grows to hold them once
            inside = faults(20, 16 << 20)
        print(pinned, inside)
    """)
    page_runs = 20 * (16 << 20) // 4096  # every page of every block faulted afresh
    assert pinned > 0.9 * page_runs, pinned
    assert inside < 0.05 * page_runs, inside


def test_the_pinned_rule_returns_after_an_exception_and_the_blockwise_loop_does_not_grow_the_heap():
    (grew,) = _run("""
        try:
            with heap_temporaries():
                faults(4, 16 << 20)
                raise KeyError("inside")
        except KeyError:
            pass
        print(grown())
    """)
    assert grew < 100, f"the heap grew by {grew} MB over 96 blocks of 12 MB"
