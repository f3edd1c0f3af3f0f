"""The mixer adapter: the protocol one head kind implements (the registry of kinds is
:mod:`gna_interp.models.registry`; Hugging Face module helpers are in :mod:`gna_interp.models.hf`).

A mixer adapter holds everything that is specific to one kind of token mixer and its heads:

- how to recognise the mixer in a bridged block (:meth:`MixerAdapter.detect`, giving a
  :class:`~gna_interp.models.arch.LayerSpec`);
- its display letter (``H`` in ``L16H22``), labels and how it is described;
- where a head's output lives: the hook at the input of the layer's output projection and the
  head's flat channels there (:meth:`MixerAdapter.site`), and that projection's weight;
- how to read its heads' patterns (:meth:`MixerAdapter.pattern_hooks`, :meth:`MixerAdapter.pattern`);
- how to restrict its heads' patterns for masking (:meth:`MixerAdapter.mask_hooks`);
- how to reach its mixer where the bridge gives it none of those hooks (:meth:`MixerAdapter.reach_plan`,
  carried out by :mod:`gna_interp.models.reach`: Zamba2's shared attention, Nemotron-H's attention).

Ablation itself is generic: a head's output is a slice of channels at :meth:`site`, replaced by
zero, a mean or resampled values. Adding a kind is one subclass plus
:func:`~gna_interp.models.registry.register_kind`
(``docs/architecture.md`` shows one). Hook names are built by the adapters (and, for the hook points
it adds from their plans, by :mod:`~gna_interp.models.reach`) and by
:class:`~gna_interp.models.model.Model`, nowhere else.

The adapter reads heads, layers, models and batches through the small protocols below (:class:`HeadLike`,
:class:`LayerLike`, :class:`ModelLike`, :class:`BatchLike`), so this module imports none of the modules that
use it.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from dataclasses import field
from typing import Any, Callable, ClassVar, Literal, Protocol

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.options import Options, check_choice, check_int, options



class HeadLike(Protocol):
    """A head as an adapter reads it (:class:`~gna_interp.models.heads.HeadRef`)."""

    head: int
    width: int

    @property
    def name(self) -> str: ...


class LayerLike(Protocol):
    """A layer's mixer as an adapter reads it (:class:`~gna_interp.models.arch.LayerSpec`)."""

    n_heads: int
    head_dim: int
    hf_class: str
    shared_by: tuple[int, ...]


class ModelLike(Protocol):
    """What an adapter reads of a model (:class:`~gna_interp.models.model.Model`)."""

    name: str

    def hf_module(self, path: str) -> torch.nn.Module: ...


class BatchLike(Protocol):
    """A batch of token ids (:class:`~gna_interp.models.model.TokenBatch`)."""

    ids: Tensor
    attention_mask: Tensor


@dataclass(frozen=True)
class ReachPlan:
    """What a mixer adapter needs from a Hugging Face module that no bridge component hooks (carried out by
    :func:`~gna_interp.models.reach.reach_mixers`).

    Attributes:
        name: child name of a new component in the bridge block (``attn``, ``mixer``); ``shared_`` is
            prefixed when the module's weights also run in another block.
        subs: hook component name -> attribute of the Hugging Face module, e.g. ``{"o": "o_proj"}``;
            each gets ``hook_in`` / ``hook_out``.
        pattern: run the attention weights through ``hook_pattern`` (attention modules only).
        required: hooks, relative to a component that already wraps the module, that make reaching
            unnecessary (e.g. ``("hook_pattern", "o.hook_in")``).
    """

    name: str
    subs: dict[str, str] = field(default_factory=dict)
    pattern: bool = False
    required: tuple[str, ...] = ()

Hook = tuple[str, Callable[..., Any]]
# What a receiver head reads, for path patching: query-, key- and value-like inputs, and the rest of what it
# reads from the residual stream (an SSM head's gate and step size; nothing for attention).
INPUTS: tuple[str, ...] = ("q", "k", "v", "other")
FORMS: tuple[str, ...] = ("exact", "attention")
GROUP_REDUCTIONS: tuple[str, ...] = ("mean", "abs_mean")
DEFAULT_BLOCK_ELEMS = 1 << 22

__all__ = ["DEFAULT_BLOCK_ELEMS", "ChannelSpan", "FORMS", "INPUTS", "BatchLike", "HeadLike", "HeadSite", "InputSite", "LayerLike", "MaskOptions",
           "MixerAdapter", "ModelLike", "PatternOptions", "ReachPlan"]


