"""The registry of head kinds: one :class:`~gna_interp.models.mixer.MixerAdapter` per kind, asked by the rest of
the package (detection, names, patterns, ablation, masking). :func:`register_kind` adds a kind."""

from __future__ import annotations

import re

from gna_interp.errors import HeadError
from gna_interp.models.mixer import MixerAdapter

__all__ = ["adapter", "kind_of_letter", "kinds", "register_kind", "registered", "unregister_kind"]

_REGISTRY: dict[str, MixerAdapter] = {}


def register_kind(adapter_: MixerAdapter) -> MixerAdapter:
    """Make a head kind known to gna_interp (detection, names, patterns, ablation, masking); returns it.

    Models loaded afterwards list the kind's heads. A kind or letter already taken is refused.
    """
    kind, letter = getattr(adapter_, "kind", None), getattr(adapter_, "letter", None)
    if not isinstance(kind, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", kind):
        raise HeadError(f"a head kind needs a lower-case name, got {kind!r}")
    if not isinstance(letter, str) or not re.fullmatch(r"[A-Z]", letter):
        raise HeadError(f"head kind {kind!r} needs a single capital display letter, got {letter!r}")
    if kind in _REGISTRY:
        raise HeadError(f"head kind {kind!r} is already registered ({_REGISTRY[kind]!r})")
    taken = [a.kind for a in _REGISTRY.values() if a.letter == letter]
    if taken:
        raise HeadError(f"display letter {letter!r} is already used by head kind {taken[0]!r}")
    _REGISTRY[kind] = adapter_
    return adapter_


def unregister_kind(kind: str) -> None:
    """Forget a registered head kind (models already loaded keep their layer list)."""
    if _REGISTRY.pop(kind, None) is None:
        raise HeadError(f"head kind {kind!r} is not registered; registered: {kinds()}")


def kinds() -> tuple[str, ...]:
    """Registered head kinds, in registration (detection) order."""
    return tuple(_REGISTRY)


def adapter(kind: str) -> MixerAdapter:
    """The adapter of a registered head kind; a clear error for an unknown one."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise HeadError(f"unknown head kind {kind!r}; registered kinds: {kinds()}") from None


def kind_of_letter(letter: str) -> str | None:
    """The registered kind displayed with ``letter`` (``H`` -> ``attn``), or None."""
    return next((a.kind for a in _REGISTRY.values() if a.letter == letter), None)


def registered() -> list[MixerAdapter]:
    """The registered adapters, in registration (detection) order."""
    return list(_REGISTRY.values())
