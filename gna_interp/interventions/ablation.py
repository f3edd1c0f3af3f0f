"""`ablate(model, heads, method)`: run the model with some heads' outputs removed, for every head kind.

Where a head is cut: at the **input of its layer's output projection**, as its kind's adapter says
(:meth:`Model.head_site <gna_interp.models.model.Model.head_site>`) -- ``blocks.{l}.attn.o.hook_in``
(attention, ``[batch, pos, head, d_head]``) or ``blocks.{l}.mixer.out_proj.hook_in`` (Mamba-1 /
Mamba-2 mixers, ``[batch, pos, d_inner]``). A head owns a slice of that input's (flattened) channels:

========  =====================================  ==========================================
kind      channels                               official zero-ablation (weight edit)
========  =====================================  ==========================================
``attn``  ``head*d_head : (head+1)*d_head``      zero those columns of ``o_proj``
``ssm2``  ``head*head_dim : (head+1)*head_dim``  zero that ``head_dim`` slice of ``out_proj``
``ssm1``  ``channel : channel+width``            zero that channel's column of ``out_proj``
========  =====================================  ==========================================

Setting the slice to zero is exactly the official procedure (the projection is linear and the
slice only meets those columns), without touching any weight. Methods:

- ``zero``: the slice becomes 0;
- ``mean``: the slice becomes its mean over every real (non-padding) token of ``reference``;
- ``resample``: row ``b`` of the batch gets the slice from reference row ``b % n_reference``,
  right-aligned (the last positions meet, as left padding aligns prompts); positions the reference
  row does not cover (shorter prompt, padding) get the ``mean`` value.

Hooks live only inside the ``with`` block; they are removed on exit, exceptions included.
"""

from __future__ import annotations

import weakref
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.errors import HeadError, InputError, UnsupportedArchitectureError
from gna_interp.interventions.base import Intervention
from gna_interp.models.heads import HeadRef, parse_heads
from gna_interp.models.mixer import Hook, HeadSite
from gna_interp.models.model import Model, check_model

AblationMethod = Literal["zero", "mean", "resample"]
METHODS: tuple[str, ...] = ("zero", "mean", "resample")

__all__ = ["METHODS", "Ablation", "AblationMethod", "HeadAblation", "Replacement", "ablate", "ablation_hooks",
           "check_method", "flat_channels", "replacements", "stacked_ablation_hooks"]


def flat_channels(x: Tensor, site: HeadSite) -> Tensor:
    """``x`` ([b, p, h, d] or [b, p, h*d]) as a [b, p, width] view."""
    flat = x.flatten(2) if x.dim() == 4 else x
    if flat.dim() != 3 or flat.shape[-1] != site.width:
        raise UnsupportedArchitectureError(
            f"hook {site.hook} carries a tensor of shape {tuple(x.shape)}; expected [batch, pos, {site.width}] "
            f"(or [batch, pos, heads, head_dim]) to ablate {site.head.name}"
        )
    return flat


@dataclass
class Replacement:
    """What replaces one head's slice: zero, a mean vector ``[w]``, or resampled rows ``[r, p_ref, w]``."""

    site: HeadSite
    mean: Float[Tensor, " w"] | None = None
    rows: Float[Tensor, "ref pos w"] | None = None
    row_mask: Tensor | None = None  # [ref, pos] bool, real tokens of the reference rows

    def like(self, z: Float[Tensor, "b p w"]) -> Tensor | float:
        """The replacement for the ``[batch, pos, ...]`` values ``z`` (:meth:`value`), on ``z``'s device and dtype
        (``0.0`` for zero ablation)."""
        value = self.value(z.shape[0], z.shape[1])
        return value.to(z.device, z.dtype) if isinstance(value, Tensor) else value

    def value(self, batch: int, pos: int) -> Tensor | float:
        """The replacement for a ``[batch, pos, w]`` slice (row ``i`` reads reference row ``i % ref``)."""
        if self.rows is None:
            return 0.0 if self.mean is None else self.mean
        assert self.mean is not None and self.row_mask is not None
        n_ref, p_ref, w = self.rows.shape
        idx = torch.arange(batch, device=self.rows.device) % n_ref
        src, ok = self.rows[idx], self.row_mask[idx]
        out = self.mean.expand(batch, pos, w).clone()
        n = min(pos, p_ref)
        take = ok[:, p_ref - n:, None]
        out[:, pos - n:] = torch.where(take, src[:, p_ref - n:], out[:, pos - n:])
        return out


