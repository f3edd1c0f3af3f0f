"""The implicit-attention kernel of state-space mixers: Mamba-2 (SSD) heads and Mamba-1 (S6) channels.

A selective SSM layer is a causal linear map from its (post-conv) input ``x`` to its scan output
``y``; the matrix of that map is the layer's *implicit attention*. With
``Δ = softplus(dt + dt_bias)`` (clamped to the mixer's ``time_step_limit``) and
``cs_t = Σ_{k≤t} Δ_k``:

- Mamba-2 head ``h`` (scalar ``A_h``, ``B``/``C`` of the head's group ``g = h // (H / G)``)::

      M_h[t, s] = (C_t · B_s) · exp(A_h (cs_t − cs_s)) · Δ_s          for s ≤ t
      y_t[h] = Σ_s M_h[t, s] x_s[h] + D_h x_t[h]        (x_s[h] ∈ R^head_dim, shared M)

- Mamba-1 channel ``d`` (``A_d ∈ R^N``, ``B``/``C`` shared by all channels)::

      M_d[t, s] = Σ_n C_t[n] · exp(A[d, n] (cs_t[d] − cs_s[d])) · B_s[n] · Δ_s[d]
      y_t[d] = Σ_s M_d[t, s] x̂_s[d] + D_d x̂_t[d]        (x̂ = post-conv activation)

**Forms.** ``form="exact"`` (the default) is ``M`` above, *with* the ``Δ_s`` factor: ``M x + D x``
reproduces the scan, and the gate / gated norm / ``out_proj`` of the layer turn it into the
mixer's output (the tests prove this to 1e-4 against the bridge). ``form="attention"`` drops the
``Δ_s`` column factor -- ``(C_t·B_s)·exp(A Σ_{k=s+1..t} Δ_k)`` -- which is TransformerLens's
``compute_effective_attention(include_dt_scaling=False)`` default and the form of "The Hidden
Attention of Mamba"; it does not reproduce the output on its own.

**Mamba-1 groups.** A :class:`~gna_interp.models.heads.HeadRef` ``L3C128+16`` covers channels
128..143; its pattern is the **mean of the member channels' matrices** (``group_reduce="mean"``),
or the mean of their absolute values (``group_reduce="abs_mean"``), accumulated chunk by chunk so
that the per-channel matrices are never stored together.

**Padding.** The mixer zeroes the hidden states and the post-conv activations at padding
positions (HF ``apply_mask_to_padding_states``); :func:`ssm_terms` does the same, so rows and
columns of padding positions are zero and a left-padded batch reconstructs exactly.

**Memory.** Only the requested heads/channels are computed, ``query_block`` rows at a time
(default 64 for Mamba-2, 32 for Mamba-1), for as many units at once as keep one block's
intermediates near ``block_elems`` float32 values (default 2^22 = 16 MiB). Within a block
``[q0, q1)`` the decay is split at ``r = q0 - 1``: for keys ``s ≤ r < t``
``exp(A(cs_t − cs_s)) = exp(A(cs_t − cs_r)) · exp(A(cs_r − cs_s))`` (both factors ≤ 1, so no
overflow), which makes the off-diagonal part one batched matmul of rank ``N``; the small diagonal
block is computed directly. Causal keys ``s ≥ q1`` are never computed. Cumulative sums of ``Δ``
are taken in float64.

Peak memory = the returned ``[batch, n, T, T]`` float32 tensor (``4·batch·n·T²`` bytes: 16 MiB per
pattern at T = 2048) + the layer's terms (``O(batch·T·d_inner)``, what the forward pass itself
holds) + a working set of about ``max(block_elems, 4·T·(N + Q))`` float32 values (a unit chunk is
sized from an upper estimate of its live intermediates; one unit is the least). ``benchmarks/implicit_attention.py`` measures it: at T = 2048 one
Mamba-2 head of a mamba2-130m-sized layer peaks at ~22 MiB (16 MiB of it the output) where the
straightforward all-heads materialisation peaks at ~1.5 GiB; all 24 heads at ~430 MiB (384 MiB
output); Mamba-1 with 8 channels + one 64-channel group at ~200 MiB (144 MiB output).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Literal, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.models.hf import unwrap
from gna_interp.models.mixer import DEFAULT_BLOCK_ELEMS, FORMS

Form = Literal["exact", "attention"]
GroupReduce = Literal["mean", "abs_mean"]
DEFAULT_QUERY_BLOCK: int | None = None  # auto: 64 rows for Mamba-2 heads, 32 for Mamba-1 channels

__all__ = ["DEFAULT_BLOCK_ELEMS", "DEFAULT_QUERY_BLOCK", "FORMS", "SSMTerms", "implicit_attention", "is_ssm1",
           "is_ssm2", "mix", "mixer_output", "ssm_terms"]


@dataclass(frozen=True)
class SSMTerms:
    """The inputs of one SSM layer's scan, reconstructed from its mixer input (float32).

    A *unit* is a Mamba-2 head (``head_dim`` channels sharing one decay) or a Mamba-1 channel
    (``head_dim == 1``). Unit ``u`` reads ``B``/``C`` group ``u // units_per_group`` (Mamba-1: one
    group shared by every channel).

    Attributes:
        kind: ``"ssm2"`` or ``"ssm1"``.
        x: scan input per unit, post-conv activation, zero at padding.
        dt: ``Δ`` per unit, after softplus(+bias) and clamping.
        A: decay rates, ``[units, 1]`` (Mamba-2 scalar per head) or ``[units, N]`` (Mamba-1).
        B, C: input/output projections per group.
        D: skip weight per unit.
        gate: the gate branch ``z`` of ``in_proj`` (flat, ``units * head_dim`` wide).
        attention_mask: the padding mask that was applied (None: no padding).
    """

    kind: Literal["ssm2", "ssm1"]
    x: Float[Tensor, "batch pos units head_dim"]
    dt: Float[Tensor, "batch pos units"]
    A: Float[Tensor, "units a_state"]
    B: Float[Tensor, "batch pos groups state"]
    C: Float[Tensor, "batch pos groups state"]
    D: Float[Tensor, " units"]
    gate: Float[Tensor, "batch pos inner"]
    attention_mask: Int[Tensor, "batch pos"] | None = None

    @property
    def n_units(self) -> int:
        return int(self.x.shape[2])

    @property
    def units_per_group(self) -> int:
        return self.n_units // int(self.B.shape[2])

    @property
    def shape(self) -> tuple[int, int]:
        """``(batch, pos)``."""
        return int(self.x.shape[0]), int(self.x.shape[1])


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise InputError(f"form={form!r} is not a pattern form; use 'exact' (with Δ_s, reproduces the scan) "
                         f"or 'attention' (without Δ_s, TransformerLens's default)")


def _mask_pad(h: Tensor, attention_mask: Tensor | None) -> Tensor:
    return h if attention_mask is None else h * attention_mask[:, :, None].to(device=h.device, dtype=h.dtype)


def _depthwise_conv(conv: torch.nn.Module, u: Tensor, act: Any) -> Tensor:
    """HF ``causal_conv1d_fn``: depthwise causal conv over positions, then the activation. ``u``: [b, pos, ch]."""
    conv = unwrap(conv)
    seq = u.shape[1]
    w = conv.weight
    out = F.conv1d(u.transpose(1, 2).to(w.dtype), w, conv.bias, padding=w.shape[-1] - 1,
                   groups=w.shape[0])[..., :seq]
    return act(out).transpose(1, 2)


def is_ssm2(oc: Any) -> bool:
    """Whether an HF module is a Mamba-2 (SSD) mixer: a per-head ``A_log`` vector and ``dt_bias``, with the SSD
    layout attributes (``num_heads``, ``head_dim``, ``n_groups``, ``ssm_state_size``). Gated delta nets (Qwen3-Next,
    OLMo-hybrid) also carry ``A_log`` and ``dt_bias`` but not that layout: they are another kind."""
    a_log = getattr(oc, "A_log", None)
    return (isinstance(a_log, Tensor) and a_log.dim() == 1 and hasattr(oc, "dt_bias")
            and all(hasattr(oc, a) for a in ("num_heads", "head_dim", "n_groups", "ssm_state_size")))


def is_ssm1(oc: Any) -> bool:
    """Whether an HF module is a Mamba-1 (S6) mixer: an ``A_log`` matrix, ``x_proj`` and ``dt_proj``."""
    a_log = getattr(oc, "A_log", None)
    return isinstance(a_log, Tensor) and a_log.dim() == 2 and hasattr(oc, "x_proj") and hasattr(oc, "dt_proj")


@torch.no_grad()
def ssm_terms(mixer: torch.nn.Module, hidden_states: Float[Tensor, "batch pos d_model"],
              attention_mask: Int[Tensor, "batch pos"] | None = None) -> SSMTerms:
    """Recompute x, Δ, A, B, C, D and the gate of one Mamba-1 / Mamba-2 mixer from its input.

    ``mixer`` is the Hugging Face mixer (a bridge component is unwrapped); ``hidden_states`` is
    what the mixer received (``blocks.{l}.mixer.hook_in``); ``attention_mask`` the 2D padding mask
    the model was run with (None when unpadded). Only the raw HF submodules are called, so no
    TransformerLens hook fires.
    """
    oc = unwrap(mixer)
    if is_ssm2(oc):
        return _ssd_terms(oc, hidden_states, attention_mask)
    if is_ssm1(oc):
        return _s6_terms(oc, hidden_states, attention_mask)
    raise UnsupportedArchitectureError(
        f"{type(oc).__name__} is neither a Mamba-2 (per-head A_log + dt_bias) nor a Mamba-1 "
        f"(A_log matrix + x_proj + dt_proj) mixer, so it has no implicit attention here")


def _ssd_terms(oc: Any, hidden_states: Tensor, attention_mask: Tensor | None) -> SSMTerms:
    b, seq, _ = hidden_states.shape
    H, P, G, N = int(oc.num_heads), int(oc.head_dim), int(oc.n_groups), int(oc.ssm_state_size)
    inner = int(oc.intermediate_size)
    conv_dim = inner + 2 * G * N
    h = _mask_pad(hidden_states, attention_mask)
    if hasattr(oc, "ssm_in_multiplier"):  # Falcon-H1 muP multipliers
        h = h * oc.ssm_in_multiplier
    proj = unwrap(oc.in_proj)(h)
    if hasattr(oc, "mup_vector"):
        proj = proj * oc.mup_vector
    d_mlp = (proj.shape[-1] - inner - conv_dim - H) // 2
    if d_mlp < 0 or proj.shape[-1] != 2 * d_mlp + inner + conv_dim + H:
        raise UnsupportedArchitectureError(
            f"{type(oc).__name__}.in_proj gives {proj.shape[-1]} features, which does not split into "
            f"gate ({inner}) + x/B/C ({conv_dim}) + dt ({H}) [+ 2 MLP halves]")
    _, _, gate, xbc, dt_raw = proj.split([d_mlp, d_mlp, inner, conv_dim, H], dim=-1)
    xbc = _mask_pad(_depthwise_conv(oc.conv1d, xbc, unwrap(oc.act)), attention_mask).float()
    x, B, C = xbc.split([inner, G * N, G * N], dim=-1)
    dt = F.softplus(dt_raw.float() + oc.dt_bias.detach().float())
    lo, hi = getattr(oc, "time_step_limit", (0.0, float("inf")))
    dt = dt.clamp(float(lo), float(hi))
    A = -torch.exp(oc.A_log.detach().float())
    return SSMTerms("ssm2", x.reshape(b, seq, H, P), dt, A[:, None], B.reshape(b, seq, G, N),
                    C.reshape(b, seq, G, N), oc.D.detach().float(), gate.float(), attention_mask)


def _s6_terms(oc: Any, hidden_states: Tensor, attention_mask: Tensor | None) -> SSMTerms:
    b, seq, _ = hidden_states.shape
    N, R = int(oc.ssm_state_size), int(oc.time_step_rank)
    proj = unwrap(oc.in_proj)(_mask_pad(hidden_states, attention_mask))
    xr, gate = proj.chunk(2, dim=-1)
    x = _mask_pad(_depthwise_conv(oc.conv1d, xr, unwrap(oc.act)), attention_mask)
    dt_low, B, C = unwrap(oc.x_proj)(x).split([R, N, N], dim=-1)
    # Jamba / Falcon-Mamba: RMS norms on dt, B, C after x_proj.
    def norm(name: str, t: Tensor) -> Tensor:
        module = getattr(oc, name, None)
        return unwrap(module)(t) if module is not None else t

    dt_low, B, C = norm("dt_layernorm", dt_low), norm("b_layernorm", B), norm("c_layernorm", C)
    dt_proj = unwrap(oc.dt_proj)
    dt = dt_low.float() @ dt_proj.weight.float().T
    if dt_proj.bias is not None:
        dt = dt + dt_proj.bias.float()
    dt = F.softplus(dt)
    A = -torch.exp(oc.A_log.detach().float())
    return SSMTerms("ssm1", x.float()[..., None], dt, A, B.float()[:, :, None], C.float()[:, :, None],
                    oc.D.detach().float(), gate.float(), attention_mask)


@torch.no_grad()
def mixer_output(mixer: torch.nn.Module, terms: SSMTerms,
                 y: Float[Tensor, "batch pos units head_dim"]) -> Float[Tensor, "batch pos d_model"]:
    """Push a full scan output ``y`` (``M x + D x`` for every unit) through the layer's own gate,
    gated RMS norm (Mamba-2) and ``out_proj``: the mixer's output."""
    oc = unwrap(mixer)
    b, seq = terms.shape
    flat = y.reshape(b, seq, -1)
    if terms.kind == "ssm1":
        out = flat * F.silu(terms.gate)
    elif getattr(oc, "mamba_rms_norm", True) is False:  # Falcon-H1 without the gated norm
        out = flat * F.silu(terms.gate)
    else:
        out = unwrap(oc.norm)(flat, terms.gate)
    out_proj = unwrap(oc.out_proj)
    return out_proj(out.to(out_proj.weight.dtype))


