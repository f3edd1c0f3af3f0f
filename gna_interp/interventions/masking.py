"""`PatternMask` and `mask_pattern(model, {head: mask})`: run the model with some heads' mixing patterns masked.

This is how the G&A paper keeps "only the Gather-and-Aggregate pattern" alive in a head.

- **Attention head** (``L1H2``): the post-softmax pattern of that head is multiplied by the mask;
  with ``renormalize=True`` each masked row is rescaled to sum to 1 again (rows whose mass is all
  masked stay zero).
- **SSM head** (Mamba-2 ``L0S1``) or **channel / channel group** (Mamba-1 ``L0C5``, ``L0C8+4``):
  the unit's scan output is replaced by ``(M ⊙ mask) x + D x`` with ``M`` its exact implicit
  attention. ``renormalize`` does not apply (``M`` is not a distribution).

How each kind does it is its adapter's business (:meth:`MixerAdapter.mask_hooks
<gna_interp.models.mixer.MixerAdapter.mask_hooks>`; see :mod:`gna_interp.models.attention` and
:mod:`gna_interp.models.ssm`). A mask is a tensor broadcastable to ``[batch, q, k]`` in the coordinates
of the forward pass that runs inside the block (``[T, T]`` for every sequence, or ``[batch, T, T]``;
with left padding, position ``T-1`` is every prompt's last token). Entries above the diagonal have
no effect. A wrong shape or a non-finite value raises :class:`~gna_interp.errors.InputError` when the
forward reaches the head.

The hooks are temporary: they are removed when the block exits, exception or not, and the weights
are never touched.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar, Iterator, Mapping

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import HeadError, InputError
from gna_interp.interventions.base import Intervention
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import Hook, MaskOptions
from gna_interp.models.model import Model, check_model

__all__ = ["MaskOptions", "PatternMask", "mask_pattern"]

MaskLike = Float[Tensor, "*batch q k"]


@dataclass(frozen=True, eq=False)
class PatternMask(Intervention):
    """Heads' mixing patterns masked, as a value: ``masks`` maps heads (``HeadRef`` or names) to masks broadcastable
    to ``[batch, q, k]`` in the coordinates of the forward they apply to (plain left-padded rows:
    :attr:`positional`), with ``options`` (:class:`~gna_interp.models.mixer.MaskOptions`). :meth:`to_dict` writes
    each mask as nested lists."""

    masks: Mapping[HeadRef | str, MaskLike]
    options: MaskOptions = field(default_factory=MaskOptions)
    kind: ClassVar[str] = "pattern_mask"
    positional: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if not isinstance(self.masks, Mapping):
            raise HeadError(f"masks must be a mapping {{head: mask}}, got {type(self.masks).__name__}")
        if not isinstance(self.options, MaskOptions):
            raise InputError(f"options must be MaskOptions, got {type(self.options).__name__}")

    def _by_layer(self, model: Model) -> dict[tuple[int, str], dict[HeadRef, Any]]:
        """The masks checked against ``model`` and grouped by layer and kind."""
        by_layer: dict[tuple[int, str], dict[HeadRef, Any]] = {}
        for key, mask in self.masks.items():
            h = model.check_head(key)
            group = by_layer.setdefault((h.layer, h.kind), {})
            if h in group:
                raise HeadError(f"{h.name} is given twice in the masks")
            overlap = [o.name for o in group if set(o.channels) & set(h.channels)]
            if overlap:
                raise HeadError(f"{h.name} overlaps {overlap}: a channel can carry only one mask")
            if isinstance(mask, torch.Tensor) and mask.is_floating_point() and not bool(torch.isfinite(mask).all()):
                bad = int((~torch.isfinite(mask)).sum())
                raise InputError(f"the mask of {h.name} holds {bad} NaN or infinite value(s); a mask must be finite "
                                 f"(0 removes a position, 1 keeps it)")
            group[h] = mask
        return by_layer

    def layers(self, model: Model) -> list[int]:
        return sorted({layer for layer, _ in self._by_layer(model)})

    def hooks(self, model: Model, stack: ExitStack) -> list[Hook]:
        out: list[Hook] = []
        for (layer, kind), heads in sorted(self._by_layer(model).items()):
            spec = model.layer_spec(layer, kind)
            out.extend(spec.adapter.mask_hooks(model, spec, heads, stack, self.options))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "masks": {HeadRef.parse(h).name: torch.as_tensor(m).tolist()
                                             for h, m in self.masks.items()},
                "options": self.options.to_dict()}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "PatternMask":
        return cls({h: torch.tensor(m, dtype=torch.float32) for h, m in fields["masks"].items()},
                   MaskOptions.build(None, **fields.get("options", {})))


@contextmanager
def mask_pattern(model: Model, masks: Mapping[HeadRef | str, MaskLike], options: MaskOptions | None = None,
                 **overrides: Any) -> Iterator[Model]:
    """Inside the block, each head's pattern is multiplied by its mask; yields ``model``.

    ``masks`` maps heads (``HeadRef`` or names like ``L1H2``, ``L0S1``, ``L0C8+4``) to masks
    broadcastable to ``[batch, q, k]``. Attention: post-softmax pattern ``* mask`` (rows rescaled
    to sum 1 with ``renormalize=True``). SSM heads/channels: scan output ``(M ⊙ mask) x + D x``.
    ``options`` (:class:`~gna_interp.models.mixer.MaskOptions`) or keyword overrides of its fields.
    The same as applying :class:`PatternMask`. All hooks are removed on exit, exceptions included.
    """
    check_model(model, runnable=False)
    with PatternMask(masks, MaskOptions.build(options, **overrides)).applied(model):
        yield model