@options
class PatternOptions(Options):
    """How patterns are read.

    Attributes:
        form: SSM implicit attention with the ``Δ_s`` factor (``"exact"``: ``M x + D x`` reproduces the
            scan) or without it (``"attention"``, TransformerLens's ``include_dt_scaling=False``).
            Attention heads ignore it.
        group_reduce: how a group of Mamba-1 channels is reduced: ``"mean"`` of the member matrices
            or ``"abs_mean"`` of their absolute values.
        block_elems: working-set size of the SSM kernel in float32 values (memory / speed trade-off).
        query_block: query rows per SSM kernel block (None: 64 for Mamba-2 heads, 32 for Mamba-1).
    """

    form: Literal["exact", "attention"] = "exact"
    group_reduce: Literal["mean", "abs_mean"] = "mean"
    block_elems: int = DEFAULT_BLOCK_ELEMS
    query_block: int | None = None

    def validate(self) -> None:
        check_choice("form", self.form, FORMS)
        check_choice("group_reduce", self.group_reduce, GROUP_REDUCTIONS)
        check_int("block_elems", self.block_elems, 1)
        check_int("query_block", self.query_block, 1, allow_none=True)


@options
class MaskOptions(Options):
    """How :func:`~gna_interp.interventions.mask_pattern` restricts patterns.

    Attributes:
        renormalize: attention rows rescaled to sum to 1 after masking (rows with no mass left stay 0).
        block_elems, query_block: the SSM kernel's working set (see :class:`PatternOptions`).
    """

    renormalize: bool = False
    block_elems: int = DEFAULT_BLOCK_ELEMS
    query_block: int | None = None

    def validate(self) -> None:
        check_int("block_elems", self.block_elems, 1)
        check_int("query_block", self.query_block, 1, allow_none=True)


class ChannelSpan:
    """A record whose ``start`` / ``stop`` name a head's channels on a tensor's last dimension."""

    start: int
    stop: int

    @property
    def columns(self) -> slice:
        """The head's channels, ``start:stop``."""
        return slice(self.start, self.stop)


@dataclass(frozen=True)
class HeadSite(ChannelSpan):
    """Where one head's output lives: ``hook`` (a hook name at the input of the layer's output
    projection) and the head's flat channels ``start:stop`` out of ``width``."""

    head: HeadLike
    hook: str
    start: int
    stop: int
    width: int


@dataclass(frozen=True)
class InputSite(ChannelSpan):
    """Where a head reads one of its inputs (:data:`INPUTS`): a hook on the output of an input projection and the
    flat channels ``start:stop`` of it that feed the head (for grouped-query attention, the group's K/V channels)."""

    hook: str
    start: int
    stop: int


def shared_note(spec: LayerLike) -> str:
    """``"; shared block: ..."`` when ``spec``'s mixer runs the same weights as mixers of other layers, else ``""``."""
    if not spec.shared_by:
        return ""
    layers = ", ".join(map(str, spec.shared_by))
    return f"; shared block: the same weights run at layers {layers} (its heads are listed at each depth)"


def prepare_mask(mask: Any, head: HeadLike, batch: int, q: int, k: int, device: torch.device) -> Tensor:
    """A mask as float32 ``[batch|1, q, k]``; a clear error when it does not fit this forward or holds
    non-finite values."""
    m = torch.as_tensor(mask, device=device).float()
    ok = m.dim() in (2, 3) and tuple(m.shape[-2:]) == (q, k) and (m.dim() == 2 or m.shape[0] in (1, batch))
    if not ok:
        raise InputError(
            f"mask for {head.name} has shape {tuple(m.shape)} but this forward has {batch} sequence(s) of "
            f"{k} positions: pass [{q}, {k}] (same mask for every sequence) or [{batch}, {q}, {k}]")
    if not torch.isfinite(m).all():
        raise InputError(f"mask for {head.name} holds NaN or infinite values; masks must be finite (0..1)")
    return m if m.dim() == 3 else m[None]


