"""Summary offsets: where a head reads a line, when a causal convolution has carried the line forward.

A Mamba mixer runs its ``x``, ``B`` and ``C`` through a causal convolution of width ``w`` before the scan,
so what the scan calls position ``s`` carries tokens ``s-w+1..s``: a line is visible at its summary token
*and at the ``w-1`` tokens after it*, in this mixer and in the residual stream every later layer reads
(an attention layer of a hybrid included). Measured on the zoo models: the Mamba-2's layer-1 aggregate
heads read each line one token after its end, the hybrid's attention aggregate head two tokens after it;
at the literal summary tokens neither selects the gold line.

So a head's G&A scores are read with the lines moved ``d`` tokens later, ``d = 0..reach(head)``
(:func:`reach`: ``w - 1`` of the widest convolution up to the head's mixer; 0 in an attention-only
model, where nothing changes), and the head's **summary offset** is the smallest ``d`` whose score is
within :data:`OFFSET_TOLERANCE` of its best (:func:`pick_offset`): the literal reading wins ties, a
later one has to be clearly better. :func:`~gna_interp.circuits.scan.roles.role_scores`, the masking
experiment and the family comparison all read offsets this way.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.segments import Segments, Span

OFFSET_TOLERANCE = 0.1

__all__ = ["OFFSET_TOLERANCE", "conv_width", "intact_at", "offsets_of", "pick_offset", "reach", "shifted_items"]


def shifted_items(seg: Segments, offset: int = 0) -> list[Span]:
    """The lines of ``seg`` moved ``offset`` tokens later and clipped at the prompt's end (a line left
    empty is dropped): where a head whose input a convolution has shifted reads them."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InputError(f"a summary offset must be an integer >= 0, got {offset!r}")
    out = []
    for sp in seg.items:
        a, z = sp.start + offset, min(sp.stop + offset, seg.n_tokens)
        if a < z:
            out.append(Span(a, z))
    return out


def intact_at(seg: Segments, offset: int) -> list[Span] | None:
    """:func:`shifted_items`, or ``None`` when the offset pushes some line (partly) past the prompt's end:
    such a prompt is not scored at that offset."""
    items = shifted_items(seg, offset)
    if len(items) != len(seg.items) or any(len(a) != len(b) for a, b in zip(items, seg.items)):
        return None
    return items


def conv_width(model: Model, head: HeadRef | str) -> int:
    """Width of the causal convolution in front of ``head``'s mixer (``conv_kernel_size`` of Mamba
    mixers); 1 for a mixer without one (attention)."""
    h = model.check_head(head)
    return _conv_width(model.hf_module(model.layer_spec(h.layer, h.kind).bridge_path))


def _conv_width(mod: Any) -> int:
    w = getattr(mod, "conv_kernel_size", None)
    if w is None and hasattr(mod, "conv1d"):
        w = getattr(mod.conv1d, "kernel_size", (1,))[0]
    return max(1, int(w or 1))


def reach(model: Model, head: HeadRef | str) -> int:
    """How far (in tokens) after its last token a line can be read by ``head``: ``width - 1`` of the widest
    causal convolution among the mixers up to and including ``head``'s (0 in an attention-only model).
    One convolution's span, not the sum over layers: larger offsets push the last lines' summaries into
    the question and onto the decision position itself, where every head's local mass would pass for
    selectivity."""
    h = model.check_head(head)
    widths = [_conv_width(model.hf_module(s.bridge_path)) for s in model.layers
              if s.supported and (s.layer < h.layer or (s.layer == h.layer and s.kind == h.kind))]
    return max(widths, default=1) - 1


def offsets_of(model: Model, head: HeadRef | str) -> list[int]:
    """The summary offsets ``head`` is read at: ``0..reach(head)``."""
    return list(range(reach(model, head) + 1))


def pick_offset(scores: Mapping[int, float], tolerance: float = OFFSET_TOLERANCE) -> int:
    """The smallest offset whose score is within ``tolerance * |best|`` of the best score (NaN scores are
    not candidates; 0 when there is none)."""
    valid = {int(d): float(v) for d, v in scores.items() if not math.isnan(float(v))}
    if not valid:
        return 0
    best = max(valid.values())
    return min(d for d, v in valid.items() if v >= best - tolerance * abs(best))
