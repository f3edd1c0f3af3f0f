"""Attribution patching: a first-order estimate of every head's ablation effect from one forward and
one backward per batch.

For a head with output slice ``a`` (the input of its output projection) and replacement ``a'``
(zero, mean or resampled), the change of the metric is estimated as ``Σ (a' − a) · ∂metric/∂a`` over
the head's channels and all positions. The metric is the task's mean logit difference (gold score
minus the best other candidate's score, each a sum of log-probs); the best other candidate is
frozen at its clean value, so the gradient is that of a smooth function. The estimate is exact for a
model that is linear in the head's output; it breaks where ablating a head moves later layers far
from the clean run (large, saturating effects). The same pass therefore also measures each
ablation's **size**: the norm of the change it writes into the residual stream, ``(a' − a) W_O``,
relative to the norm of the residual stream entering the head's block (mean over real tokens). An
``auto`` scan uses the sizes to bound how far an estimate can be off (:mod:`gna_interp.circuits.scan`).

The estimate is a sum of one term per token. Terms of opposite signs cancel: zero-ablating a head that
writes the value digit into every dictionary line's summary token hurts the gold line's candidate and,
to first order, "helps" by hurting the distractors, so the sum can be near zero for a head whose removal
brings retrieval to chance (SmolLM2's L16H0 on KV retrieval: estimated -0.06, exact drop 1.61). The
same pass therefore returns each head's **mass**, the terms summed in absolute value: what the estimate
would be with no cancellation between positions (AtP*, Kramár et al. 2024, names cancellation as one of
attribution patching's two failure modes; its fix, GradDrop, cancels across paths and costs one backward
a layer; the mass is free).
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.engine.unembed import at_reads, head_logprobs_grad, output_head
from gna_interp.engine.replay import Prefixes, recording
from gna_interp.interventions.ablation import Replacement, flat_channels
from gna_interp.models.model import Model
from gna_interp.engine.metrics import LOGIT_DIFF
from gna_interp.engine.forward import ScoreTable
from gna_interp.engine.layout import Chunk, whole_samples
from gna_interp.engine.plan import CandidateScores, ScoringPlan
from gna_interp.engine.unembed import read_logprobs

__all__ = ["Attribution", "attribution_estimates", "inputs_only_grad"]


class Attribution(NamedTuple):
    """What :func:`attribution_estimates` returns, one entry per replaced head."""

    delta: Float[Tensor, " heads"]  # estimated change of the mean logit difference
    size: Float[Tensor, " heads"]  # relative size of the ablation's write into the residual stream
    clean: CandidateScores  # clean candidate scores, read from the same forwards
    mass: Float[Tensor, " heads"]  # Σ over tokens of |that token's term of delta|: delta before cancellation


@contextmanager
def _inputs_only_grad(model: Model) -> Iterator[None]:
    """Turn off parameter gradients (restored on exit): only activation gradients are wanted."""
    params = list(model.hf_model.parameters())
    flags = [p.requires_grad for p in params]
    try:
        for p in params:
            p.requires_grad_(False)
        yield
    finally:
        for p, f in zip(params, flags):
            p.requires_grad_(f)


inputs_only_grad = _inputs_only_grad  # public: other gradient passes (the edge screen) need the same


class _Recorder:
    """The hooks of one attribution forward and what they keep: the residual stream entering each scanned
    layer (block 0's input made a leaf that needs gradients) and the heads' output-projection inputs."""

    def __init__(self, model: Model, hooks_at: Sequence[str], layers: Sequence[int]) -> None:
        self.model, self.hooks_at, self.layers = model, list(hooks_at), list(layers)
        self.acts: dict[str, Tensor] = {}
        self.resid: dict[int, Tensor] = {}

    def hooks(self) -> list[tuple[str, Callable[..., Tensor]]]:
        def start(x: Tensor, hook: Any = None) -> Tensor:
            self.resid[0] = x.detach()
            return x.detach().requires_grad_(True)

        def keep_resid(layer: int) -> Callable[..., Tensor]:
            def hook(x: Tensor, hook: Any = None) -> Tensor:
                self.resid[layer] = x.detach()
                return x

            return hook

        def keep(x: Tensor, hook: Any) -> Tensor:
            self.acts[hook.name] = x
            return x

        m = self.model
        return ([(m.block_input_hook(0), start)] + [(m.block_input_hook(i), keep_resid(i)) for i in self.layers if i > 0]
                + [(h, keep) for h in self.hooks_at])

    def check(self) -> None:
        missing = [h for h in self.hooks_at if h not in self.acts]
        if missing:
            raise RuntimeError(f"attribution: hooks {missing} did not fire on {self.model.name}")


WRITE_BLOCK = 1 << 24  # values of the heads' ablated channels taken at once (tokens x heads x width), :func:`_head_terms`


@torch.no_grad()
def _head_terms(rs: Sequence[Replacement], rec: _Recorder, grad: Tensor | None, proj: Tensor, mask: Tensor
                ) -> tuple[Tensor, Tensor, Tensor]:
    """Per head of ``rs`` (heads of one hook and one width): its first-order estimate ``Σ (a' − a) · ∂metric/∂a``,
    its summed relative residual write and its absolute mass (the estimate's per-token terms summed in absolute
    value); all heads at once, a block of heads at a time. A write's size is read off its channels and the head's
    Gram matrix ``WᵀW`` (``W`` its columns of the output projection), in float64."""
    site, n = rs[0].site, len(rs)
    w = site.stop - site.start
    cols = (torch.tensor([r.site.start for r in rs])[:, None] + torch.arange(w)).flatten()
    acts = rec.acts[site.hook].detach()
    a = flat_channels(acts, site)[..., cols.to(acts.device)]
    if all(r.rows is None for r in rs):  # zero or a mean: one value per channel
        repl: Tensor = torch.cat([torch.zeros(w) if r.mean is None else r.mean.reshape(-1).cpu() for r in rs])
    else:
        repl = torch.cat([torch.as_tensor(r.like(a[..., :w])).expand(*a.shape[:2], w) for r in rs], -1)
    diff = (repl.to(a.device, a.dtype) - a)[mask].view(-1, n, w)
    resid = rec.resid[site.head.layer][mask].norm(dim=-1).clamp_min(1e-12)
    out = proj[:, cols.to(proj.device)].double().view(-1, n, w)
    gram = torch.einsum("dhi,dhj->hij", out, out)  # |write|² = diff (WᵀW) diffᵀ, a head's Gram matrix
    size = torch.zeros(n, dtype=torch.float64)
    step = max(1, WRITE_BLOCK // max(1, diff.shape[0] * w))
    for k in range(0, n, step):
        d = diff[:, k:k + step].double()
        sq = torch.einsum("thi,hij,thj->th", d, gram[k:k + step], d).clamp_min(0)
        size[k:k + step] = (sq.sqrt() / resid[:, None].double()).sum(0).cpu()
    if grad is None:
        return torch.zeros(n, dtype=torch.float64), size, torch.zeros(n, dtype=torch.float64)
    g = flat_channels(grad, site)[..., cols.to(grad.device)][mask].view(-1, n, w)
    terms = (diff * g).sum(-1).double()
    return terms.sum(0).cpu(), size, terms.abs().sum(0).cpu()


def _read(model: Model, chunk: Chunk, hooks: list[tuple[str, Callable[..., Tensor]]]) -> Tensor:
    """The differentiable log-probabilities of ``chunk``'s reads from one forward with ``hooks``. The forward stops at
    the final norm and the head runs block by block, its backward too
    (:func:`~gna_interp.engine.unembed.head_logprobs_grad`); a model without a hook there reads the bridge's own logits
    and differentiates them in full."""
    rows, pos, inverse = chunk.reads
    hidden = model.final_residual(chunk.batch, hooks, grad=True)
    if hidden is not None:
        return head_logprobs_grad(output_head(model), at_reads(hidden, rows, pos), chunk.read_tok, inverse)
    return read_logprobs(model.read_logits(chunk.batch, rows, pos, hooks, grad=True), chunk.read_tok, inverse)


def attribution_estimates(model: Model, plan: ScoringPlan, chunks: Sequence[Chunk] | Prefixes,
                          replaced: Sequence[Replacement], weights: Float[Tensor, " n_targets"] | None = None,
                          progress: Callable[[int], None] | None = None) -> Attribution:
    """Estimated change of the mean logit difference when each of ``replaced``'s heads is ablated, the
    relative size of each ablation (see the module docstring), and the clean candidate scores read from
    the same forwards.

    One forward (with gradients) and one backward per chunk, for all heads at once. ``weights`` are
    :meth:`Metric.target_weights <gna_interp.engine.metrics.Metric.target_weights>` of a clean run; ``None`` derives them from each chunk's own clean scores,
    which needs every sample's rows to sit in one chunk (true when each sample has one row, or is packed).
    ``chunks`` may be the plan's :class:`~gna_interp.engine.replay.Prefixes`: each forward (a clean pass) then records
    its chunk's prefix there, so later replays do not pay a clean forward of their own.
    """
    keep = chunks if isinstance(chunks, Prefixes) else None
    chunks = keep.chunks if keep is not None else chunks
    if weights is None and not whole_samples(chunks):
        raise ValueError("attribution without precomputed weights needs every sample's rows in one chunk")
    hooks_at = sorted({r.site.hook for r in replaced})
    layers = sorted({r.site.head.layer for r in replaced})
    proj = {}
    for r in replaced:
        proj.setdefault(r.site.hook, model.output_projection(r.site.head))
    groups: dict[tuple[str, int], list[int]] = {}  # the heads of one hook and width, scored together
    for k, r in enumerate(replaced):
        groups.setdefault((r.site.hook, r.site.stop - r.site.start), []).append(k)
    est = torch.zeros(len(replaced), dtype=torch.float64)
    size = torch.zeros(len(replaced), dtype=torch.float64)
    mass = torch.zeros(len(replaced), dtype=torch.float64)
    n_tokens = 0
    clean = ScoreTable(plan)
    for i, chunk in enumerate(chunks):
        rec = _Recorder(model, hooks_at, layers)
        with _inputs_only_grad(model), torch.enable_grad():
            record = keep is not None and not keep.has(i)
            with recording(model, chunk.size) if record else nullcontext([]) as got:
                logp = _read(model, chunk, rec.hooks())
            rec.check()
            if got:
                got[0].logprobs = logp.detach()
                keep.put(i, got[0])  # type: ignore[union-attr]
            clean.add(chunk, logp.detach())
            w = weights if weights is not None else LOGIT_DIFF.target_weights(plan, clean.result())
            objective = (logp * w[chunk.read_target].to(logp.device)).sum()
            grads = dict(zip(hooks_at, torch.autograd.grad(objective, [rec.acts[h] for h in hooks_at],
                                                           allow_unused=True)))
        mask = chunk.batch.attention_mask.bool()
        n_tokens += int(mask.sum())
        for hook_width, ks in groups.items():
            e, z, a = _head_terms([replaced[k] for k in ks], rec, grads[hook_width[0]], proj[hook_width[0]], mask)
            est[ks] += e
            size[ks] += z
            mass[ks] += a
        if progress is not None:
            progress(1)
    return Attribution(est, size / max(1, n_tokens), clean.result(), mass)
