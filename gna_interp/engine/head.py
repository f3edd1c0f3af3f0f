"""The model's head at the positions a metric reads: final norm, unembedding and log-normaliser.

A replay ends in the residual stream; a score needs ``log p(token)`` at a few positions. :func:`head_logprobs`
computes it without the ``reads x vocabulary`` logits matrix: the unembedding runs over blocks of
:data:`VOCAB_BLOCK` rows of its weight, each block's log-sum-exp is kept (float64 when combined) and each read's
own logit is taken from the block that holds its token, so the vocabulary is paid once per distinct read position
in cache-sized pieces. The blocks and their sums are those of :func:`~gna_interp.tasks.scoring.log_normaliser`,
which scores full logits (the clean forward's), so a replay's scores and the clean ones differ only by the logits'
own rounding. It equals ``read_logprobs(final_logits(...))`` at the reads, which :func:`head_logprobs` checks once
per model on a probe (a head the blocks do not reproduce -- a transform that is not elementwise, an
output layer that is not a plain linear map -- is then read in full, as before).
"""

from __future__ import annotations

import weakref

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.models.model import Model
from gna_interp.tasks.scoring import VOCAB_BLOCK, combine_lse, read_logprobs, vocab_step

__all__ = ["VOCAB_BLOCK", "at_reads", "final_logits", "head_logprobs", "logit_atol"]

_BLOCKWISE: "weakref.WeakKeyDictionary[Model, bool]" = weakref.WeakKeyDictionary()


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


def final_logits(model: Model, hidden: Float[Tensor, "rows pos d_model"], rows: Int[Tensor, " n"],
                 pos: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
    """Final norm and unembedding of the residual stream at ``(rows[i], pos[i])`` only (the whole vocabulary)."""
    return model.unembed(at_reads(hidden, rows, pos)[None])[0]


def _blockwise(model: Model, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
               at: Int[Tensor, " n_reads"]) -> Float[Tensor, " n_reads"]:
    """Log-probabilities of ``tokens`` at ``resid[at]``, the unembedding run block by block (see the module)."""
    out_layer = model.hf_model.get_output_embeddings()
    weight, bias = out_layer.weight, getattr(out_layer, "bias", None)
    normed, transform = model.final_norm(resid[None])[0], model.output_transform
    step = vocab_step(normed.device)
    own = torch.empty(tokens.shape[0], dtype=torch.float32, device=normed.device)
    lse = []
    for k in range(0, weight.shape[0], step):
        block = torch.nn.functional.linear(normed, weight[k:k + step], None if bias is None else bias[k:k + step])
        block = (transform(block) if transform is not None else block).float()
        lse.append(torch.logsumexp(block, -1))
        here = (tokens >= k) & (tokens < k + step)
        if here.any():
            own[here] = block[at[here], tokens[here] - k]
    return (own.double() - combine_lse(lse)[at]).float()


def _full(model: Model, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
          at: Int[Tensor, " n_reads"]) -> Float[Tensor, " n_reads"]:
    """The same from the whole ``n x vocabulary`` logits (the fallback)."""
    return read_logprobs(model.unembed(resid[None])[0], tokens, at)


def _blocks_reproduce(model: Model, resid: Float[Tensor, "n d_model"]) -> bool:
    """Whether :func:`_blockwise` reproduces the model's own head (once per model, on two of ``resid``'s rows): the
    same vocabulary, and the log-probabilities of the first, last and a spread of tokens within :func:`logit_atol`."""
    if model not in _BLOCKWISE:
        probe = resid[:2]
        vocab = model.hf_model.get_output_embeddings().weight.shape[0]
        tokens = torch.linspace(0, vocab - 1, 64, device=probe.device).long()
        at = torch.arange(probe.shape[0], device=probe.device).repeat_interleave(tokens.numel())
        tokens = tokens.repeat(probe.shape[0])
        try:
            full = model.unembed(probe[None])[0].float()
            want = read_logprobs(full, tokens, at)
            got = _blockwise(model, probe, tokens, at)
            ok = full.shape[-1] == vocab and bool((got - want).abs().max() <= logit_atol(model.dtype, float(
                full.abs().max())))
        except (AttributeError, TypeError, RuntimeError, IndexError):
            ok = False  # an output layer without a plain weight (or bias) to slice
        _BLOCKWISE[model] = ok
    return _BLOCKWISE[model]


@torch.no_grad()
def head_logprobs(model: Model, resid: Float[Tensor, "n d_model"], tokens: Int[Tensor, " n_reads"],
                  inverse: Int[Tensor, " n_reads"] | None = None) -> Float[Tensor, " n_reads"]:
    """``log p(tokens[i])`` under the model's head (final norm, unembedding, the family's output transform) at the
    residual-stream vectors ``resid[inverse[i]]`` (``inverse`` from
    :func:`~gna_interp.tasks.scoring.distinct_reads`; None: ``resid[i]``), without materialising the logits (see the
    module). Equals ``log_softmax(model.unembed(resid))`` at the reads to float32 rounding."""
    device = resid.device
    tokens = tokens.to(device)
    at = inverse.to(device) if inverse is not None else torch.arange(tokens.shape[0], device=device)
    if tokens.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float32, device=device)
    if _blocks_reproduce(model, resid):
        return _blockwise(model, resid, tokens, at)
    return _full(model, resid, tokens, at)
