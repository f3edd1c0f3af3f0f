"""Before a model runs: are its heads' hooks there, and what would a scan cost?

:func:`check_hooks` resolves, for every head, the hook names gna_interp uses on it -- the ablation site
(the input of the layer's output projection) and the hooks its pattern is read from -- against the
bridge's hook dict, and checks each head's channels against the output projection's weight shape.
It needs shapes only, so it runs on a model loaded with ``device="meta"`` (a folder holding nothing but a
``config.json``; ``config:NAME`` names the shipped ones).

:func:`estimate_scan` estimates the memory and time of ``gna scan`` on a device of :data:`DEVICES`.
Everything in it is **counted or assumed, not measured**, except the ``cpu-2core`` throughput, which is
calibrated on a measured scan:

- FLOPs are counted from the model's shapes: ``2 x (parameters of the block) x tokens`` per block (each
  parameter of a block once per token: a shared block counts in every layer that runs it), attention's
  quadratic term ``4 x query heads x d_head x T^2`` per attention layer and sequence (eager attention
  computes the full ``T x T`` scores), the SSM scan's elementwise terms, and the unembedding
  ``2 x d_model x vocab`` per position whose logits are computed. The scan computes logits only where the metric
  reads them (``reads`` distinct positions a sample, 1 for single-token candidates): every pass -- the capture,
  each stacked replay (per copy), attribution's forward and backward -- pays ``2 x reads x vocab x d_model`` a
  sample and reads the ``vocab x d_model`` weight once, which on a CPU is memory-bound at a few rows
  (:data:`CPU_UNEMBED_GBS`). ``discover``'s control scores the neutral text at every position (not counted here).
- An exact scan (``--strategy exact``) captures every batch once (a full forward) and, per head,
  replays blocks ``L..N-1`` from the clean input of the head's layer ``L`` (several heads of a layer stacked
  as copies of the batch, up to ``rows_per_replay`` rows); so its cost is ``heads x samples`` sample-forwards
  times the *replay fraction* (the mean share of a forward's block FLOPs from the head's layer on).
  When the clean prefixes exceed ``max_prefix_bytes`` (the scan counts 4 bytes a value) they are
  recomputed for every group of stacked heads. ``auto`` (the default) costs one attribution pass
  (forward + backward, taken as 3 forwards with logits at the read positions only) plus the heads it runs exactly: on SmolLM2 tens of heads
  out of 270 (docs/discovery.md).
- Time per forward is ``max(FLOPs / (peak x utilization), weights read / memory bandwidth)`` on a GPU; the
  peak figures are the vendors' dense (no sparsity) numbers and ``utilization`` (default 0.35) is an
  assumption for eager Hugging Face attention with hooks, not a measurement. ``cpu-2core`` uses the
  throughput of SmolLM2-135M's exact scan measured on this project's 2-core machine (float32; the
  bfloat16/float16 figures scale it by ratios :func:`measure_throughput` measured; see :data:`DEVICES`).
- Memory: weights (parameters x bytes of the dtype, the unembedding in float32, plus buffers), the working set of one forward (the
  largest block's activations: residual copies, the widest linear output, eager attention's scores and
  float32 softmax, the Mamba scans' float32 intermediates as Hugging Face's torch path builds them, and
  the logits), the scan's clean-prefix cache (``samples x tokens x d_model x layers`` in the dtype) and
  the stacked replay's working set; ``auto``'s backward keeps every block's working set (estimated as
  their sum).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import torch

from gna_interp.errors import InputError, OptionError
from gna_interp.models.hf import unwrap
from gna_interp.options import Options, options

if TYPE_CHECKING:
    from gna_interp.models.heads import HeadRef
    from gna_interp.models.model import Model

__all__ = ["CPU_REPLAY_TOKENS", "CPU_UNEMBED_GBS", "DEVICES", "Device", "EstimateOptions", "HookCheck", "STACK_MEMORY_SHARE", "ScanEstimate", "StackBudget", "Throughput",
           "check_hooks", "estimate_scan", "forward_flops", "get_device", "measure_row_bytes", "measure_throughput",
           "replay_row_bytes", "replay_stack"]

GiB = 1 << 30
DEFAULT_UTILIZATION = 0.35
USABLE_MEMORY = 0.9  # share of a device's memory a scan can count on (CUDA context, allocator slack)


@dataclass(frozen=True)
class Device:
    """A device the estimate can target.

    Attributes:
        name: table key, e.g. ``"H100-80GB"``.
        tflops: peak TFLOP/s by dtype name (dense tensor-core figures for bfloat16/float16, plain
            float32 without TF32 -- PyTorch's default for float32 matmuls); for ``cpu-2core`` the
            *measured* effective throughput of a model forward.
        memory_gib: memory in GiB (the estimate counts on ``USABLE_MEMORY`` = 90 % of it).
        bandwidth_gbs: memory bandwidth in GB/s (None: folded into a measured throughput).
        utilization: share of ``tflops`` a forward reaches (an assumption for GPUs; 1.0 where measured).
        measured: whether ``tflops`` was measured here rather than taken from a data sheet.
        source: where the numbers come from.
    """

    name: str
    tflops: dict[str, float]
    memory_gib: float
    bandwidth_gbs: float | None
    utilization: float
    measured: bool
    source: str

    def flops_per_second(self, dtype: str) -> float:
        """Effective FLOP/s for ``dtype`` (peak x utilization)."""
        if dtype not in self.tflops:
            raise OptionError(f"{self.name} has no throughput figure for {dtype}; it has: {', '.join(self.tflops)}")
        return self.tflops[dtype] * 1e12 * self.utilization


# cpu-2core, float32: calibrated on a real scan measured on this project's machine (2 AMD EPYC cores, torch
# 2.13.0+cpu): docs/discovery.md reports SmolLM2-135M's exact runs at "about 3 s" a head (KV, 10 pairs, 32
# samples of 64 tokens); this module counts 235.9 GFLOP a head for that task, hence 78.6 GFLOP/s.
# bfloat16 / float16: that figure times the ratio measure_throughput() found between the dtypes on a random
# Llama (hidden 1024, 2 layers, intermediate 4096, vocab 8192; batch 4 x 128, 2 threads): float32 26.4,
# bfloat16 6.6, float16 7.6 GFLOP/s -- measured while another run shared the two cores (load average ~4), which
# is why its float32 figure is a third of the scan's.
_CPU_FP32 = 78.6e-3
_CPU_MEASURED = {"float32": _CPU_FP32, "bfloat16": _CPU_FP32 * 6.6 / 26.4, "float16": _CPU_FP32 * 7.6 / 26.4}

DEVICES: dict[str, Device] = {d.name: d for d in (
    Device("A100-80GB", {"bfloat16": 312.0, "float16": 312.0, "float32": 19.5}, 80, 2039, DEFAULT_UTILIZATION, False,
           "NVIDIA A100 SXM data sheet (dense; TF32 off)"),
    Device("H100-80GB", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}, 80, 3350, DEFAULT_UTILIZATION, False,
           "NVIDIA H100 SXM data sheet (dense; TF32 off)"),
    Device("H200-141GB", {"bfloat16": 989.0, "float16": 989.0, "float32": 67.0}, 141, 4800, DEFAULT_UTILIZATION,
           False, "NVIDIA H200 SXM data sheet (dense; TF32 off)"),
    Device("L4", {"bfloat16": 121.0, "float16": 121.0, "float32": 30.3}, 24, 300, DEFAULT_UTILIZATION, False,
           "NVIDIA L4 data sheet (dense; TF32 off)"),
    Device("RTX-4090", {"bfloat16": 165.2, "float16": 165.2, "float32": 82.6}, 24, 1008, DEFAULT_UTILIZATION, False,
           "NVIDIA Ada whitepaper (dense, FP32 accumulate)"),
    Device("cpu-2core", dict(_CPU_MEASURED), 24, None, 1.0, True,
           "measured here: a SmolLM2 scan's exact heads on 2 AMD EPYC cores (float32); dtype ratios from "
           "measure_throughput; 24 GiB of RAM"),
)}


def get_device(name: str | Device) -> Device:
    """The :data:`DEVICES` entry called ``name`` (case-insensitive); a clear error naming the known ones."""
    if isinstance(name, Device):
        return name
    for key, dev in DEVICES.items():
        if key.lower() == str(name).strip().lower():
            return dev
    raise OptionError(f"unknown device {name!r} for the estimate; known: {', '.join(DEVICES)}")


def _dtype_name(dtype: torch.dtype | str) -> str:
    from gna_interp.models.loading import dtype_name, parse_dtype

    return dtype_name(parse_dtype(dtype))


# ---- hooks -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HookCheck:
    """What :func:`check_hooks` found.

    Attributes:
        heads: heads checked, by kind.
        hooks: every distinct hook name the heads use (ablation sites and pattern hooks), resolved.
        missing: ``(head name, hook name)`` for hooks the bridge does not have (at most 20 listed).
        n_missing: how many (head, hook) pairs were missing in all.
        layout_errors: heads whose channels do not fit the output projection's input width.
        unsupported: token mixers with no heads listed (``bridge path: HF class``).
    """

    heads: dict[str, int]
    hooks: tuple[str, ...]
    missing: tuple[tuple[str, str], ...]
    n_missing: int
    layout_errors: tuple[str, ...]
    unsupported: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Every hook of every head resolved and every head's channels fit its output projection."""
        return self.n_missing == 0 and not self.layout_errors

    def summary(self) -> str:
        """One line: heads by kind, hooks resolved, what is missing."""
        kinds = ", ".join(f"{n:,} {k}" for k, n in self.heads.items()) or "no heads"
        line = (f"hooks: {kinds}; {len(self.hooks)} hook names resolved"
                f"{'' if self.ok else f', {self.n_missing} missing, {len(self.layout_errors)} layout errors'}")
        if self.missing:
            line += f" (e.g. {self.missing[0][0]}: {self.missing[0][1]})"
        if self.unsupported:
            line += f"; {len(self.unsupported)} mixer(s) without heads (unsupported)"
        return line


def check_hooks(model: "Model", heads: Sequence["HeadRef | str"] | None = None) -> HookCheck:
    """Resolve the hook names of every head (default: :meth:`~gna_interp.models.Model.heads`) against the bridge's hook dict.

    For each head: its ablation site (:meth:`~gna_interp.models.MixerAdapter.site`: the hook at the input of the output
    projection) and its pattern hooks (:meth:`~gna_interp.models.MixerAdapter.pattern_hooks`) must be bridge hooks, and its
    channels ``start:stop`` must lie inside the output projection's input width (read from the weight's
    shape, so a meta model is checked too). Returns a :class:`HookCheck`; ``ok`` says whether all hold.
    """
    from gna_interp.models.model import check_model
    check_model(model, runnable=False)
    hs = model.heads() if heads is None else model.check_heads(list(heads))
    names = set(model.bridge.hook_dict)
    resolved: set[str] = set()
    missing: list[tuple[str, str]] = []
    n_missing = 0
    layout: list[str] = []
    counts: dict[str, int] = {}
    per_layer: dict[tuple[int, str], tuple[Any, list[str], int | None]] = {}
    for h in hs:
        counts[h.kind] = counts.get(h.kind, 0) + 1
        key = (h.layer, h.kind)
        if key not in per_layer:
            spec = model.layer_spec(h.layer, h.kind)
            try:
                width: int | None = int(spec.adapter.output_projection(model, spec).shape[1])
            except Exception:  # noqa: BLE001 - reported below as a layout error
                width = None
            per_layer[key] = (spec, spec.adapter.pattern_hooks(spec), width)
        spec, pattern_hooks, width = per_layer[key]
        site = spec.adapter.site(spec, h)
        for hook in (site.hook, *pattern_hooks):
            if hook in names:
                resolved.add(hook)
            else:
                n_missing += 1
                if len(missing) < 20:
                    missing.append((h.name, hook))
        if width is None or site.stop > width or site.width != width:
            if len(layout) < 20:
                layout.append(f"{h.name}: channels {site.start}:{site.stop} of {site.width}, output projection takes "
                              f"{width if width is not None else 'no 2-D weight'}")
    return HookCheck(counts, tuple(sorted(resolved)), tuple(missing), n_missing, tuple(layout),
                     tuple(f"{s.bridge_path}: {s.hf_class}" for s in model.unsupported()))


# ---- FLOPs and memory of one forward ------------------------------------------------------------
@dataclass(frozen=True)
class _Block:
    params: int          # parameters of the block (each once; shared submodules included)
    attn: tuple[tuple[int, int], ...]    # (query heads, d_head) of each attention module
    ssm1: tuple[tuple[int, int], ...]    # (d_inner, state) of each Mamba-1 mixer
    ssm2: tuple[tuple[int, int, int, int], ...]  # (heads, head_dim, state, chunk) of each Mamba-2 mixer
    widest: int          # the widest linear output in the block (MLP / in_proj)

    def flops(self, tokens: int) -> float:
        """FLOPs of the block on one sequence of ``tokens`` tokens."""
        t = tokens
        f = 2.0 * self.params * t
        f += sum(4.0 * h * d * t * t for h, d in self.attn)
        f += sum(9.0 * di * n * t for di, n in self.ssm1)
        for h, p, n, chunk in self.ssm2:
            f += h * t * (2.0 * min(t, chunk) * (n + p) + 4.0 * n * p)
        return f

    def working_bytes(self, rows: int, tokens: int, d_model: int, nbytes: int) -> float:
        """Activation bytes of the block on ``rows`` sequences of ``tokens`` (inference, freed per block)."""
        rt = rows * tokens
        b = rt * (4 * d_model + 2 * self.widest) * nbytes
        b += sum(rows * h * tokens * tokens * (2 * nbytes + 4) for h, _ in self.attn)
        b += sum(2 * rt * di * n * 4 for di, n in self.ssm1)
        for h, p, n, chunk in self.ssm2:
            # Hugging Face's torch path pads the sequence to whole chunks and holds about five chunk x chunk
            # float32 tensors a head at once (L, G, M and einsum's contiguous copies; segment_sum's two before)
            nc = math.ceil(tokens / chunk)
            b += rows * h * (5 * nc * chunk * chunk + 2 * nc * p * n + 4 * nc * chunk * p) * 4
        return b


def _blocks(model: "Model") -> list[_Block]:
    out = []
    for block in model.blocks():
        mod = unwrap(block)
        params = sum(p.numel() for p in mod.parameters())
        attn, ssm1, ssm2 = [], [], []
        widest = 0
        for sub in mod.modules():
            if unwrap(sub) is not sub:  # a bridge wrapper: its Hugging Face module is visited on its own
                continue
            if isinstance(sub, torch.nn.Linear):
                widest = max(widest, sub.out_features)
            q = getattr(sub, "q_proj", None)
            d_head = getattr(sub, "head_dim", None)
            if q is not None and d_head:
                attn.append((int(unwrap(q).out_features) // int(d_head), int(d_head)))
            a_log = getattr(sub, "A_log", None)
            if isinstance(a_log, torch.Tensor):
                if a_log.dim() == 2:
                    ssm1.append((int(a_log.shape[0]), int(a_log.shape[1])))
                elif a_log.dim() == 1 and hasattr(sub, "head_dim"):
                    ssm2.append((int(sub.num_heads), int(sub.head_dim), int(sub.ssm_state_size),
                                 int(getattr(sub, "chunk_size", 256) or 256)))
        out.append(_Block(int(params), tuple(attn), tuple(ssm1), tuple(ssm2), int(widest)))
    return out


def _dims(model: "Model") -> tuple[int, int]:
    cfg = model.cfg
    return int(getattr(cfg, "d_model", 0) or 0), int(getattr(cfg, "d_vocab", 0) or 0)


def forward_flops(model: "Model", tokens: int, logits: int | None = None) -> float:
    """FLOPs of one forward of one sequence of ``tokens`` tokens (``logits``: positions unembedded,
    default all), counted from the model's shapes as described in :mod:`gna_interp.models.estimate`."""
    d, v = _dims(model)
    return sum(b.flops(tokens) for b in _blocks(model)) + 2.0 * d * v * (tokens if logits is None else logits)


CPU_REPLAY_TOKENS = 2048  # off CUDA a stacked replay holds at most this many tokens (more runs slower a token)
STACK_MEMORY_SHARE = 0.5  # share of the free CUDA memory the stacked replays may plan on (the rest: slack)


@options
class StackBudget(Options):
    """What :func:`replay_stack` sizes a stack with.

    Attributes:
        reads: positions a row's logits are read at; reserve_bytes: memory kept for other things (e.g. the clean
            prefixes the scan keeps).
        free_bytes: the free memory (None: measured on CUDA, the CPU default elsewhere); row_bytes: a forward's
            peak per row (None: measured on CUDA by :func:`measure_row_bytes`).
        share: share of the free memory the stacked replays may plan on.
    """

    reads: int = 1
    reserve_bytes: int = 0
    free_bytes: int | None = None
    row_bytes: int | None = None
    share: float = STACK_MEMORY_SHARE


def replay_stack(model: "Model", rows: int, tokens: int, budget: StackBudget | None = None,
                 **overrides: Any) -> int:
    """Head ablations of one layer to stack in one replay of a batch of ``rows`` sequences of ``tokens``;
    ``budget`` (:class:`StackBudget`) or keyword ``overrides`` of its fields (``reads``, ``reserve_bytes``,
    ``free_bytes``, ``row_bytes``, ``share``).

    Off CUDA (``free_bytes`` None and the model not on a CUDA device): ``max(1, 2048 // (rows * tokens))``, the
    CPU default (a replay of at most :data:`CPU_REPLAY_TOKENS` tokens: on 2 cores a SmolLM2 block ran at 39 us a
    token for 1,392 tokens and at 46 us for 5,568, once its activations no longer stay in the caches). On CUDA, or when ``free_bytes`` is given:
    as many copies of the batch as fit in ``share`` of the free memory less ``reserve_bytes`` (e.g. the clean
    prefixes the scan keeps), at :func:`replay_row_bytes` a row. On CUDA the free memory is
    ``torch.cuda.mem_get_info`` of the model's (first) device plus what PyTorch's allocator holds unused, and
    ``row_bytes`` (a forward's peak per row) is measured first with :func:`measure_row_bytes`: the count alone
    misses Hugging Face's SSM intermediates (on CPU a Mamba-2 row took up to 4.3x the count). At least 1, at
    most the most heads any layer has (a stack only groups heads of one layer).
    """
    b = StackBudget.build(budget, **overrides)
    reads, reserve_bytes, free_bytes, row_bytes, share = b.reads, b.reserve_bytes, b.free_bytes, b.row_bytes, b.share
    for name, value, low in (("rows", rows, 1), ("tokens", tokens, 1), ("reads", reads, 0),
                             ("reserve_bytes", reserve_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise InputError(f"{name} must be an integer >= {low}, got {value!r}")
    if not 0 < share <= 1:
        raise InputError(f"share must be in (0, 1], got {share!r}")
    if free_bytes is None:
        if model.device.type != "cuda":
            return max(1, CPU_REPLAY_TOKENS // (rows * tokens))
        if row_bytes is None:
            row_bytes = measure_row_bytes(model, tokens, min(rows, 4))
        dev = model.device
        free_bytes = int(torch.cuda.mem_get_info(dev)[0] + torch.cuda.memory_reserved(dev)
                         - torch.cuda.memory_allocated(dev))
    cap = max((s.n_heads for s in model.layers if s.supported), default=1)
    fit = int((free_bytes * share - reserve_bytes) // (rows * replay_row_bytes(model, tokens, reads, row_bytes)))
    return max(1, min(cap, fit))


def replay_row_bytes(model: "Model", tokens: int, reads: int = 1, measured: int | None = None) -> int:
    """Working set of one row (one sequence of ``tokens``) of a stacked replay: the largest block's activations
    -- counted (:meth:`_Block.working_bytes`, in the model's dtype) or ``measured`` (a forward's peak per row,
    :func:`measure_row_bytes`), whichever is larger -- plus the block inputs repeated per copy (a
    ``tokens x tokens`` mask, two position tables) and ``reads`` float32 log-prob rows of the vocabulary."""
    nbytes = torch.empty(0, dtype=model.dtype).element_size()
    d, v = _dims(model)
    block = max(b.working_bytes(1, tokens, d, nbytes) for b in _blocks(model))
    return int(max(block, measured or 0) + tokens * tokens * 4 + 2 * tokens * d * 4 + reads * v * 12)


def measure_row_bytes(model: "Model", tokens: int, rows: int = 4) -> int:
    """CUDA memory one row of a forward takes at its peak: ``torch.cuda.max_memory_allocated`` above the level
    before a forward of ``rows`` sequences of ``tokens`` (token id 0, logits of the last position only),
    divided by ``rows``. Resets the device's peak-memory statistics. CUDA models only."""
    if model.device.type != "cuda":
        raise InputError(f"measure_row_bytes measures CUDA memory; {model.name} is on {model.device}: load it with "
                         f"device='cuda'")
    dev = model.device
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    out = model.run(torch.zeros(rows, tokens, dtype=torch.long, device=dev), return_type="logits", logits_to_keep=1)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev) - base
    del out
    return int(peak // rows)


def _param_bytes(model: "Model", nbytes: int) -> tuple[int, int]:
    """(unique parameter count, bytes of the weights plus buffers): the weights in the dtype, except the
    unembedding, which a half-precision model keeps as its own float32 copy (``loading.float32_output``)."""
    hf = model.hf_model
    n = sum(p.numel() for p in hf.parameters())
    buf = sum(b.numel() * b.element_size() for b in hf.buffers())
    head = hf.get_output_embeddings()
    w = unwrap(head).weight if head is not None else None
    head_n = w.numel() if w is not None else 0
    tied = bool(getattr(hf.config, "tie_word_embeddings", False))
    untied_here = w is not None and w is not hf.get_input_embeddings().weight
    if tied and untied_here:  # a half-precision load untied it: count the parameters as the checkpoint has them
        n -= head_n
    extra = 0 if nbytes >= 4 else head_n * (4 if tied else 4 - nbytes)
    return n, n * nbytes + extra + buf


# ---- the estimate --------------------------------------------------------------------------------
@dataclass(frozen=True)
class ScanEstimate:
    """Memory and time of a ``gna scan`` of one model on one device (see :mod:`gna_interp.models.estimate`
    for what is counted and what is assumed).

    Attributes:
        model, device, dtype: what was estimated.
        params: unique parameters; heads: heads scanned, by kind.
        samples, tokens, batch_size: the task (``tokens`` per sample: prompt and answer).
        weight_bytes: parameters x dtype bytes + buffers.
        forward_bytes: working set of one forward of ``batch_size`` samples (largest block + logits at the reads).
        prefix_bytes: the exact scan's clean-prefix cache of all samples (``prefix_kept``: whether the scan
            keeps it, i.e. its 4-bytes-a-value count is within ``max_prefix_bytes``).
        replay_bytes: working set of one stacked replay (``stack`` copies of a batch).
        attribution_bytes: activations kept for one backward of a batch (``auto``'s attribution pass).
        peak_bytes: weights + the largest of (prefix if kept + replay, attribution, forward): an ``auto`` scan.
        exact_peak_bytes: weights + the largest of (prefix if kept + replay, forward): ``--strategy exact``
            (no backward).
        fits: ``peak_bytes`` within the usable memory of the device; fits_exact: ``exact_peak_bytes`` is.
        flops_per_token: FLOPs of a forward divided by its tokens (all positions unembedded).
        replay_fraction: mean over the heads of the share of a forward's block FLOPs a replay runs.
        exact_forwards: ``heads x samples x replay_fraction`` sample-forwards.
        exact_flops, attribution_flops: FLOPs of the exact scan of every head and of one attribution pass.
        seconds_forward: one forward of all samples; seconds_exact: exact scan of every head;
        seconds_per_head: its mean per head; seconds_attribution: one attribution pass.
        reads: distinct positions a sample's logits are read at (each pass unembeds them).
        notes: assumptions that matter for this row.
    """

    model: str
    device: str
    dtype: str
    params: int
    heads: dict[str, int]
    samples: int
    tokens: int
    batch_size: int
    stack: int
    weight_bytes: int
    forward_bytes: int
    prefix_bytes: int
    prefix_kept: bool
    replay_bytes: int
    attribution_bytes: int
    peak_bytes: int
    exact_peak_bytes: int
    memory_bytes: int
    fits: bool
    fits_exact: bool
    flops_per_token: float
    replay_fraction: float
    exact_forwards: float
    exact_flops: float
    attribution_flops: float
    seconds_forward: float
    seconds_exact: float
    seconds_per_head: float
    seconds_attribution: float
    measured_throughput: bool
    reads: int = 1
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def n_heads(self) -> int:
        return sum(self.heads.values())

    def to_dict(self) -> dict[str, Any]:
        """Plain values (JSON-ready)."""
        return asdict(self)

    def row(self) -> dict[str, str]:
        """The table row ``gna models --estimate`` prints."""
        return {
            "model": self.model, "device": self.device, "dtype": self.dtype,
            "heads": f"{self.n_heads:,}", "weights": _gib(self.weight_bytes),
            "forward": _gib(self.forward_bytes), "prefix": _gib(self.prefix_bytes) + ("" if self.prefix_kept else "*"),
            "peak auto": _gib(self.peak_bytes), "peak exact": _gib(self.exact_peak_bytes),
            "fits": "yes" if self.fits else "exact only" if self.fits_exact else "NO",
            "task fwd TFLOP": f"{self.flops_per_token * self.tokens * self.samples / 1e12:,.2f}",
            "replay": f"{self.replay_fraction:.2f}", "per head": _duration(self.seconds_per_head),
            "exact scan": _duration(self.seconds_exact), "attribution": _duration(self.seconds_attribution),
        }

    def summary(self) -> str:
        """A few lines for one model and device."""
        kinds = ", ".join(f"{n:,} {k}" for k, n in self.heads.items())
        lines = [
            f"  {self.model} on {self.device}, {self.dtype}: {self.params:,} parameters, {kinds} heads; task "
            f"{self.samples} samples x {self.tokens} tokens, batch {self.batch_size}",
            f"  memory: weights {_gib(self.weight_bytes)}, forward {_gib(self.forward_bytes)}, prefix cache "
            f"{_gib(self.prefix_bytes)} ({'kept' if self.prefix_kept else 'recomputed per head group'}), replay "
            f"x{self.stack} {_gib(self.replay_bytes)}, attribution backward {_gib(self.attribution_bytes)}: peak "
            f"{_gib(self.peak_bytes)} (auto), {_gib(self.exact_peak_bytes)} (exact) of {_gib(self.memory_bytes)} usable "
            f"-> {'fits' if self.fits else 'only an exact scan fits' if self.fits_exact else 'DOES NOT FIT'}",
            f"  time ({'measured throughput' if self.measured_throughput else 'data-sheet peak x assumed utilization'}): "
            f"one forward of the task {_duration(self.seconds_forward)}; exact scan of all heads "
            f"{_duration(self.seconds_exact)} ({self.exact_forwards:,.0f} sample-forwards, replay fraction "
            f"{self.replay_fraction:.2f}, {_duration(self.seconds_per_head)} a head); attribution pass "
            f"{_duration(self.seconds_attribution)}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _gib(n: float) -> str:
    return f"{n / GiB:,.2f} GiB" if n >= GiB / 100 else f"{n / (1 << 20):,.1f} MiB"


def _duration(s: float) -> str:
    if s < 1:
        return f"{s * 1000:.0f} ms"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    if s < 3 * 86400:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


@options
class EstimateOptions(Options):
    """The scan settings :func:`estimate_scan` counts with (besides samples, tokens and the device).

    Attributes:
        dtype: weights and activations (None: the model's).
        batch_size: samples a forward (the scan's default 16).
        heads: the heads scanned (None: every head, as the scan does).
        rows_per_replay, max_prefix_bytes: the scan's defaults (64 rows a stacked replay, 2 GiB of kept
            prefixes).
        utilization: overrides the device's (GPUs: an assumed 0.35).
        reads: distinct positions a sample's logits are read at (1: single-token candidates, the default KV task;
            candidates of several tokens add one per distinct prefix): each pass unembeds ``reads`` positions a
            sample.
    """

    dtype: str | torch.dtype | None = None
    batch_size: int = 16
    heads: Sequence["HeadRef | str"] | None = None
    rows_per_replay: int = 64
    max_prefix_bytes: int = 2 << 30
    utilization: float | None = None
    reads: int = 1


# a CPU reads the unembedding at about this rate when few positions are unembedded (a pass is memory-bound): measured
# here, one row through a 128,256 x 4,096 float32 unembedding, 2 threads, 126 ms (16.6 GB/s, load average ~4)
CPU_UNEMBED_GBS = 16.0


def _check_estimate_args(samples: int, tokens: int, cfg: EstimateOptions) -> None:
    from gna_interp.constants import MAX_SAMPLES
    from gna_interp.schemas import MAX_INT, MAX_TOKENS

    for name, value, low, high in (("samples", samples, 1, MAX_SAMPLES), ("tokens", tokens, 1, MAX_TOKENS),
                                   ("batch_size", cfg.batch_size, 1, MAX_SAMPLES),
                                   ("rows_per_replay", cfg.rows_per_replay, 1, MAX_SAMPLES),
                                   ("max_prefix_bytes", cfg.max_prefix_bytes, 0, MAX_INT),
                                   ("reads", cfg.reads, 1, MAX_TOKENS)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise InputError(f"{name} must be an integer >= {low} and at most {high:,} (the bound keeps the "
                             f"estimate's arithmetic and its replay-stack search to seconds), got {value!r:.40}")
    u = cfg.utilization
    if u is not None and (isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1):
        raise InputError(f"utilization must be in (0, 1], got {u!r}")


def _heads_by_layer(model: "Model", heads: Sequence["HeadRef | str"] | None) -> tuple[dict[int, int], dict[str, int]]:
    """Heads scanned per layer and per kind (every head: counted from the layer specs, Mamba-1 models have
    ~10^5-10^6 channels)."""
    by_layer: dict[int, int] = {}
    kind_counts: dict[str, int] = {}
    if heads is None:
        for s in model.layers:
            if s.supported:
                by_layer[s.layer] = by_layer.get(s.layer, 0) + s.n_heads
                kind_counts[s.kind] = kind_counts.get(s.kind, 0) + s.n_heads
    else:
        for h in model.check_heads(list(heads)):
            by_layer[h.layer] = by_layer.get(h.layer, 0) + 1
            kind_counts[h.kind] = kind_counts.get(h.kind, 0) + 1
    if not kind_counts:
        raise InputError(f"{model.name} has no supported heads to scan (unsupported mixers: "
                         f"{[s.hf_class for s in model.unsupported()]})")
    return by_layer, kind_counts


@dataclass(frozen=True)
class _Clock:
    """Seconds of one pass on the device: blocks at ``max(FLOPs / flops_s, weights read / bandwidth)``, and the
    unembedding at the read positions likewise, its weight (``vocab x d_model``, float32) read once a pass (on a
    CPU at :data:`CPU_UNEMBED_GBS`)."""

    flops_s: float
    bandwidth: float | None
    unembed_bandwidth: float
    unembed_flops: float  # 2 x d_model x vocab: one position unembedded
    unembed_bytes: float  # the unembedding's weight, read once a pass

    def blocks(self, flops: float, weights_read: float) -> float:
        return max(flops / self.flops_s, weights_read / self.bandwidth if self.bandwidth else 0.0)

    def unembed(self, positions: float, passes: float = 1.0) -> float:
        """``positions`` unembedded in ``passes`` passes over the weight."""
        return max(positions * self.unembed_flops / self.flops_s, passes * self.unembed_bytes / self.unembed_bandwidth)


def _clock(model: "Model", dev: Device, dt: str, nbytes: int, utilization: float | None) -> _Clock:
    rate = dev.tflops.get(dt)
    if rate is None:
        raise OptionError(f"{dev.name} has no throughput figure for {dt}")
    d, v = _dims(model)
    bw = dev.bandwidth_gbs * 1e9 if dev.bandwidth_gbs else None
    return _Clock(rate * 1e12 * (dev.utilization if utilization is None else utilization), bw,
                  bw or CPU_UNEMBED_GBS * 1e9, 2.0 * d * v, float(d * v * max(nbytes, 4)))


@dataclass(frozen=True)
class _Times:
    forward: float
    exact: float
    attribution: float
    exact_flops: float
    attribution_flops: float
    n_groups: int


def _scan_times(blocks: list[_Block], clock: _Clock, by_layer: dict[int, int], rows: list[int], tokens: int,
                nbytes: int, cfg: EstimateOptions, prefix_kept: bool) -> _Times:
    """Seconds and FLOPs of the capture (one forward of the task, logits at the reads), the exact scan (groups of
    <= ``stack`` heads of one layer replay blocks L..N-1 on every chunk, each copy unembedding its reads) and one
    attribution pass (forward + backward, taken as 3 forwards, logits at the reads)."""
    per_block = [b.flops(tokens) for b in blocks]
    suffix = [sum(per_block[i:]) for i in range(len(blocks))] + [0.0]
    block_weight = [b.params * nbytes for b in blocks]
    suffix_w = [sum(block_weight[i:]) for i in range(len(blocks))] + [0.0]
    reads, samples = cfg.reads, sum(rows)
    stack = max(1, cfg.rows_per_replay // cfg.batch_size)
    forward = sum(clock.blocks(r * suffix[0], suffix_w[0]) + clock.unembed(r * reads) for r in rows)
    forward_flops = samples * (suffix[0] + reads * clock.unembed_flops)
    exact_flops, exact, n_groups = forward_flops, forward, 0
    for layer, count in by_layer.items():
        for g in range(0, count, stack):
            copies = min(stack, count - g)
            n_groups += 1
            for r in rows:
                exact_flops += copies * r * (suffix[layer] + reads * clock.unembed_flops)
                exact += clock.blocks(copies * r * suffix[layer], suffix_w[layer]) + clock.unembed(copies * r * reads)
    if not prefix_kept:  # the clean prefixes are recomputed for every group
        exact += n_groups * forward
        exact_flops += n_groups * forward_flops
    attribution = sum(clock.blocks(3 * r * suffix[0], 2 * suffix_w[0]) + 3 * clock.unembed(r * reads) for r in rows)
    return _Times(forward, exact, attribution, exact_flops, 3.0 * forward_flops, n_groups)


@dataclass(frozen=True)
class _Memory:
    forward: float
    prefix: float
    replay: float
    attribution: float
    exact_peak: float


def _scan_memory(blocks: list[_Block], d: int, v: int, b0: int, tokens: int, samples: int, nbytes: int,
                 cfg: EstimateOptions, prefix_kept: bool) -> _Memory:
    """Working sets: one forward (largest block + float32 logits at the reads), the prefix cache, one stacked
    replay, the activations one backward keeps (every block's working set)."""
    n_layers = len(blocks)
    logits_bytes = b0 * cfg.reads * v * 4  # the output end is float32 in every dtype
    forward = max(b.working_bytes(b0, tokens, d, nbytes) for b in blocks) + logits_bytes
    prefix = samples * tokens * d * n_layers * nbytes
    replay_rows = max(1, cfg.rows_per_replay // cfg.batch_size) * b0
    replay = max(b.working_bytes(replay_rows, tokens, d, nbytes) for b in blocks) + replay_rows * cfg.reads * v * 4
    attribution = sum(b.working_bytes(b0, tokens, d, nbytes) for b in blocks) + logits_bytes
    exact_peak = (prefix if prefix_kept else b0 * tokens * d * n_layers * nbytes) + replay
    return _Memory(forward, prefix, replay, attribution, exact_peak)


def _estimate_notes(model: "Model", dev: Device, dt: str, blocks: list[_Block], cfg: EstimateOptions,
                    prefix_need: int, n_groups: int) -> tuple[str, ...]:
    notes = []
    rate = dev.tflops[dt]
    if not dev.measured:
        notes.append(f"time = data-sheet peak ({rate:g} TFLOP/s {dt}) x utilization "
                     f"{dev.utilization if cfg.utilization is None else cfg.utilization:g} (assumed), or the weight "
                     f"reads at {dev.bandwidth_gbs:g} GB/s when slower")
    else:
        notes.append(f"time from a measured throughput ({rate * 1e3:.1f} GFLOP/s {dt}; {dev.source}); a machine "
                     f"shared with other work runs slower; the unembedding at the reads is read at "
                     f"{CPU_UNEMBED_GBS:g} GB/s at best")
    if any(b.ssm1 or b.ssm2 for b in blocks):
        notes.append("SSM working sets follow Hugging Face's torch path (no mamba-ssm kernels); with the CUDA kernels "
                     "they are smaller")
    if model.unsupported():
        notes.append(f"{len(model.unsupported())} mixer(s) have no heads in gna_interp yet (not scanned; their FLOPs "
                     f"are counted)")
    if prefix_need > cfg.max_prefix_bytes:
        notes.append(f"clean prefixes ({_gib(prefix_need)} at 4 bytes a value) exceed max_prefix_bytes "
                     f"{_gib(cfg.max_prefix_bytes)}: recomputed for each of {n_groups:,} head groups")
    return tuple(notes)


def estimate_scan(model: "Model", samples: int = 32, tokens: int = 64, *, device: str | Device = "H100-80GB",
                  config: EstimateOptions | None = None, **overrides: Any) -> ScanEstimate:
    """Estimate the memory and time of ``gna scan`` of ``model`` (meta or real) on ``device``.

    ``samples`` prompts of ``tokens`` tokens each (prompt + answer); ``config`` (:class:`EstimateOptions`)
    and keyword ``overrides`` of its fields: ``dtype``, ``batch_size``, ``heads``, ``rows_per_replay``,
    ``max_prefix_bytes``, ``utilization``, ``reads``.
    What is counted and what is assumed: see :mod:`gna_interp.models.estimate`.
    """
    from gna_interp.models.model import check_model
    check_model(model, runnable=False)
    cfg = EstimateOptions.build(config, **overrides)
    _check_estimate_args(samples, tokens, cfg)
    dev = get_device(device)
    dt = _dtype_name(model.dtype if cfg.dtype is None else cfg.dtype)
    nbytes = torch.empty(0, dtype=getattr(torch, dt)).element_size()
    by_layer, kind_counts = _heads_by_layer(model, cfg.heads)
    n_heads = sum(kind_counts.values())
    if model.n_ctx and tokens > model.n_ctx:
        raise InputError(f"tokens={tokens} exceeds the context of {model.name} ({model.n_ctx})")
    blocks = _blocks(model)
    d, v = _dims(model)
    params, weight_bytes = _param_bytes(model, nbytes)
    clock = _clock(model, dev, dt, nbytes, cfg.utilization)
    rows = [min(cfg.batch_size, samples - k * cfg.batch_size) for k in range(math.ceil(samples / cfg.batch_size))]
    prefix_need = samples * tokens * d * len(blocks) * 4  # the scan's own count
    prefix_kept = prefix_need <= cfg.max_prefix_bytes
    t = _scan_times(blocks, clock, by_layer, rows, tokens, nbytes, cfg, prefix_kept)
    mem = _scan_memory(blocks, d, v, max(rows), tokens, samples, nbytes, cfg, prefix_kept)
    peak = weight_bytes + max(mem.exact_peak, mem.attribution, mem.forward)
    peak_exact = weight_bytes + max(mem.exact_peak, mem.forward)
    usable = int(dev.memory_gib * GiB * USABLE_MEMORY)
    total_blocks = sum(b.flops(tokens) for b in blocks)
    suffix = {layer: sum(b.flops(tokens) for b in blocks[layer:]) for layer in by_layer}
    replay_fraction = sum(n * suffix[layer] for layer, n in by_layer.items()) / (n_heads * total_blocks)
    return ScanEstimate(
        model=model.name, device=dev.name, dtype=dt, params=int(params), heads=kind_counts,
        samples=samples, tokens=tokens, batch_size=cfg.batch_size, stack=max(1, cfg.rows_per_replay // cfg.batch_size),
        weight_bytes=int(weight_bytes), forward_bytes=int(mem.forward), prefix_bytes=int(mem.prefix),
        prefix_kept=prefix_kept, replay_bytes=int(mem.replay), attribution_bytes=int(mem.attribution),
        peak_bytes=int(peak), exact_peak_bytes=int(peak_exact), memory_bytes=usable, fits=peak <= usable,
        fits_exact=peak_exact <= usable, flops_per_token=(total_blocks + 2.0 * d * v * tokens) / tokens,
        replay_fraction=replay_fraction, exact_forwards=n_heads * samples * replay_fraction,
        exact_flops=t.exact_flops, attribution_flops=t.attribution_flops, seconds_forward=t.forward,
        seconds_exact=t.exact, seconds_per_head=(t.exact - t.forward) / n_heads, seconds_attribution=t.attribution,
        measured_throughput=dev.measured, reads=cfg.reads,
        notes=_estimate_notes(model, dev, dt, blocks, cfg, prefix_need, t.n_groups))


# ---- calibration ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Throughput:
    """A measured forward throughput: ``flops`` counted by :func:`forward_flops`, ``seconds`` the median of
    ``repeats`` timed forwards (after one warm-up), ``flops_per_second = flops / seconds``."""

    model: str
    dtype: str
    threads: int
    batch: int
    tokens: int
    repeats: int
    flops: float
    seconds: float
    times: tuple[float, ...]

    @property
    def flops_per_second(self) -> float:
        return self.flops / self.seconds


@torch.no_grad()
def measure_throughput(model: "Model", batch: int = 4, tokens: int = 128, repeats: int = 5,
                       seed: int = 0) -> Throughput:
    """Time ``repeats`` forwards of ``batch`` random sequences of ``tokens`` tokens through ``model``
    (after a warm-up) and count their FLOPs: the effective FLOP/s a forward reaches on this machine.
    It gave the bfloat16/float16 ratios of the ``cpu-2core`` row of :data:`DEVICES`."""
    model.check_runnable()
    if repeats < 1 or batch < 1 or tokens < 1:
        raise InputError(f"batch, tokens and repeats must be >= 1, got {batch}, {tokens}, {repeats}")
    _, vocab = _dims(model)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, tokens), generator=g)
    model.forward(ids)
    times = []
    for _ in range(repeats):
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        t = time.perf_counter()
        model.forward(ids)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
        times.append(time.perf_counter() - t)
    med = sorted(times)[len(times) // 2]
    return Throughput(model.name, _dtype_name(model.dtype), torch.get_num_threads(), batch, tokens, repeats,
                      batch * forward_flops(model, tokens), med, tuple(times))
