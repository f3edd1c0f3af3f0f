"""`HeadScale` and `scale_heads(model, heads, factor)`: run the model with some heads' outputs multiplied by a factor.

A head's output is the slice of channels it owns at the input of its layer's output projection (where
:func:`~gna_interp.interventions.ablate` cuts it: :meth:`Model.head_site <gna_interp.models.model.Model.head_site>`);
inside the block that slice is ``factor`` times itself. The projection is linear, so the head's write into the
residual stream is scaled by ``factor``: 0 is zero ablation, 1 the intact model, 0.5 half the head, 2 the head
amplified. Weights are never touched; the hooks are removed on exit, exceptions included.
"""

from __future__ import annotations

import math
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import HeadError, InputError
from gna_interp.interventions.ablation import flat_channels
from gna_interp.interventions.base import Intervention
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.mixer import HeadSite, Hook
from gna_interp.models.model import Model, check_model

__all__ = ["HeadScale", "scale_heads"]


@dataclass(frozen=True)
class HeadScale(Intervention):
    """Heads' outputs multiplied by ``factor``, as a value: ``heads`` (HeadRefs, names, or ``"L3H1,L5S2"``) and a
    finite ``factor`` (0: zero ablation; 1: nothing changes)."""

    heads: tuple[HeadRef, ...]
    factor: float = 0.0
    kind: ClassVar[str] = "head_scale"

    def __post_init__(self) -> None:
        if not isinstance(self.heads, (str, HeadRef, Sequence)):
            raise HeadError(f"heads must be a head name, a HeadRef or a list of them, got {type(self.heads).__name__}")
        object.__setattr__(self, "heads", tuple(parse_heads(self.heads)))  # type: ignore[arg-type]
        if isinstance(self.factor, bool) or not isinstance(self.factor, (int, float)) or not math.isfinite(self.factor):
            raise InputError(f"factor must be a finite number (0 removes a head, 1 keeps it), got {self.factor!r}")
        object.__setattr__(self, "factor", float(self.factor))

    def layers(self, model: Model) -> list[int]:
        return sorted({h.layer for h in model.check_heads(list(self.heads))}) if self.heads else []

    def hooks(self, model: Model, stack: ExitStack) -> list[Hook]:
        by_hook: dict[str, list[HeadSite]] = {}
        for head in (model.check_heads(list(self.heads)) if self.heads else []):
            site = model.head_site(head)
            by_hook.setdefault(site.hook, []).append(site)
        return [(name, _scaled(sites, self.factor)) for name, sites in by_hook.items()]

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "heads": [h.name for h in self.heads], "factor": self.factor}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "HeadScale":
        return cls(tuple(fields["heads"]), fields["factor"])


def _scaled(sites: list[HeadSite], factor: float) -> Callable[..., Tensor]:
    """One hook that multiplies the channels of ``sites`` (all at one hook point) by ``factor``."""

    def hook(x: Float[Tensor, "batch pos ..."], hook: Any = None) -> Tensor:
        x = x.clone(memory_format=torch.contiguous_format)  # contiguous: the flat view below writes into x
        flat = flat_channels(x, sites[0])
        for site in sites:
            flat[..., site.columns] *= factor
        return x

    return hook


@contextmanager
def scale_heads(model: Model, heads: str | HeadRef | Sequence[str | HeadRef], factor: float) -> Iterator[list[HeadRef]]:
    """Inside the block, the outputs of ``heads`` of ``model`` are multiplied by ``factor`` in every forward; yields
    the parsed heads. The same as applying ``HeadScale(heads, factor)``."""
    check_model(model, runnable=False)
    value = HeadScale(heads, factor)  # type: ignore[arg-type]
    with value.applied(model):
        yield model.check_heads(list(value.heads))
