"""Prefix reuse: capture every block's clean input once, then re-run only blocks ``L..N-1``.

Ablating a head of layer ``L`` cannot change blocks ``0..L-1``. One clean forward records, with a
forward pre-hook (``with_kwargs=True``) on each bridge block, the arguments the model's own loop
passes to it (hidden states, masks, position embeddings; KV/SSM caches are dropped). A replay feeds
block ``L`` its recorded input and chains ``L..N-1`` from there, with the caller's hooks active;
several ablations share one replay by stacking copies of the batch (every recorded tensor whose
first dimension is the batch is repeated). Only the final norm and unembedding of the positions the
metric reads are computed.

The bridge's ``start_at_layer`` still runs the earlier blocks internally, hence this module.
:func:`verify_replay` checks, once per model and batch shape, that a replay from block 0 reproduces
the bridge's own logits (it would not for a model that does work between its blocks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from gna_interp.models.model import Model, TokenBatch

__all__ = ["Prefix", "ReplayMismatch", "capture", "final_logits", "replay", "verify_replay"]


class ReplayMismatch(RuntimeError):
    """Replaying the recorded block inputs does not reproduce the model's forward."""


@dataclass
class Prefix:
    """Clean per-block inputs of one batch: ``inputs[i] = (args, kwargs)`` of block ``i``; ``logits``
    are the bridge's clean logits, ``[batch, pos, vocab]`` or, when captured with reads, ``[n_reads, vocab]``."""

    batch_size: int
    inputs: list[tuple[tuple[Any, ...], dict[str, Any]]]
    logits: Float[Tensor, "batch pos vocab"] | Float[Tensor, "n_reads vocab"]

    def hidden(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The residual stream entering block ``layer``."""
        args, kwargs = self.inputs[layer]
        return args[0] if args else kwargs["hidden_states"]


def _strip_caches(kwargs: dict[str, Any]) -> dict[str, Any]:
    from transformers.cache_utils import Cache

    out = {}
    for k, v in kwargs.items():
        if isinstance(v, Cache):
            v = None
        elif k == "use_cache":
            v = False
        out[k] = v
    return out


@torch.no_grad()
def capture(model: Model, batch: TokenBatch,
            reads: tuple[Int[Tensor, " n"], Int[Tensor, " n"]] | None = None) -> Prefix:
    """One clean forward of ``batch`` recording every block's input arguments; keeps the logits of
    every position, or only those at ``reads = (rows, positions)``."""
    inputs: dict[int, tuple[tuple[Any, ...], dict[str, Any]]] = {}
    handles = []
    try:
        for i, block in enumerate(model.blocks()):
            def pre(_mod: Any, args: tuple, kwargs: dict, i: int = i) -> None:
                inputs[i] = (tuple(args), _strip_caches(kwargs))

            handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        logits = model.forward(batch)
    finally:
        for h in handles:
            h.remove()
    if len(inputs) != model.n_layers:
        raise RuntimeError(f"only {len(inputs)} of {model.n_layers} blocks of {model.name} ran in the forward pass")
    if reads is not None:
        logits = logits[reads[0].to(logits.device), reads[1].to(logits.device)]
    return Prefix(int(batch.ids.shape[0]), [inputs[i] for i in range(model.n_layers)], logits)


def _repeat(value: Any, batch: int, times: int) -> Any:
    if times == 1:
        return value
    if isinstance(value, Tensor):
        if value.dim() >= 2 and value.shape[0] == batch:
            return value.repeat(times, *([1] * (value.dim() - 1)))
        return value
    if isinstance(value, tuple):
        return tuple(_repeat(v, batch, times) for v in value)
    if isinstance(value, list):
        return [_repeat(v, batch, times) for v in value]
    return value


def replay(model: Model, prefix: Prefix, start: int, copies: int = 1) -> Float[Tensor, "copies_batch pos d_model"]:
    """Run blocks ``start..N-1`` from the clean input of block ``start``, on ``copies`` stacked copies of
    the batch (rows ``c*B..(c+1)*B-1`` are copy ``c``); returns the last block's output.

    Hooks the caller has attached (e.g. an ablation on some copies' rows) fire as in a full forward.
    Gradients flow when the caller enables them.
    """
    b = prefix.batch_size
    blocks = model.blocks()
    x = _repeat(prefix.hidden(start), b, copies)
    for i in range(start, len(prefix.inputs)):
        args, kwargs = prefix.inputs[i]
        kwargs = {k: _repeat(v, b, copies) for k, v in kwargs.items()}
        if args:
            rest = tuple(_repeat(a, b, copies) for a in args[1:])
            out = blocks[i](x, *rest, **kwargs)
        else:
            out = blocks[i](**{**kwargs, "hidden_states": x})
        x = out[0] if isinstance(out, (tuple, list)) else out
    return x


def final_logits(model: Model, hidden: Float[Tensor, "rows pos d_model"], rows: Int[Tensor, " n"],
                 pos: Int[Tensor, " n"]) -> Float[Tensor, "n vocab"]:
    """Final norm and unembedding of the residual stream at ``(rows[i], pos[i])`` only."""
    sel = hidden[rows.to(hidden.device), pos.to(hidden.device)][None]
    return model.unembed(sel)[0]


@torch.no_grad()
def verify_replay(model: Model, batch: TokenBatch, rows: Int[Tensor, " n"], pos: Int[Tensor, " n"],
                  atol: float = 1e-3) -> float:
    """Capture ``batch`` (keep it small: two rows do), replay it from block 0 as two stacked copies and
    return the largest deviation from the bridge's own logits at the reads ``(rows, pos)``; raises
    :class:`ReplayMismatch` above ``atol``."""
    prefix = capture(model, batch, (rows, pos))
    hidden = replay(model, prefix, 0, copies=2)
    b = prefix.batch_size
    want = prefix.logits.float()
    worst = 0.0
    for c in range(2):
        got = final_logits(model, hidden, rows + c * b, pos).float()
        worst = max(worst, (got - want).abs().max().item())
    if not worst <= atol:
        raise ReplayMismatch(
            f"replaying the blocks of {model.name} from their recorded inputs does not reproduce its forward "
            f"(max logit deviation {worst:.3g}); the model does work between its blocks, so the fast exact "
            f"scan cannot be used for it"
        )
    return worst
