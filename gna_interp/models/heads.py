"""`HeadRef`: the one name for a unit that can be ablated and has a pattern."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from gna_interp.errors import HeadError
from gna_interp.models.registry import adapter, kind_of_letter, kinds, registered
from gna_interp.models.mixer import MixerAdapter

HeadKind = str
_NAME_RE = re.compile(r"L([0-9]+)([A-Z])([0-9]+)(?:\+([0-9]+))?")  # ASCII digits only: L٠H٣ is not L0H3
_MAX_DIGITS = 9  # no model has a billion layers or heads; a longer number is a typo (or an attack on int())


@dataclass(frozen=True, order=True)
class HeadRef:
    """One head: an attention query head (`attn`), a Mamba-2 head (`ssm2`), a Mamba-1 channel or a
    group of `width` consecutive channels (`ssm1`), or a head of any kind registered with
    :func:`~gna_interp.models.registry.register_kind`. ``kind`` defaults to the first registered kind (attention).

    Names: ``L16H22`` (attention), ``L3S5`` (SSM head), ``L35C3186`` (Mamba-1
    channel), ``L35C3184+8`` (channels 3184..3191 treated as one unit); the letter is the kind's.
    """

    layer: int
    head: int
    kind: HeadKind = ""
    width: int = 1

    def __post_init__(self) -> None:
        if self.kind == "":
            object.__setattr__(self, "kind", kinds()[0])
        for name in ("layer", "head", "width"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise HeadError(f"{name} must be an integer, got {v!r}")
        kind = adapter(self.kind)
        if self.layer < 0 or self.head < 0:
            raise HeadError(f"layer and head must be >= 0, got layer={self.layer}, head={self.head}")
        if self.width < 1 or (self.width > 1 and not kind.groupable):
            groupable = [k for k in kinds() if adapter(k).groupable]
            raise HeadError(f"width={self.width} is only meaningful (>1) for groupable kinds {groupable}")

    @property
    def adapter(self) -> MixerAdapter:
        """The mixer adapter of this head's kind (labels, hooks, patterns, masking)."""
        return adapter(self.kind)

    @property
    def name(self) -> str:
        """Display name, e.g. ``L16H22``; parses back with :meth:`parse`."""
        suffix = f"+{self.width}" if self.width > 1 else ""
        return f"L{self.layer}{self.adapter.letter}{self.head}{suffix}"

    @property
    def channels(self) -> range:
        """Unit indices covered: ``head .. head + width - 1`` (one index unless a group)."""
        return range(self.head, self.head + self.width)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: "str | HeadRef") -> "HeadRef":
        """Parse ``L16H22`` / ``L3S5`` / ``L35C3186`` / ``L35C3184+8`` (the letter names a registered kind)."""
        if isinstance(name, HeadRef):
            return name
        m = _NAME_RE.fullmatch(name.strip()) if isinstance(name, str) else None
        kind = kind_of_letter(m.group(2)) if m else None
        if m is not None and max(len(g) for g in m.groups() if g) > _MAX_DIGITS:
            raise HeadError(f"head name {name[:40]!r}{'...' if len(name) > 40 else ''}: a number with more than "
                            f"{_MAX_DIGITS} digits is no layer, head or width of any model")
        if m is None or kind is None:
            forms = ", ".join(f"L<layer>{a.letter}<index>{'[+<width>]' if a.groupable else ''} ({a.label})"
                              for a in registered())
            examples = ", ".join(f"L3{a.letter}1" for a in registered())
            raise HeadError(f"malformed head name {name!r}: expected one of {forms}, e.g. {examples}")
        layer, _, head, width = m.groups()
        return cls(int(layer), int(head), kind, int(width) if width else 1)


def parse_heads(spec: "str | HeadRef | list[str | HeadRef] | tuple[str | HeadRef, ...]") -> list[HeadRef]:
    """Parse a comma-separated string or a list of names/HeadRefs into HeadRefs, in the order given.

    A head named twice (``L1H2,L1H2``, or ``L1H2`` and ``HeadRef(1, 2)``) is an error naming it: a list of
    heads is a set, and a repeat is a typo that would be drawn, counted or removed twice.
    """
    if isinstance(spec, str):
        items: list[str | HeadRef] = [s for s in spec.split(",") if s.strip()]
        if not items:
            raise HeadError(f"no head names in {spec!r}: pass names like 'L3H1,L5S2'")
        if len(items) != len(spec.split(",")):
            raise HeadError(f"an empty name between commas in {spec[:80]!r}: pass names like 'L3H1,L5S2'")
    elif isinstance(spec, HeadRef):
        items = [spec]
    elif isinstance(spec, Sequence):
        items = list(spec)
    else:
        raise HeadError(f"heads must be a head name, a HeadRef or a list of them, got {type(spec).__name__}")
    heads = [HeadRef.parse(s) for s in items]
    seen: set[HeadRef] = set()
    for h in heads:
        if h in seen:
            raise HeadError(f"{h.name} is named twice in the heads {_shown(spec)}; name each head once")
        seen.add(h)
    return heads


def _shown(spec: object) -> str:
    """A head list as quoted in a message (long lists cut)."""
    text = spec if isinstance(spec, str) else ",".join(str(s) for s in spec)  # type: ignore[union-attr]
    return repr(text if len(text) <= 80 else text[:77] + "...")
