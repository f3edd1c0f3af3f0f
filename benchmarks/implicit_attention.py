"""Time and peak memory of SSM implicit attention: gna_interp's blocked computation vs the
straightforward full materialisation, measured in the same run.

    python benchmarks/implicit_attention.py            # L = 256, 1024, 2048 (about 1-2 minutes on 2 cores)
    python benchmarks/implicit_attention.py --lengths 256 512 --device cuda

Layers: one Mamba-2 mixer with mamba2-130m's dimensions (d_model 768, 24 heads of 64 channels,
state 128, one B/C group) and one Mamba-1 mixer with mamba-130m's (d_inner 1536, state 16), random
weights, batch 1. Both methods start from the same reconstructed terms (x, Δ, B, C: timed once,
"terms"); what is compared is the implicit-attention step only.

- Mamba-2, **straightforward**: TransformerLens's ``compute_effective_attention`` math -- the
  decay ``L``, ``C Bᵀ`` and ``M`` for every head as ``[batch, H, T, T]`` tensors -- then the
  requested head is picked. **ours, 1 head** / **ours, all heads**: :func:`implicit_attention`.
- Mamba-1, **straightforward**: TransformerLens's per-(channel, state) decay tensor
  ``[batch, c, N, T, T]`` for the selected channels only (the whole layer would need
  ``4·1536·16·T²`` bytes: 6 GiB at T = 256); run only when it fits under ``--cap-gib``.
  **ours**: 8 single channels plus one 64-channel group (72 channels, 9 patterns).

Peak memory on CPU is the resident-set high-water mark above the level just before the call
(Linux ``/proc/self/clear_refs`` + ``VmHWM``, with glibc told to return large blocks to the system
at once so that RSS follows live tensors); on CUDA ``torch.cuda.max_memory_allocated``. The
returned tensor is included in the peak of every method.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import sys
import time
from pathlib import Path
from typing import Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gna_interp.models.ssm_kernel import SSMTerms, implicit_attention, ssm_terms  # noqa: E402

GIB = 2**30
MIB = 2**20


# ---- timing and peak memory ------------------------------------------------------------------


_LIBC = None


def enable_cpu_accounting() -> bool:
    """Make RSS follow live tensors (big blocks mmapped, unmapped on free); True if /proc allows peaks.

    This slows allocation down (fresh pages every time), so every timing is taken before it is enabled.
    """
    global _LIBC
    try:
        libc = _LIBC = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD: blocks >= 1 MiB are mmapped, unmapped on free
        libc.mallopt(-1, 1 << 20)  # M_TRIM_THRESHOLD
        open("/proc/self/clear_refs", "w").write("5")
        return True
    except OSError:
        return False


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def timed(fn: Callable[[], torch.Tensor], device: str) -> tuple[float, torch.Tensor]:
    """Best wall time of up to 3 runs (1 run when a run takes over a second) and the result."""
    best, out = float("inf"), None
    for _ in range(3):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn()
        if device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        best = min(best, elapsed)
        if elapsed > 1.0:
            break
    return best, out


def peak_memory(fn: Callable[[], torch.Tensor], device: str, cpu_ok: bool) -> float | None:
    """Peak bytes above the level just before the call (result included)."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        out = fn()
        torch.cuda.synchronize()
        peak = float(torch.cuda.max_memory_allocated() - start)
    elif cpu_ok:
        _LIBC.malloc_trim(0)  # hand freed heap pages back, so that reusing them shows up in RSS
        open("/proc/self/clear_refs", "w").write("5")
        start = _status("VmRSS:")
        out = fn()
        peak = float(_status("VmHWM:") - start)
    else:
        return None
    del out
    return peak


# ---- the straightforward materialisations (TransformerLens's formulas) ----------------------


def full_ssd(t: SSMTerms, head: int) -> torch.Tensor:
    """Every head's M as [b, H, T, T] (decay L, C Bᵀ, M), then the requested head."""
    b, T = t.shape
    A = t.A[:, 0]
    cs = torch.cumsum(t.dt * A[None, None, :], dim=1).permute(0, 2, 1)  # [b, H, T]
    L_log = cs[:, :, :, None] - cs[:, :, None, :]
    causal = torch.ones(T, T, dtype=torch.bool, device=L_log.device).tril()
    L = torch.where(causal[None, None], torch.exp(L_log), torch.zeros_like(L_log))
    del L_log
    B = t.B.repeat_interleave(t.units_per_group, dim=2)  # [b, T, H, N]
    C = t.C.repeat_interleave(t.units_per_group, dim=2)
    CB = torch.einsum("bihs,bjhs->bhij", C, B)
    M = L * CB * t.dt.permute(0, 2, 1)[:, :, None, :]
    del L, CB
    return M[:, head:head + 1].clone()


def full_s6(t: SSMTerms, channels: list[int], units: list[list[int]]) -> torch.Tensor:
    """The [b, c, N, T, T] decay of the selected channels, M per channel, then group means."""
    b, T = t.shape
    idx = torch.tensor(channels, device=t.dt.device)
    dt = t.dt[:, :, idx].permute(0, 2, 1)  # [b, c, T]
    A = t.A[idx]  # [c, N]
    cum = torch.cumsum(dt, dim=-1)
    dcs = cum[:, :, :, None] - cum[:, :, None, :]  # [b, c, T, T]
    expo = A[None, :, :, None, None] * dcs[:, :, None]  # [b, c, N, T, T]
    causal = torch.ones(T, T, dtype=torch.bool, device=expo.device).tril()
    decay = torch.where(causal, torch.exp(expo), torch.zeros_like(expo))
    del expo, dcs
    Bt, Ct = t.B[:, :, 0].permute(0, 2, 1), t.C[:, :, 0].permute(0, 2, 1)  # [b, N, T]
    M = (Ct[:, None, :, :, None] * decay * Bt[:, None, :, None, :]).sum(2) * dt[:, :, None, :]
    del decay
    pos = {c: i for i, c in enumerate(channels)}
    return torch.stack([M[:, [pos[c] for c in u]].mean(1) for u in units], 1)


