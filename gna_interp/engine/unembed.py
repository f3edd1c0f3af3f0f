"""The model's head at the positions a metric reads: final norm, unembedding and log-normaliser.

A replay ends in the residual stream; a score needs ``log p(token)`` at a few positions. :func:`head_logprobs`
computes it without the ``reads x vocabulary`` logits matrix: the unembedding runs over blocks of
:data:`VOCAB_BLOCK` rows of its weight, each block's log-sum-exp is kept (float64 when combined) and each read's
own logit is taken from the block that holds its token, so the vocabulary is paid once per distinct read position
in cache-sized pieces. The rows are taken a piece at a time too (:func:`row_step`), so however
many positions are read -- every position of a paragraph, for stacked copies -- at most
:data:`HEAD_VALUES` logits live at once. The blocks and their sums are those of :func:`log_normaliser`,
which scores full logits (the clean forward's), so a replay's scores and the clean ones differ only by the logits'
own rounding. It equals ``read_logprobs(final_logits(...))`` at the reads, which :func:`head_logprobs` checks once
per model on a probe (a head the blocks do not reproduce -- a transform that is not elementwise, an
output layer that is not a plain linear map -- is then read in full). A model's head reaches these functions as
an :class:`OutputHead` (:func:`output_head`), which holds what they use of the model and keeps the checks' answers.

:func:`head_logprobs_grad` is the same computation for a pass that differentiates it (attribution): its backward
never touches the vocabulary. The gradient of ``log p(t) = l_t - logsumexp(l)`` with respect to the normed residual
``x`` (``l = T(x W^T + b)``, ``T`` the family's elementwise output transform) is ``T'(z_t) W_t - E_p[T'(z) W]``; the
forward, while it runs over the vocabulary blocks, also accumulates that expectation (each block's local softmax
times ``T'`` times the block's rows, rescaled to the log-sum-exp of the blocks so far as an online softmax does), so
the backward is an ``n x d_model`` gather, with no ``reads x vocabulary`` matrix and no gradient for the unembedding weight.
"""

from __future__ import annotations

from typing import Callable, Iterator, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.models.model import Model

__all__ = ["HEAD_VALUES", "VOCAB_BLOCK", "OutputHead", "at_reads", "combine_lse", "final_logits", "head_logprobs",
           "head_logprobs_grad", "log_normaliser", "log_softmax_rows", "logit_atol", "output_head", "read_logprobs",
           "row_pieces", "row_step", "vocab_step"]

VOCAB_BLOCK: dict[str, int] = {"cpu": 2048}  # vocabulary columns per log-sum-exp block, by device type (else 32768)


def vocab_step(device: torch.device) -> int:
    """Columns of one vocabulary block on ``device`` (:data:`VOCAB_BLOCK`; 32768 where not listed)."""
    return VOCAB_BLOCK.get(torch.device(device).type, 32768)


HEAD_VALUES: dict[str, int] = {"cpu": 1 << 24}  # logits alive at once in a head computed by rows, by device type
# (else 1 << 27): the rows of one piece times the vocabulary columns it spans


