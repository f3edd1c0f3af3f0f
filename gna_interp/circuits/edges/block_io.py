"""A block's receiver inputs read from streams of their own and written back: the one way path patching and edge
circuits run a block on patched streams.

A receiver input reads its block's stream through the block's pre-norm and an input projection. Given stacked
streams (one per distinct way the receivers' inputs are patched), :func:`input_channels` returns each stream's
channels at the input sites asked of it: one run of the block on the streams stacked, stopped once the projections
have fired -- or, at layers whose input sites are plain linear projections (:func:`direct_reads`, checked once per
model), only the asked channels, the projection's rows applied to its input, so that a stream copy computes only the
projections its receivers read; where that input is the block's pre-norm of the stream (checked on the same pass),
the norm module alone runs, not the block, and where that norm is an RMS norm (:class:`RMSFold`, checked too) not even
the norm: its gain is folded into the projection's rows and its scale applied to the product, so no normed copy of
a stream is made. :func:`overwrite` is the hook that writes such channels -- or a head's
recomputed output -- into a run, and :func:`edge_replay` the one replay that runs blocks with such hooks, block by
block.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from gna_interp.engine.replay import Prefix, replay
from gna_interp.models.mixer import ChannelSpan, InputSite
from gna_interp.models.model import Model

__all__ = ["PostMap", "RMSFold", "direct_reads", "edge_replay", "flat", "input_channels", "overwrite", "post_maps", "read_block",
           "reproduces"]

DIRECT = "edge_circuit.direct"  # Model.facts key: the layers whose receiver inputs are read as plain projections
NORMS = "edge_circuit.norms"  # Model.facts key: per such layer, the norm that feeds its projections (or None)
FOLDS = "edge_circuit.folds"  # Model.facts key: per such layer, that norm as an RMSFold (or None)

Direct = dict[str, tuple[str, torch.nn.Linear]]  # input site hook -> (the projection's input hook, the projection)


def flat(x: Tensor) -> Tensor:
    """A hook value ``[b, p, h, d]`` or ``[b, p, w]`` as ``[b, p, w]`` (a view when possible)."""
    return x.flatten(2) if x.dim() == 4 else x


def reproduces(value: Tensor, added: Tensor, dtype: torch.dtype) -> bool:
    """Whether ``value`` is what a block ``added`` to the stream, up to the rounding of the residual sum in ``dtype``:
    ``|value - added| <= atol + 1e-3 |added|``, ``atol`` 1e-4 of the largest ``|added|`` (at least 1) in single or
    double precision, 16 units in the last place of it in half precision."""
    scale = max(1.0, float(added.abs().max())) if added.numel() else 1.0
    atol = 1e-4 * scale if dtype in (torch.float32, torch.float64) else 16 * torch.finfo(dtype).eps * scale
    return bool(torch.allclose(value.float(), added.float(), atol=atol, rtol=1e-3))


class _Enough(Exception):
    """Raised by a hook once a single-block run has produced every value it was run for."""


def read_block(model: Model, prefix: Prefix, layer: int, names: Sequence[str], copies: int,
               hooks: Sequence[tuple[str, Any]] = (), hidden: Tensor | None = None, keys: Any = None
               ) -> dict[str, Tensor]:
    """The values (flat ``[b, p, w]`` copies) of hooks ``names`` in one run of block ``layer`` on ``copies`` stacked
    copies (from ``hidden`` when given; of the positions from ``keys.column`` on with ``keys``, a
    :class:`~gna_interp.engine.replay.KeyTap` holding the earlier ones') with ``hooks`` attached, in the order they
    fired; the run stops once every one has been read."""
    got: dict[str, Tensor] = {}

    def grab(name: str) -> Any:
        def hook(v: Tensor, hook: Any = None) -> Tensor:
            if len(got) + 1 == len(names):  # the last one: the rest of the block is not run, nothing writes it
                got[name] = flat(v).detach()
                raise _Enough
            got[name] = flat(v).detach().clone()
            return v
        return hook

    try:
        with model.hooks([*hooks, *((name, grab(name)) for name in names)]):
            replay(model, prefix, layer, copies, hidden=hidden, stop=layer + 1, keys=keys)
    except _Enough:
        pass
    return got


def edge_replay(model: Model, prefix: Prefix, start: int, until: int,
                hooks_at: Callable[[int], Sequence[tuple[str, Any]]], copies: int = 1,
                hidden: Float[Tensor, "copies_batch pos d_model"] | None = None, keys: Any = None,
                moved: Callable[[int, Tensor], None] | None = None) -> Float[Tensor, "copies_batch pos d_model"]:
    """The one replay of every edge-shaped forward (path patching's patched copies, an edge circuit's pass): blocks
    ``start..`` on ``copies`` stacked copies (from ``hidden``, else block ``start``'s clean input), each block
    ``l < until`` run alone with ``hooks_at(l)`` attached (built when the block is reached, so that they may read what
    the blocks before it wrote) and ``moved(l, its output)`` called after it; the blocks from ``until`` on run as the
    model's own forward, in one replay. ``keys``: a :class:`~gna_interp.engine.replay.KeyTap` (the copies hold the
    positions from its column on; see :func:`~gna_interp.engine.replay.replay`). Returns the last block's output."""
    x = hidden
    for layer in range(start, min(until, model.n_layers)):
        with model.hooks(list(hooks_at(layer))):
            x = replay(model, prefix, layer, copies, hidden=x, stop=layer + 1, keys=keys)
        if moved is not None:
            moved(layer, x)
    if until < model.n_layers or x is None:
        x = replay(model, prefix, max(start, until), copies, hidden=x, keys=keys)
    return x


def direct_reads(model: Model, prefix: Prefix, sites: dict[int, set[str]]) -> dict[int, Direct]:
    """Per layer of ``sites`` (its input sites' hooks) whose every site is the output of a plain linear projection
    (:meth:`~gna_interp.models.model.Model.linear_input`): ``{site hook: (the projection's input hook, the
    projection)}``. Checked once per model on ``prefix``'s clean stream against the block's own projections (a layer
    they do not reproduce is read through the block); the layers that pass are remembered on the model
    (``Model.facts``)."""
    out: dict[int, Direct] = {}
    for layer, hooks in sites.items():
        found = {}
        for hook in hooks:
            linear = model.linear_input(hook)
            if linear is None:
                break
            found[hook] = linear
        else:
            out[layer] = found
    passed = model.facts.setdefault(DIRECT, {})
    for layer, found in out.items():
        if layer in passed:
            continue
        ins = sorted({h for h, _ in found.values()})
        got = read_block(model, prefix, layer, sorted(found) + ins, 1, hidden=prefix.hidden(layer))
        if all(reproduces(F.linear(got[h_in], proj.weight, proj.bias), got[h], model.dtype)
               for h, (h_in, proj) in found.items()):
            # projections fed the same input (a block's q, k and v) read it once: at the first of them to fire
            # (``got`` holds the hooks in the order they fired), so that the stacked streams stop before any
            # projection runs
            same = all(torch.equal(got[h], got[ins[0]]) for h in ins)
            passed[layer] = next(h for h in got if h in ins) if same else None
            norm = _input_norm(model, prefix.hidden(layer), layer, got[ins[0]]) if same else None
            model.facts.setdefault(NORMS, {})[layer] = norm
            model.facts.setdefault(FOLDS, {})[layer] = RMSFold.of(norm, prefix.hidden(layer), got[ins[0]], model.dtype) \
                if norm is not None else None
        else:
            passed[layer] = False
    return {layer: {h: (passed[layer] or h_in, proj) for h, (h_in, proj) in found.items()}
            for layer, found in out.items() if passed[layer] is not False}


@dataclass
class RMSFold:
    """A block's input norm as an RMS norm, ``g ⊙ x / sqrt(mean(x²) + eps)``: a projection of its output is then
    ``r(x) · x (W ⊙ g)ᵀ + b`` with ``r(x) = 1 / sqrt(mean(x²) + eps)``, the gain folded into the projection's rows
    once (``folded``) -- a stream's channels without a normed copy of the stream."""

    gain: Float[Tensor, " d_model"]
    eps: float
    folded: dict[int, Tensor]  # per projection (by id): its weight with the gain folded in

    @classmethod
    def of(cls, norm: torch.nn.Module, x: Tensor, value: Tensor, dtype: torch.dtype) -> "RMSFold | None":
        """``norm`` as an RMS norm of gain ``weight`` or ``1 + weight`` (Gemma's) and its ``variance_epsilon`` /
        ``eps``, where that reproduces ``value`` (the norm's output on ``x``); else None."""
        weight = getattr(norm, "weight", None)
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        if not isinstance(weight, Tensor) or weight.dim() != 1 or not isinstance(eps, (int, float)):
            return None
        for gain in (weight, 1 + weight):
            fold = cls(gain.detach().float(), float(eps), {})
            with torch.no_grad():
                if reproduces(fold.scale(x) * x.float() * fold.gain, value, dtype):
                    return fold
        return None

    def scale(self, x: Float[Tensor, "b p d_model"]) -> Float[Tensor, "b p 1"]:
        """``r(x)`` per position (from ``x``'s norm, no ``x²`` made)."""
        n = torch.linalg.vector_norm(x.float(), dim=-1, keepdim=True)
        return torch.rsqrt(n * n / x.shape[-1] + self.eps)

    def project(self, x: Float[Tensor, "b p d_model"], proj: torch.nn.Linear, lo: int, hi: int, r: Tensor
                ) -> Float[Tensor, "b p w"]:
        """Rows ``lo:hi`` of ``proj`` applied to the norm of ``x`` (``r``: :meth:`scale` of ``x``)."""
        w = self.folded.get(id(proj))
        if w is None:
            w = self.folded[id(proj)] = (proj.weight.float() * self.gain).to(proj.weight.dtype)
        out = F.linear(x.to(w.dtype), w[lo:hi]) * r.to(w.dtype)
        return out if proj.bias is None else out + proj.bias[lo:hi]


def _input_norm(model: Model, x: Tensor, layer: int, value: Tensor) -> torch.nn.Module | None:
    """The Hugging Face norm of block ``layer`` that maps its input ``x`` to ``value`` (its projections' common input),
    found among the block's norms and checked on ``x``; None where none does (the block is then run)."""
    for module in model.pre_norms(layer):
        try:
            with torch.no_grad():
                got = module(x)
        except (AttributeError, TypeError, RuntimeError):
            continue
        if isinstance(got, Tensor) and got.shape == value.shape and reproduces(got, value, model.dtype):
            return module
    return None


def input_channels(model: Model, prefix: Prefix, layer: int, streams: Sequence[Float[Tensor, "b p d_model"]],
                   wanted: Sequence[Sequence[InputSite]], direct: Direct | None = None, keys: Any = None
                   ) -> list[list[Float[Tensor, "b p w"]]]:
    """For each of ``streams`` (block ``layer``'s input, one batch each), the channels of the input sites ``wanted[j]``
    as the block computes them from that stream: one run of the block on the streams stacked, stopped once the sites'
    hooks (or, with ``direct``, the projections' inputs) have fired; with ``direct`` (:func:`direct_reads` of the
    layer) only the wanted channels, one product over their span per stream and projection. ``keys``: as
    :func:`read_block`'s."""
    b = streams[0].shape[0]
    hooks = sorted({s.hook for sites in wanted for s in sites})
    names = sorted({direct[h][0] for h in hooks}) if direct else hooks
    norm = model.facts.get(NORMS, {}).get(layer) if direct and len(names) == 1 else None
    fold = model.facts.get(FOLDS, {}).get(layer) if norm is not None else None
    if fold is not None:  # an RMS norm: its gain in the projections' rows, its scale on their products
        return [_folded(fold, x, sites, direct) for x, sites in zip(streams, wanted)]
    if norm is not None:  # the projections' input is the block's norm of the stream: that module alone, no block run
        got = {names[0]: norm(torch.cat(list(streams)))}
    else:
        got = read_block(model, prefix, layer, names, len(streams), hidden=torch.cat(list(streams)), keys=keys)
    out: list[list[Tensor]] = []
    for j, sites in enumerate(wanted):
        if not direct:
            out.append([got[s.hook][j * b:(j + 1) * b, :, s.start:s.stop] for s in sites])
            continue
        x = {h_in: v[j * b:(j + 1) * b] for h_in, v in got.items()}
        out.append(_spans(sites, lambda hook, lo, hi: F.linear(
            x[direct[hook][0]], direct[hook][1].weight[lo:hi],
            direct[hook][1].bias[lo:hi] if direct[hook][1].bias is not None else None)))
    return out


def _folded(fold: RMSFold, x: Tensor, sites: Sequence[InputSite], direct: Direct) -> list[Tensor]:
    """The channels of ``sites`` from stream ``x`` through the block's RMS norm ``fold`` (:func:`_spans`)."""
    r = fold.scale(x)
    return _spans(sites, lambda hook, lo, hi: fold.project(x, direct[hook][1], lo, hi, r))


def _spans(sites: Sequence[InputSite], project: Callable[[str, int, int], Tensor]) -> list[Tensor]:
    """The channels of each of ``sites``: per projection (by hook), one product over the span its sites read
    (``project(hook, lo, hi)``: that projection's rows ``lo:hi`` applied to the stream)."""
    values: dict[int, Tensor] = {}
    for hook in dict.fromkeys(s.hook for s in sites):
        mine = [(k, s) for k, s in enumerate(sites) if s.hook == hook]
        lo, hi = min(s.start for _, s in mine), max(s.stop for _, s in mine)
        value = project(hook, lo, hi)
        values.update({k: value[..., s.start - lo:s.stop - lo] for k, s in mine})
    return [values[k] for k in range(len(sites))]


def overwrite(entries: Sequence[tuple[slice, ChannelSpan, Tensor]]) -> Any:
    """A hook that writes each ``(rows, site, value)`` of ``entries`` into those rows of the site's channels of the
    hook's value (``[b, p, w]``, or ``[b, p, h, d]`` counted over the flattened heads): a receiver's input channels
    (an :class:`~gna_interp.models.mixer.InputSite`) or a head's output channels (a
    :class:`~gna_interp.models.mixer.HeadSite`)."""
    def hook(v: Tensor, hook: Any = None) -> Tensor:
        out = v.clone(memory_format=torch.contiguous_format)
        chans = flat(out)
        for rows, s, value in entries:
            chans[rows, :, s.start:s.stop] = value.to(chans.dtype)
        return out
    return hook


@dataclass(frozen=True)
class PostMap:
    """What a block adds to the stream of one part's output ``y`` (its mixers' summed output, or its MLP's):
    ``f(y) = scale · norm(y)``, ``scale · y`` without a norm (the identity where the block adds ``y`` as is)."""

    norm: torch.nn.Module | None = None
    scale: float = 1.0

    def __call__(self, y: Tensor) -> Tensor:
        """``f(y)``."""
        out = y if self.norm is None else self.norm(y)
        return out if self.scale == 1.0 else out * self.scale


def post_maps(model: Model, layer: int) -> tuple[PostMap, PostMap]:
    """The maps of block ``layer`` from its mixers' output (``f``) and from its MLP's (``g``) to the stream, as its
    bridge declares them: the norm after each (``ln1_post`` / ``ln2_post``: Gemma-2/3, OLMo-2) times the block's
    residual scale (``residual_contribution_scale``: Granite)."""
    return PostMap(*model.post_map(layer, "attn")), PostMap(*model.post_map(layer, "mlp"))