# ---- layers ---------------------------------------------------------------------------------


def build_layers(device: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    import transformers as T
    from transformers.models.mamba.modeling_mamba import MambaMixer
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    torch.manual_seed(0)
    m2 = Mamba2Mixer(T.Mamba2Config(hidden_size=768, state_size=128, expand=2, head_dim=64, num_heads=24,
                                    n_groups=1, conv_kernel=4, chunk_size=256, num_hidden_layers=1), 0)
    m1 = MambaMixer(T.MambaConfig(hidden_size=768, state_size=16, expand=2, conv_kernel=4,
                                  num_hidden_layers=1), 0)
    return m2.to(device).eval(), m1.to(device).eval()


def fmt_mem(x: float | None) -> str:
    return "n/a" if x is None else (f"{x / GIB:.2f} GiB" if x >= GIB else f"{x / MIB:.1f} MiB")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch CPU threads (default 1: stable numbers on a shared machine)")
    ap.add_argument("--cap-gib", type=float, default=3.0,
                    help="skip a straightforward run whose estimated peak exceeds this (default 3)")
    args = ap.parse_args()
    device = args.device
    torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    m2, m1 = build_layers(device)
    ssm1_units: list[int | list[int]] = list(range(8)) + [list(range(64, 128))]
    ssm1_channels = list(range(8)) + list(range(64, 128))
    c = len(ssm1_channels)
    print(f"device={device} threads={torch.get_num_threads()} torch={torch.__version__}")

    # Cases per length: (label, straightforward?, estimated straightforward peak, function).
    cases: dict[int, list[tuple[str, bool, float, Callable[[], torch.Tensor]]]] = {}
    for L in args.lengths:
        hidden = torch.randn(1, L, 768, generator=torch.Generator().manual_seed(L)).to(device)
        s2, t2 = timed(lambda: ssm_terms(m2, hidden), device)
        s1, t1 = timed(lambda: ssm_terms(m1, hidden), device)
        print(f"L={L}: terms (shared by both methods) Mamba-2 {s2:.3f}s, Mamba-1 {s1:.3f}s")
        H = t2.n_units
        cases[L] = [
            ("Mamba-2 straightforward, all 24 heads -> 1", True, 5 * H * L * L * 4,
             lambda t2=t2: full_ssd(t2, 5)),
            ("Mamba-2 ours, 1 head", False, 0, lambda t2=t2: implicit_attention(t2, [5])),
            ("Mamba-2 ours, all 24 heads", False, 0, lambda t2=t2, H=H: implicit_attention(t2, list(range(H)))),
            (f"Mamba-1 straightforward, {c} ch [b,c,N,T,T]", True, 3 * c * 16 * L * L * 4,
             lambda t1=t1: full_s6(t1, ssm1_channels, [[u] if isinstance(u, int) else u for u in ssm1_units])),
            ("Mamba-1 ours, 8 ch + 1 group of 64", False, 0, lambda t1=t1: implicit_attention(t1, ssm1_units)),
        ]

    # Phase 1: time (normal allocator) and check ours against the straightforward result.
    results: dict[tuple[int, str], dict[str, object]] = {}
    for L, items in cases.items():
        ref = None
        for label, full, est, fn in items:
            if full and est / GIB > args.cap_gib:
                results[L, label] = {"skip": f"skipped (~{est / GIB:.0f} GiB)"}
                ref = None
                continue
            sec, out = timed(fn, device)
            entry: dict[str, object] = {"time": sec}
            if full:
                ref = out
            elif ref is not None and out.shape == ref.shape:
                entry["err"] = f"{float((out - ref).norm() / ref.norm()):.1e}"
            results[L, label] = entry
            del out
        del ref

    # Phase 2: peak memory, each case on its own.
    cpu_ok = device == "cpu" and enable_cpu_accounting()
    for L, items in cases.items():
        for label, _, _, fn in items:
            if "skip" not in results[L, label]:
                results[L, label]["peak"] = peak_memory(fn, device, cpu_ok)

    head = f"{'method':44} {'L':>5} {'time':>9} {'peak mem':>11} {'speed-up':>18} {'mem ratio':>10} {'rel err':>8}"
    print("\n" + head + "\n" + "-" * len(head))
    for L, items in cases.items():
        base: dict[str, object] = {}
        for label, full, _, _ in items:
            r = results[L, label]
            if full:
                base = r
            if "skip" in r:
                print(f"{label:44} {L:>5} {'-':>9} {'-':>11} {r['skip']:>18} {'':>10} {'':>8}")
                continue
            sp = "1.0" if full else _ratio(base.get("time"), r["time"])
            mr = "1.0" if full else _ratio(base.get("peak"), r.get("peak"))
            print(f"{label:44} {L:>5} {r['time']:>8.3f}s {fmt_mem(r.get('peak')):>11} {sp:>18} {mr:>10} "
                  f"{r.get('err', ''):>8}")
    print("\nspeed-up / mem ratio: straightforward ÷ ours (higher is better for ours); "
          "rel err: ours vs straightforward.")
    print("Peak memory includes the returned patterns: 4·T² bytes each (16 MiB at T = 2048).")


def _ratio(full: object, ours: object) -> str:
    if not isinstance(full, float) or not isinstance(ours, float) or ours <= 0:
        return "-"
    return f"{full / ours:.1f}x"


if __name__ == "__main__":
    main()
