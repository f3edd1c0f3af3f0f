"""The registry of head kinds: one :class:`~gna_interp.models.mixer.MixerAdapter` per kind, asked by the rest of
the package (detection, names, patterns, ablation, masking). :func:`register_kind` adds a kind."""

from __future__ import annotations

import re

from gna_interp.errors import HeadError
from gna_interp.models.mixer import MixerAdapter
from gna_interp.registry import Registry

__all__ = ["adapter", "kind_of_letter", "kinds", "register_kind", "registered", "unregister_kind"]

_REGISTRY: Registry[MixerAdapter] = Registry("head kind", HeadError)


def register_kind(adapter_: MixerAdapter) -> MixerAdapter:
    """Make a head kind known to gna_interp (detection, names, patterns, ablation, masking); returns it.

    Models loaded afterwards list the kind's heads. A kind or letter already taken is refused.
    """
    kind, letter = getattr(adapter_, "kind", None), getattr(adapter_, "letter", None)
    if not isinstance(letter, str) or not re.fullmatch(r"[A-Z]", letter):
        raise HeadError(f"head kind {kind!r} needs a single capital display letter, got {letter!r}")
    taken = [a.kind for a in _REGISTRY.entries() if a.letter == letter and a.kind != kind]
    if taken:
        raise HeadError(f"display letter {letter!r} is already used by head kind {taken[0]!r}")
    return _REGISTRY.add(kind, adapter_)


def unregister_kind(kind: str) -> None:
    """Forget a registered head kind (models already loaded keep their layer list)."""
    _REGISTRY.remove(kind)


def kinds() -> tuple[str, ...]:
    """Registered head kinds, in registration (detection) order."""
    return _REGISTRY.names()


def adapter(kind: str) -> MixerAdapter:
    """The adapter of a registered head kind; a clear error for an unknown one."""
    return _REGISTRY.get(kind)


def kind_of_letter(letter: str) -> str | None:
    """The registered kind displayed with ``letter`` (``H`` -> ``attn``), or None."""
    return next((a.kind for a in _REGISTRY.entries() if a.letter == letter), None)


def registered() -> list[MixerAdapter]:
    """The registered adapters, in registration (detection) order."""
    return _REGISTRY.entries()