# ---- the blocked kernel -----------------------------------------------------------------------


def _unit_blocks(terms: SSMTerms, units: Sequence[int], form: str, block_elems: int,
                 query_block: int | None) -> Iterator[tuple[int, int, int, int, Tensor]]:
    """Yield ``(u0, u1, q0, q1, M)``: ``M[b, u0:u1 (of units), q0:q1, 0:q1]`` in ``form``.

    Keys ``s >= q1`` are zero (causal) and not produced.
    """
    b, T = terms.shape
    N = int(terms.B.shape[-1])
    idx = torch.as_tensor(list(units), dtype=torch.long, device=terms.x.device)
    scalar_a = terms.A.shape[-1] == 1
    Q = max(1, min(int(query_block or (64 if scalar_a else 32)), T))
    # Upper estimate of what one unit keeps alive at once (float32 elements): cs (float64), B/C
    # gathered per head (Mamba-2), the key factors and B ⊙ them, the query factors, the off-diagonal
    # block, the assembled block and two same-sized temporaries of the callers, the diagonal block.
    gathered = terms.B.shape[2] > 1
    per_unit = b * (2 * T + (2 * T * N if gathered else 0) + 2 * T * N + 2 * T + 2 * Q * N + 4 * Q * T
                    + Q * Q * ((1 if scalar_a else N) + 4))
    chunk = max(1, min(len(units), block_elems // max(per_unit, 1)))
    for c0 in range(0, len(units), chunk):
        cidx = idx[c0:c0 + chunk]
        A = terms.A[cidx]  # [u, Na]
        dt = terms.dt[:, :, cidx].permute(0, 2, 1)  # [b, u, T]
        cs = torch.cumsum(dt.double(), dim=-1)  # [b, u, T]
        g = torch.div(cidx, terms.units_per_group, rounding_mode="floor")
        if terms.B.shape[2] == 1:
            Bu, Cu = terms.B.permute(0, 2, 1, 3), terms.C.permute(0, 2, 1, 3)  # [b, 1, T, N]
        else:
            Bu, Cu = terms.B[:, :, g].permute(0, 2, 1, 3), terms.C[:, :, g].permute(0, 2, 1, 3)  # [b, u, T, N]
        a = A[None, :, None, :]  # [1, u, 1, Na]
        for q0 in range(0, T, Q):
            q1 = min(T, q0 + Q)
            csq = cs[:, :, q0:q1]
            # Diagonal block: direct, s <= t within [q0, q1).
            seg = (csq[:, :, :, None] - csq[:, :, None, :])  # [b, u, Q, Q] = cs_t - cs_s
            causal = torch.ones(q1 - q0, q1 - q0, dtype=torch.bool, device=seg.device).tril()
            seg = seg.masked_fill(~causal, float("inf")).float()
            Cq, Bq = Cu[:, :, q0:q1], Bu[:, :, q0:q1]
            if scalar_a:
                diag = torch.exp(A[None, :, :, None] * seg) * (Cq @ Bq.transpose(-1, -2))
            else:
                e = torch.exp(seg[..., None] * a[:, :, :, None, :])  # [b, u, Q, Q, N]
                e.mul_(Cq[:, :, :, None, :]).mul_(Bq[:, :, None, :, :])
                diag = e.sum(-1)
                del e
            if q0 > 0:
                r = cs[:, :, q0 - 1:q0]  # decay split at cs_{q0-1}: keys s < q0 satisfy s <= q0-1
                up = torch.exp(a * (csq - r).float()[..., None])  # [b, u, Q, Na], exponent <= 0
                vp = torch.exp(a * (r - cs[:, :, :q0]).float()[..., None])  # [b, u, q0, Na], exponent <= 0
                off = (Cq * up) @ (Bu[:, :, :q0] * vp).transpose(-1, -2)  # [b, u, Q, q0]
                block = torch.cat([off, diag], dim=-1)
                del up, vp, off
            else:
                block = diag
            if form == "exact":
                block.mul_(dt[:, :, None, :q1])
            yield c0, c0 + len(cidx), q0, q1, block


@torch.no_grad()
def implicit_attention(terms: SSMTerms, units: Sequence[int | Sequence[int]], form: Form = "exact",
                       group_reduce: GroupReduce = "mean", block_elems: int = DEFAULT_BLOCK_ELEMS,
                       query_block: int | None = DEFAULT_QUERY_BLOCK) -> Float[Tensor, "batch n q k"]:
    """Implicit attention ``[batch, n, q, k]`` of the requested units of one layer.

    ``units[i]`` is a unit index (Mamba-2 head, Mamba-1 channel) or a sequence of them (a Mamba-1
    channel group, reduced by ``group_reduce``: ``"mean"`` of the member matrices or ``"abs_mean"``
    of their absolute values). ``form="exact"`` includes the ``Δ_s`` factor (``y = M x + D x``);
    ``form="attention"`` omits it. Only these units are computed, ``query_block`` rows at a time.
    """
    _check_form(form)
    if group_reduce not in ("mean", "abs_mean"):
        raise InputError(f"group_reduce={group_reduce!r}; use 'mean' or 'abs_mean'")
    flat: list[int] = []
    owner: list[int] = []
    weight: list[float] = []
    for i, u in enumerate(units):
        members = [int(u)] if isinstance(u, int) else [int(c) for c in u]
        if not members:
            raise InputError(f"unit {i} is an empty channel group")
        bad = [c for c in members if not 0 <= c < terms.n_units]
        if bad:
            raise InputError(f"unit indices {bad} are out of range: this layer has {terms.n_units} units")
        flat.extend(members)
        owner.extend([i] * len(members))
        weight.extend([1.0 / len(members)] * len(members))
    b, T = terms.shape
    out = torch.zeros(b, len(units), T, T, dtype=torch.float32, device=terms.x.device)
    owner_t = torch.as_tensor(owner, dtype=torch.long, device=out.device)
    weight_t = torch.as_tensor(weight, dtype=torch.float32, device=out.device)
    in_group = torch.as_tensor([w < 1.0 for w in weight], dtype=torch.bool, device=out.device)
    simple = len(flat) == len(units)
    for u0, u1, q0, q1, block in _unit_blocks(terms, flat, form, block_elems, query_block):
        if simple:
            out[:, u0:u1, q0:q1, :q1] = block
            continue
        if group_reduce == "abs_mean":
            block = torch.where(in_group[u0:u1, None, None], block.abs(), block)
        block.mul_(weight_t[u0:u1, None, None])
        out[:, :, q0:q1, :q1].index_add_(1, owner_t[u0:u1], block)
    return out


@torch.no_grad()
def mix(terms: SSMTerms, units: Sequence[int],
        masks: Sequence[Float[Tensor, "*batch q k"] | None] | None = None,
        block_elems: int = DEFAULT_BLOCK_ELEMS,
        query_block: int | None = DEFAULT_QUERY_BLOCK) -> Float[Tensor, "batch pos n head_dim"]:
    """Scan output of ``units``: ``y = (M ⊙ mask) x + D x`` with the exact ``M``, in query blocks.

    ``masks[i]`` (broadcastable to ``[batch, T, T]``; None = no mask) multiplies unit ``i``'s
    implicit attention. Without masks this reproduces the layer's scan for those units.
    """
    b, T = terms.shape
    if masks is not None and len(masks) != len(units):
        raise InputError(f"got {len(masks)} masks for {len(units)} units")
    prepared: list[Tensor | None] = []
    for i, m in enumerate(masks if masks is not None else [None] * len(units)):
        if m is None:
            prepared.append(None)
            continue
        m = torch.as_tensor(m, device=terms.x.device, dtype=torch.float32)
        if m.dim() < 2 or tuple(m.shape[-2:]) != (T, T) or (m.dim() == 3 and m.shape[0] not in (1, b)) or m.dim() > 3:
            raise InputError(f"mask {i} has shape {tuple(m.shape)}; expected [{T}, {T}] or [{b}, {T}, {T}] "
                             f"for this batch of {b} sequences of {T} positions")
        prepared.append(m if m.dim() == 3 else m[None])
    idx = torch.as_tensor(list(units), dtype=torch.long, device=terms.x.device)
    x = terms.x[:, :, idx]  # [b, T, n, P]
    y = x * terms.D[idx][None, None, :, None]
    for u0, u1, q0, q1, block in _unit_blocks(terms, units, "exact", block_elems, query_block):
        for j in range(u0, u1):
            m = prepared[j]
            if m is not None:
                block[:, j - u0].mul_(m[:, q0:q1, :q1])
        y[:, q0:q1, u0:u1] += torch.einsum("buqk,bkup->bqup", block, x[:, :q1, u0:u1])
    return y