class MixerAdapter:
    """What gna_interp knows about one kind of head. Subclass it and :func:`register_kind` an instance.

    Attributes:
        kind: the kind's name (``HeadRef.kind``), e.g. ``"attn"``.
        letter: one capital letter for display names (``L3H1``); unique among registered kinds.
        title: plural label of the heads, e.g. ``"attention heads"``; ``label`` one of them (``"attention head"``).
        unit: what one head is called when counting, plural (``"query heads"``).
        axis: what one index is called on a heatmap axis (``"query head"``).
        groupable: whether consecutive heads can form one unit (``L3C128+16``).
        default_groups: show a layer as this many equal groups when no heads are named (None: every head).
        normalized_rows: pattern rows are distributions (softmax); otherwise they are shown as
            ``|M| / Σ|M|`` per row.
        splittable_cache: the Hugging Face cache of this mixer can be split per row and continued by
            several tokens (scoring then runs each prompt once and continues the candidates).
        separate_heads: a head's output at :meth:`site` depends on its own input channels alone (its
            :meth:`receiver_inputs`), nothing mixes the heads in between, so gradients from several heads' outputs
            with disjoint inputs can be taken in one product.
    """

    kind: ClassVar[str]
    letter: ClassVar[str]
    title: ClassVar[str]
    label: ClassVar[str] = "head"
    unit: ClassVar[str] = "heads"
    axis: ClassVar[str] = "head"
    groupable: ClassVar[bool] = False
    default_groups: ClassVar[int | None] = None
    normalized_rows: ClassVar[bool] = False
    splittable_cache: ClassVar[bool] = False
    separate_heads: ClassVar[bool] = False

    # ---- detection and description -------------------------------------------------------
    def detect(self, layer: int, name: str, component: Any) -> LayerLike | None:
        """The :class:`LayerSpec` of bridged block child ``name`` if it is this kind's mixer, else None."""
        raise NotImplementedError

    def describe(self, spec: LayerLike) -> str:
        """One line about a layer of this kind (for ``gna models``)."""
        return f"{self.title}: {spec.n_heads} per layer ({spec.hf_class})" + shared_note(spec)

    def reach_plan(self, module: torch.nn.Module) -> ReachPlan | None:
        """For a plain Hugging Face module of a block: a :class:`~gna_interp.models.reach.ReachPlan` (the hook
        points this kind's methods use) if ``module`` is this kind's mixer, else None.

        Asked before detection for every module of every block; where no bridge component already gives
        the module the plan's ``required`` hooks, :func:`~gna_interp.models.reach.reach_mixers` installs
        them, and :meth:`detect` then sees the component. Default: None (the kind is only found bridged).
        """
        return None

    # ---- where a head's output lives -----------------------------------------------------
    def output_hook(self, spec: LayerLike) -> str:
        """The hook at the input of the layer's output projection."""
        raise NotImplementedError

    def site(self, spec: LayerLike, head: HeadLike) -> HeadSite:
        """The output hook and the flat channels ``head`` owns there (``head_dim`` channels per head)."""
        return HeadSite(head, self.output_hook(spec), head.head * spec.head_dim,
                        (head.head + head.width) * spec.head_dim, spec.n_heads * spec.head_dim)

    def output_projection(self, model: ModelLike, spec: LayerLike) -> Float[Tensor, "d_model width"]:
        """Weight ``[d_model, width]`` of the linear map from :meth:`output_hook`'s channels into the residual
        stream (a GPT-2 ``Conv1D`` stores it ``[width, d_model]``: given transposed)."""
        path = self.output_hook(spec).rsplit(".", 1)[0]
        module = model.hf_module(path)
        weight = getattr(module, "weight", None)
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            raise UnsupportedArchitectureError(f"the output projection {path!r} of {model.name} has no 2-D weight")
        return weight.detach().T if type(module).__name__ == "Conv1D" else weight.detach()

    # ---- inputs (path patching) -----------------------------------------------------------
    def receiver_inputs(self, model: ModelLike, spec: LayerLike, head: HeadLike) -> dict[str, list[InputSite]]:
        """For each of :data:`INPUTS`, where ``head`` reads it: hooks on input-projection outputs and channels.

        Path patching recomputes a receiver's output with some of these channels computed from another residual
        stream (:mod:`gna_interp.circuits.edges.paths`). Default: the kind cannot be a receiver."""
        raise UnsupportedArchitectureError(f"heads of kind {self.kind!r} cannot receive path patches "
                                           f"(their inputs are not separable per head)")

    def receiver_isolation(self, model: ModelLike, spec: LayerLike, head: HeadLike) -> InputSite | None:
        """A hook where the other heads of the layer are put back to their clean values when only ``head``'s
        inputs change (the heads meet again after it, e.g. in a Mamba-2 gated norm); None when heads stay
        separate up to :meth:`site`."""
        return None

    # ---- patterns -------------------------------------------------------------------------
    def pattern_hooks(self, spec: LayerLike) -> list[str]:
        """Hook names whose cached values :meth:`pattern` reads."""
        raise NotImplementedError

    def pattern(self, model: ModelLike, spec: LayerLike, cache: Any, heads: list[HeadLike], batch: BatchLike,
                options: PatternOptions) -> Float[Tensor, "batch n q k"]:
        """Patterns ``[batch, n, q, k]`` of ``heads`` (all in layer ``spec``) from the cache."""
        raise NotImplementedError

    # ---- masking --------------------------------------------------------------------------
    def mask_hooks(self, model: ModelLike, spec: LayerLike, masks: dict[HeadLike, Any], stack: ExitStack,
                   options: MaskOptions) -> list[Hook]:
        """Hooks that multiply each head's pattern by its mask in every forward. Extra torch hooks
        this needs are registered here with their removal pushed onto ``stack``."""
        raise UnsupportedArchitectureError(f"heads of kind {self.kind!r} cannot be masked")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(kind={self.kind!r}, letter={self.letter!r})"