def check_method(method: str, reference: Any) -> None:
    """Refuse an unknown ablation ``method``, or a ``reference`` it does not take (zero) or needs (mean, resample)."""
    if method not in METHODS:
        raise InputError(f"unknown ablation method {method!r}; choose one of {METHODS}")
    if method == "zero" and reference is not None:
        raise InputError("zero ablation takes no reference; pass reference=... only with method='mean' or 'resample'")
    if method != "zero" and reference is None:
        raise InputError(f"method={method!r} needs a reference batch (prompts, a TokenBatch or a Task) "
                         f"whose activations replace the ablated heads' outputs")


def replacements(model: Model, heads: str | HeadRef | Sequence[str | HeadRef], method: AblationMethod = "zero",
                 reference: Any = None) -> list[Replacement]:
    """Validate ``heads`` (names, ``"L0H1,L2S3"`` or HeadRefs) and compute what replaces each one's output
    (one reference forward at most)."""
    check_method(method, reference)
    if not isinstance(heads, (str, HeadRef, Sequence)):
        raise HeadError(f"heads must be a head name, a HeadRef or a list of them, got {type(heads).__name__}")
    sites = [model.head_site(h) for h in dict.fromkeys(model.check_heads(heads))]
    if method == "zero" or not sites:
        return [Replacement(s) for s in sites]
    names = sorted({s.hook for s in sites})
    if method == "mean":  # the model keeps the means of one reference
        means = model.mean_activations(reference, names)
        return [Replacement(s, mean=means[s.hook][s.columns]) for s in sites]
    prompts = getattr(reference, "prompts", None)  # a Task
    batch = model.as_batch(list(prompts) if prompts is not None else reference)
    _, cache = model.run_with_cache(batch, names_filter=lambda n: n in names)
    mask = batch.attention_mask.bool()
    out = []
    for s in sites:
        act = flat_channels(cache[s.hook], s)[..., s.columns].float()
        out.append(Replacement(s, mean=act[mask].mean(0), rows=act, row_mask=mask))
    return out


def ablation_hooks(replaced: Sequence[Replacement], rows: slice | None = None) -> list[tuple[str, Callable[..., Tensor]]]:
    """TransformerLens forward hooks applying ``replaced``; with ``rows``, only those batch rows are
    touched (for resampling, the first of them counts as row 0)."""
    return _hooks([(rows, list(replaced))])


def stacked_ablation_hooks(sets: Sequence[Sequence[Replacement]], batch: int
                           ) -> list[tuple[str, Callable[..., Tensor]]]:
    """Forward hooks for ``len(sets)`` copies of a batch of ``batch`` rows stacked in one forward: copy ``g`` (rows
    ``g*batch..(g+1)*batch-1``) gets ``sets[g]`` applied, as :func:`ablation_hooks` with those ``rows`` would. One
    hook a hook point, which copies the tensor once whatever the number of sets that cut there."""
    return _hooks([(slice(g * batch, (g + 1) * batch), list(group)) for g, group in enumerate(sets)])


def _hooks(parts: Sequence[tuple[slice | None, list[Replacement]]]) -> list[tuple[str, Callable[..., Tensor]]]:
    """One hook per hook point, applying each part's replacements to its rows (None: every row)."""
    by_hook: dict[str, list[tuple[slice | None, list[Replacement]]]] = {}
    for rows, replaced in parts:
        grouped: dict[str, list[Replacement]] = {}
        for r in replaced:
            grouped.setdefault(r.site.hook, []).append(r)
        for name, entries in grouped.items():
            by_hook.setdefault(name, []).append((rows, entries))

    def make(entries: list[tuple[slice | None, list[Replacement]]]) -> Callable[..., Tensor]:
        def hook(x: Tensor, hook: Any = None) -> Tensor:
            x = x.clone(memory_format=torch.contiguous_format)  # contiguous: the flat view below writes into x
            flat = flat_channels(x, entries[0][1][0].site)
            for rows, replaced in entries:
                part = flat if rows is None else flat[rows]
                for r in replaced:
                    val = r.value(part.shape[0], part.shape[1])
                    part[..., r.site.columns] = val.to(part.device, part.dtype) if isinstance(val, Tensor) else val
            return x

        return hook

    return [(name, make(entries)) for name, entries in by_hook.items()]


