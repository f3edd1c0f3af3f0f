"""Interventions as values: *what* a forward changes, apart from *when* it runs.

An :class:`Intervention` is a small frozen value -- :class:`~gna_interp.interventions.ablation.HeadAblation`,
:class:`~gna_interp.interventions.layers.LayerSkip`, :class:`~gna_interp.interventions.masking.PatternMask` -- that

- says which blocks it changes (:meth:`~Intervention.layers`; a replay of the later blocks may start at the first)
  and whether it depends on where each token sits (:attr:`~Intervention.positional`: such a value is written in
  the coordinates of plain left-padded rows, never packed or continued from a cached prompt);
- makes the forward hooks that apply it to a model (:meth:`~Intervention.hooks`), validated against that model;
- writes itself as a plain dict and is read back from one (:meth:`~Intervention.to_dict`, :func:`from_dict`).

:func:`applied` applies a list of them for the duration of a ``with`` block (the hooks are removed on exit,
exceptions included); the context managers :func:`~gna_interp.interventions.ablate`,
:func:`~gna_interp.interventions.skip_layers` and :func:`~gna_interp.interventions.mask_pattern` are that, for one
value each. :class:`~gna_interp.engine.replay.PlanRunner` runs a task's scores under a list of them
(:meth:`~gna_interp.engine.replay.PlanRunner.run_under`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import ExitStack, contextmanager
from typing import Any, ClassVar, Iterator, Mapping, Sequence

from gna_interp.errors import InputError
from gna_interp.models.mixer import Hook
from gna_interp.models.model import Model, check_model

__all__ = ["Intervention", "applied", "from_dict"]

_KINDS: dict[str, type["Intervention"]] = {}


class Intervention(ABC):
    """A change to a model's forward, as a value (see the module docstring). Subclasses set :attr:`kind` (the name
    :meth:`to_dict` writes) and :attr:`positional`, and implement :meth:`layers`, :meth:`hooks`, :meth:`to_dict` and
    :meth:`from_fields`."""

    kind: ClassVar[str]
    positional: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "kind" in cls.__dict__:
            _KINDS[cls.kind] = cls

    @abstractmethod
    def layers(self, model: Model) -> list[int]:
        """The blocks of ``model`` whose computation this changes, sorted (validated against the model)."""

    @abstractmethod
    def hooks(self, model: Model, stack: ExitStack) -> list[Hook]:
        """Forward hooks applying this to ``model``; anything else to undo afterwards goes on ``stack``."""

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """The value as plain data (JSON-ready), with ``"kind"``; :func:`from_dict` reads it back."""

    @classmethod
    @abstractmethod
    def from_fields(cls, fields: Mapping[str, Any]) -> "Intervention":
        """The value from :meth:`to_dict`'s fields (``"kind"`` removed)."""

    def first_layer(self, model: Model) -> int:
        """The earliest block this changes (``model.n_layers`` when none)."""
        return min(self.layers(model), default=model.n_layers)

    def applied(self, model: Model) -> Any:
        """A context manager applying this to every forward of ``model`` inside its block (:func:`applied`)."""
        return applied(model, [self])


def from_dict(data: Mapping[str, Any]) -> Intervention:
    """The :class:`Intervention` that :meth:`~Intervention.to_dict` wrote."""
    if not isinstance(data, Mapping) or "kind" not in data:
        raise InputError(f"an intervention is a dict with a 'kind' (one of {sorted(_KINDS)}), got {data!r:.80}")
    kind = data["kind"]
    if kind not in _KINDS:
        raise InputError(f"unknown intervention kind {kind!r}; known: {sorted(_KINDS)}")
    try:
        return _KINDS[kind].from_fields({k: v for k, v in data.items() if k != "kind"})
    except KeyError as e:
        raise InputError(f"this {kind} intervention has no {e.args[0]!r} field: {dict(data)!r:.120}") from None
    except (TypeError, ValueError, AttributeError, RuntimeError) as e:
        raise InputError(f"this {kind} intervention cannot be read ({type(e).__name__}: {e}): {dict(data)!r:.120}") \
            from None


def check_interventions(values: Any) -> list[Intervention]:
    """``values`` as a list of :class:`Intervention`; a clear error for anything else."""
    if isinstance(values, Intervention):
        return [values]
    if not isinstance(values, Sequence) or isinstance(values, str):
        raise InputError(f"interventions must be a list of Intervention values (HeadAblation, LayerSkip, "
                         f"PatternMask), got {type(values).__name__}")
    bad = [type(v).__name__ for v in values if not isinstance(v, Intervention)]
    if bad:
        raise InputError(f"not interventions: {bad}; pass HeadAblation, LayerSkip or PatternMask values")
    return list(values)


@contextmanager
def applied(model: Model, interventions: Intervention | Sequence[Intervention]) -> Iterator[Model]:
    """Inside the block, every forward of ``model`` runs with ``interventions`` applied (in the order given); yields
    ``model``. Their hooks are removed on exit, exceptions included."""
    check_model(model, runnable=False)
    values = check_interventions(interventions)
    with ExitStack() as stack:
        hooks = [h for v in values for h in v.hooks(model, stack)]
        stack.enter_context(model.hooks(hooks))
        yield model