def row_step(device: torch.device, columns: int) -> int:
    """Rows of one piece of a head that spans ``columns`` vocabulary columns on ``device``: at most
    :data:`HEAD_VALUES` logits (``1 << 27`` where not listed) live at once, at least one row."""
    return max(1, HEAD_VALUES.get(torch.device(device).type, 1 << 27) // max(1, columns))


def row_pieces(n_rows: int, at: Int[Tensor, " n_reads"], rows: int
               ) -> Iterator[tuple[int, int, Int[Tensor, " n_piece_reads"]]]:
    """Consecutive pieces ``start..stop-1`` of ``n_rows`` rows, ``rows`` at a time, each with the indices of the reads
    ``i`` whose row ``at[i]`` lies in it (pieces no read falls in are skipped)."""
    for start in range(0, n_rows, rows):
        stop = min(n_rows, start + rows)
        mine = ((at >= start) & (at < stop)).nonzero()[:, 0]
        if mine.numel():
            yield start, stop, mine


def combine_lse(parts: Sequence[Float[Tensor, " n"]]) -> Float[Tensor, " n"]:
    """The log-normaliser from the log-sum-exps of consecutive vocabulary blocks, combined in float64."""
    return torch.logsumexp(torch.stack(list(parts), -1).double(), -1)


def log_normaliser(logits: Float[Tensor, "n vocab"]) -> Float[Tensor, " n"]:
    """``logsumexp`` of each row (float64), summed block by block (:func:`vocab_step` columns in float32, the blocks
    combined in float64): the same sums, in the same order, as the blockwise head of the replays
    (:func:`gna_interp.engine.unembed.head_logprobs`), so scores from full logits and from replays differ only by the
    logits' own rounding."""
    step = vocab_step(logits.device)
    return combine_lse([torch.logsumexp(logits[:, k:k + step].float(), -1) for k in range(0, logits.shape[-1], step)])


def read_logprobs(logits: Float[Tensor, "n vocab"], tokens: Int[Tensor, " n_reads"],
                  inverse: Int[Tensor, " n_reads"] | None = None) -> Float[Tensor, " n_reads"]:
    """Log-probability (float32) of each read's token (e.g. ``chunk.read_tok``) from the logits at the reads, or --
    with ``inverse`` from :func:`distinct_reads` -- from the logits at the distinct read positions (read ``i`` is at
    ``logits[inverse[i]]``); the normaliser is :func:`log_normaliser`'s."""
    tok = tokens.to(logits.device)
    at = inverse.to(logits.device) if inverse is not None else torch.arange(tok.shape[0], device=logits.device)
    lse = log_normaliser(logits.detach())
    if logits.requires_grad:  # the value above with one logsumexp's gradient (sliced blocks under autograd would
        fast = torch.logsumexp(logits.float(), -1).double()  # write a whole zero row per block in the backward)
        lse = fast + (lse - fast).detach()
    return (logits[at, tok].double() - lse[at]).float()


def log_softmax_rows(logits: Float[Tensor, "n vocab"]) -> Float[Tensor, "n vocab"]:
    """``log_softmax`` of each row (float32) with :func:`log_normaliser`'s normaliser."""
    return (logits.double() - log_normaliser(logits)[:, None]).float()


def logit_atol(dtype: torch.dtype, scale: float) -> float:
    """Largest logit (or log-probability) deviation accepted between two ways of computing the same head output for
    a model in ``dtype`` whose largest logit is ``scale``: ``1e-3`` in float32; in half precision the larger of that
    and 8 units in the last place of ``scale`` (a stacked replay has a larger batch, and GPU kernels chosen by batch
    size round differently: one bfloat16 rounding of a logit near 32 moves it by 0.25). A computation that misses
    work (between blocks, or in the head) is off by far more."""
    if dtype in (torch.float32, torch.float64):
        return 1e-3
    return max(1e-3, 8 * torch.finfo(dtype).eps * scale)


def at_reads(hidden: Float[Tensor, "rows pos d_model"], rows: Int[Tensor, " n"], pos: Int[Tensor, " n"]
             ) -> Float[Tensor, "n d_model"]:
    """The residual stream at ``(rows[i], pos[i])``."""
    return hidden[rows.to(hidden.device), pos.to(hidden.device)]


class OutputHead:
    """One model's language-model head as the read-outs take it: the final norm (:meth:`Model.final_norm
    <gna_interp.models.model.Model.final_norm>`), the full head (:meth:`Model.unembed
    <gna_interp.models.model.Model.unembed>`), the output layer whose weight and bias the blocks slice, the family's
    output transform, and two facts checked once, on first use: whether the blocks reproduce the full head
    (:meth:`normed`) and whether the transform leaves logits unchanged (:meth:`active_transform`). Get it with
    :func:`output_head`, which keeps one per model on the model."""

    def __init__(self, model: Model) -> None:
        self._model = model  # read at each use: a model cast or moved, or given another transform, is read as it is
        self.norm: Callable[[Tensor], Tensor] = model.final_norm
        self.logits: Callable[[Tensor], Tensor] = model.unembed
        self.blockwise: bool | None = None  # the blocks reproduce the full head (None: not yet checked)
        self.identity: bool | None = None  # the transform leaves logits unchanged (None: not yet checked)

    @property
    def transform(self) -> Callable[[Tensor], Tensor] | None:
        """The family's output transform (:attr:`Model.output_transform
        <gna_interp.models.model.Model.output_transform>`), or None."""
        return self._model.output_transform

    @property
    def dtype(self) -> torch.dtype:
        """The model's dtype."""
        return self._model.dtype

    @property
    def d_vocab(self) -> int:
        """The size of the vocabulary."""
        return self._model.d_vocab

    def output_layer(self) -> tuple[Float[Tensor, "vocab d_model"], Tensor | None]:
        """The weight and the bias (None without one) of the output layer, which :func:`_blockwise` slices."""
        layer = self._model.hf_model.get_output_embeddings()
        return layer.weight, getattr(layer, "bias", None)

    def normed(self, resid: Float[Tensor, "n d_model"]) -> Float[Tensor, "n d_model"] | None:
        """``resid`` through the final norm, what :func:`_blockwise` reads, or None where the blocks do not reproduce
        the full head (its logits are then read in full, :func:`_full`). Whether they do is checked once
        (:meth:`reproduces`, on two of ``resid``'s rows, without gradients); the final norm keeps the caller's."""
        normed = self.norm(resid[None])[0]
        if self.blockwise is None:
            with torch.no_grad():
                try:
                    self.blockwise = self.reproduces(self.logits(resid[None, :2])[0].float(), normed[:2])
                except (AttributeError, TypeError, RuntimeError, IndexError):
                    self.blockwise = False  # an output layer without a plain weight (or bias) to slice
        return normed if self.blockwise else None

    def reproduces(self, full: Float[Tensor, "n vocab"], normed: Float[Tensor, "n d_model"]) -> bool:
        """Whether :func:`_blockwise` of ``normed`` gives what the full head's logits there, ``full``, give: the same
        vocabulary, and the log-probabilities of the first, last and a spread of tokens within :func:`logit_atol`."""
        weight, bias = self.output_layer()
        vocab = weight.shape[0]
        tokens = torch.linspace(0, vocab - 1, 64, device=normed.device).long()
        at = torch.arange(normed.shape[0], device=normed.device).repeat_interleave(tokens.numel())
        tokens = tokens.repeat(normed.shape[0])
        want = read_logprobs(full, tokens, at)
        got = _blockwise(normed, weight, bias, self.transform, tokens, at)
        return full.shape[-1] == vocab and bool((got - want).abs().max() <= logit_atol(self.dtype, float(
            full.abs().max())))

    def active_transform(self, dtype: torch.dtype) -> Callable[[Tensor], Tensor] | None:
        """The output transform, or None where it leaves logits unchanged (most families: the adapter's method applies
        a soft-cap the config does not set), checked once on a probe spanning large logits; the backward then needs
        no slope of the transform."""
        if self.transform is None:
            return None
        if self.identity is None:
            probe = (torch.linspace(-200.0, 200.0, 401)[None] * torch.tensor([[1.0], [0.01]])).to(dtype)
            self.identity = bool(torch.equal(self.transform(probe.clone()), probe))
        return None if self.identity else self.transform


HEAD = "unembed.head"  # Model.facts key: the model's OutputHead


def output_head(model: Model) -> OutputHead:
    """The :class:`OutputHead` of ``model``, made on first use and kept in :attr:`Model.facts
    <gna_interp.models.model.Model.facts>` (its checks are then made once per model)."""
    if HEAD not in model.facts:
        model.facts[HEAD] = OutputHead(model)
    return model.facts[HEAD]


def final_logits(head: OutputHead, hidden: Float[Tensor, "rows pos d_model"], rows: Int[Tensor, " n"],
                 pos: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
    """Final norm and unembedding of the residual stream at ``(rows[i], pos[i])`` only (the whole vocabulary)."""
    return head.logits(at_reads(hidden, rows, pos)[None])[0]


def _blockwise(normed: Float[Tensor, "n d_model"], weight: Float[Tensor, "vocab d_model"], bias: Tensor | None,
               transform, tokens: Int[Tensor, " n_reads"], at: Int[Tensor, " n_reads"]) -> Float[Tensor, " n_reads"]:
    """Log-probabilities of ``tokens`` at ``normed[at]`` (the residual stream through the final norm) under the output
    layer's ``weight`` and ``bias`` and the family's output ``transform`` (None: none), the unembedding run block by
    block over the vocabulary and piece by piece over the rows (see the module)."""
    step = vocab_step(normed.device)
    out = torch.empty(tokens.shape[0], dtype=torch.float32, device=normed.device)
    for start, stop, mine in row_pieces(normed.shape[0], at, row_step(normed.device, step)):
        x, tok, loc = normed[start:stop], tokens[mine], at[mine] - start
        own = torch.empty(tok.shape[0], dtype=torch.float32, device=normed.device)
        lse = []
        for k in range(0, weight.shape[0], step):
            block = torch.nn.functional.linear(x, weight[k:k + step], None if bias is None else bias[k:k + step])
            block = (transform(block) if transform is not None else block).float()
            lse.append(torch.logsumexp(block, -1))
            here = (tok >= k) & (tok < k + step)
            if here.any():
                own[here] = block[loc[here], tok[here] - k]
        out[mine] = (own.double() - combine_lse(lse)[loc]).float()
    return out


def _full(head: OutputHead, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
          at: Int[Tensor, " n_reads"]) -> Float[Tensor, " n_reads"]:
    """The same from the whole vocabulary's logits (the fallback), a piece of rows at a time."""
    out = torch.empty(tokens.shape[0], dtype=torch.float32, device=resid.device)
    for start, stop, mine in row_pieces(resid.shape[0], at, row_step(resid.device, head.d_vocab)):
        out[mine] = read_logprobs(head.logits(resid[None, start:stop])[0], tokens[mine], at[mine] - start)
    return out


@torch.no_grad()
def head_logprobs(head: OutputHead, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
                  inverse: Int[Tensor, " n_reads"] | None = None) -> Float[Tensor, " n_reads"]:
    """``log p(tokens[i])`` under a model's ``head`` (final norm, unembedding, the family's output transform) at the
    residual-stream vectors ``resid[inverse[i]]`` (``inverse`` from
    :func:`~gna_interp.engine.layout.distinct_reads`; None: ``resid[i]``), without materialising the logits (see the
    module). Equals ``log_softmax(head.logits(resid))`` at the reads to float32 rounding."""
    device = resid.device
    tokens = tokens.to(device)
    at = inverse.to(device) if inverse is not None else torch.arange(tokens.shape[0], device=device)
    if tokens.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    normed = head.normed(resid)
    if normed is not None:
        return _blockwise(normed, *head.output_layer(), head.transform, tokens, at)
    return _full(head, resid, tokens, at)


def _transform_slopes(transform, z: Tensor, weights: Tensor) -> Tensor:
    """``weights * T'(z)`` for the elementwise output transform ``T`` (autograd through ``T`` on one block)."""
    with torch.enable_grad():
        zz = z.detach().requires_grad_(True)
        return torch.autograd.grad(transform(zz).float(), zz, weights.to(torch.float32))[0]


class _HeadLogprobs(torch.autograd.Function):
    """``log p(tokens[i])`` at ``normed[at[i]]`` (see :func:`head_logprobs_grad`); the backward reads two saved
    ``d_model``-wide tensors, not the vocabulary."""

    @staticmethod
    def forward(ctx, normed: Tensor, weight: Tensor, bias: Tensor | None, transform, tokens: Tensor,  # type: ignore[override]
                at: Tensor) -> Tensor:
        step = vocab_step(normed.device)
        out = torch.empty(tokens.shape[0], dtype=torch.float32, device=normed.device)
        own_dir = torch.empty(tokens.shape[0], normed.shape[-1], dtype=torch.float32, device=normed.device)
        e = torch.empty(normed.shape[0], normed.shape[-1], dtype=torch.float32, device=normed.device)
        for start, stop, mine in row_pieces(normed.shape[0], at, row_step(normed.device, step)):
            x, tok, loc = normed[start:stop], tokens[mine], at[mine] - start
            own = torch.empty(tok.shape[0], dtype=torch.float32, device=normed.device)
            lse: list[Tensor] = []
            seen = acc = None  # log-sum-exp of the blocks so far (float64) and their softmax-weighted rows
            for k in range(0, weight.shape[0], step):
                w = weight[k:k + step]
                z = torch.nn.functional.linear(x, w, None if bias is None else bias[k:k + step])
                block = (transform(z) if transform is not None else z).float()
                part = torch.logsumexp(block, -1)
                lse.append(part)
                p = torch.exp(block - part[:, None])  # the block's own softmax
                if transform is not None:
                    p = _transform_slopes(transform, z, p)
                expect = (p.to(w.dtype) @ w).float()
                if seen is None:
                    seen, acc = part.double(), expect
                else:  # rescale what came before to the new total, as an online softmax does
                    total = torch.logaddexp(seen, part.double())
                    acc = acc * torch.exp(seen - total).float()[:, None] + torch.exp(part.double() - total).float()[:, None] * expect
                    seen = total
                here = (tok >= k) & (tok < k + step)
                if here.any():
                    idx = tok[here] - k
                    own[here] = block[loc[here], idx]
                    slope = 1.0
                    if transform is not None:
                        one = torch.zeros_like(block)
                        one[loc[here], idx] = 1.0
                        slope = _transform_slopes(transform, z, one)[loc[here], idx][:, None]
                    own_dir[mine[here]] = w[idx].float() * slope
            out[mine] = (own.double() - combine_lse(lse)[loc]).float()
            e[start:stop] = acc
        ctx.save_for_backward(own_dir, e, at)
        ctx.in_dtype = normed.dtype
        return out

    @staticmethod
    def backward(ctx, g: Tensor):  # type: ignore[override]
        own_dir, e, at = ctx.saved_tensors
        d = g.float()[:, None] * (own_dir - e[at])
        grad = torch.zeros_like(e).index_add_(0, at, d)
        return grad.to(ctx.in_dtype), None, None, None, None, None


def head_logprobs_grad(head: OutputHead, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
                       inverse: Int[Tensor, " n_reads"] | None = None) -> Float[Tensor, " n_reads"]:
    """:func:`head_logprobs` under autograd: ``log p(tokens[i])`` at ``resid[inverse[i]]``, differentiable with respect
    to ``resid`` (through the final norm), its backward blockwise (see the module). A head that the blocks do not
    reproduce is differentiated in full (:meth:`OutputHead.logits`)."""
    device = resid.device
    tokens = tokens.to(device)
    at = inverse.to(device) if inverse is not None else torch.arange(tokens.shape[0], device=device)
    normed = head.normed(resid) if tokens.shape[0] > 0 else None
    if normed is None:
        return read_logprobs(head.logits(resid[None])[0], tokens, at)
    weight, bias = head.output_layer()
    weight, bias = weight.detach(), bias.detach() if bias is not None else None
    return _HeadLogprobs.apply(normed, weight, bias, head.active_transform(weight.dtype), tokens, at)