@dataclass(frozen=True, eq=False)
class HeadAblation(Intervention):
    """Heads removed together, as a value: ``heads`` (HeadRefs, names, or ``"L3H1,L5S2"``) with ``method``
    ``zero``, ``mean`` or ``resample`` and, for the last two, the ``reference`` (prompts, a TokenBatch or a Task) whose
    activations replace theirs. What replaces each head is computed once per model (:meth:`replacements`).
    :meth:`to_dict` writes a reference of prompts as their list (a Task as its prompts); a TokenBatch cannot be
    written."""

    heads: tuple[HeadRef, ...]
    method: AblationMethod = "zero"
    reference: Any = None
    _cache: Any = field(default_factory=weakref.WeakKeyDictionary, repr=False, compare=False)
    kind: ClassVar[str] = "head_ablation"

    def __post_init__(self) -> None:
        check_method(self.method, self.reference)
        if not isinstance(self.heads, (str, HeadRef, Sequence)):
            raise HeadError(f"heads must be a head name, a HeadRef or a list of them, got {type(self.heads).__name__}")
        object.__setattr__(self, "heads", tuple(parse_heads(self.heads)))  # type: ignore[arg-type]

    @property
    def positional(self) -> bool:  # type: ignore[override]
        """Resampling aligns reference rows with the forward's rows: it needs plain left-padded rows."""
        return self.method == "resample"

    def replacements(self, model: Model) -> list[Replacement]:
        """What replaces each head's output in ``model`` (validated; computed on first use, then kept)."""
        if model not in self._cache:
            self._cache[model] = replacements(model, list(self.heads), self.method, self.reference)
        return self._cache[model]

    def layers(self, model: Model) -> list[int]:
        return sorted({h.layer for h in model.check_heads(list(self.heads))}) if self.heads else []

    def hooks(self, model: Model, stack: ExitStack) -> list[Hook]:
        return ablation_hooks(self.replacements(model)) if self.heads else []

    def to_dict(self) -> dict[str, Any]:
        ref = self.reference
        if ref is not None:
            prompts = getattr(ref, "prompts", ref)
            if isinstance(prompts, str) or not isinstance(prompts, Sequence) or \
                    not all(isinstance(p, str) for p in prompts):
                raise InputError(f"a {self.method} ablation whose reference is a {type(ref).__name__} cannot be "
                                 f"written; give the reference as a list of prompts")
            ref = list(prompts)
        return {"kind": self.kind, "heads": [h.name for h in self.heads], "method": self.method, "reference": ref}

    @classmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "HeadAblation":
        return cls(tuple(fields["heads"]), fields.get("method", "zero"), fields.get("reference"))


class Ablation:
    """What :func:`ablate` returns: heads removed while inside ``with``, a value you can name, pass around and enter
    again once the block is left. The heads are validated (and mean / resample values computed) when it is made;
    :attr:`intervention` is the :class:`HeadAblation` it applies."""

    def __init__(self, model: Model, heads: str | HeadRef | Sequence[str | HeadRef], method: AblationMethod = "zero",
                 reference: Any = None) -> None:
        self.model = model
        self.intervention = HeadAblation(heads, method, reference)  # type: ignore[arg-type]
        self.replaced = self.intervention.replacements(model)
        self.heads = [r.site.head for r in self.replaced]
        self._active: Any = None

    def __enter__(self) -> list[HeadRef]:
        if self._active is not None:
            raise InputError(f"this ablation of {', '.join(h.name for h in self.heads) or 'no heads'} is already "
                             f"active: leave its `with` block before entering it again (or make a second ablate(...))")
        active = self.intervention.applied(self.model)
        active.__enter__()
        self._active = active
        return list(self.heads)

    def __exit__(self, *exc: Any) -> Any:
        active, self._active = self._active, None
        return active.__exit__(*exc) if active is not None else None

    def __repr__(self) -> str:
        return f"Ablation({', '.join(h.name for h in self.heads)}; {'active' if self._active else 'inactive'})"


def ablate(model: Model, heads: str | HeadRef | Sequence[str | HeadRef], method: AblationMethod = "zero",
           reference: Any = None) -> Ablation:
    """Inside the block, ``heads`` of ``model`` are ablated in every forward; ``with`` gives the parsed heads.

    ``heads`` are HeadRefs or names (``"L3H1,L5S2"``); ``method`` is ``zero``, ``mean`` or
    ``resample``; ``reference`` (prompts, ids, a TokenBatch or a Task) supplies the activations for
    ``mean``/``resample``. Zero ablation equals zeroing the heads' output-projection columns. The
    :class:`Ablation` returned can be entered again after its block, not inside it; hooks are removed on exit,
    exceptions included.
    """
    check_model(model, runnable=False)
    return Ablation(model, heads, method, reference)
