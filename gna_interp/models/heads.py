"""`HeadRef`: the one name for a unit that can be ablated and has a pattern."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from gna_interp.errors import HeadError

HeadKind = Literal["attn", "ssm2", "ssm1"]
KINDS: tuple[str, ...] = ("attn", "ssm2", "ssm1")
_LETTER = {"attn": "H", "ssm2": "S", "ssm1": "C"}
_KIND_OF_LETTER = {v: k for k, v in _LETTER.items()}
_NAME_RE = re.compile(r"^L(\d+)([HSC])(\d+)(?:\+(\d+))?$")


@dataclass(frozen=True, order=True)
class HeadRef:
    """One head: an attention query head (`attn`), a Mamba-2 head (`ssm2`) or a
    Mamba-1 channel, or a group of `width` consecutive channels (`ssm1`).

    Names: ``L16H22`` (attention), ``L3S5`` (SSM head), ``L35C3186`` (Mamba-1
    channel), ``L35C3184+8`` (channels 3184..3191 treated as one unit).
    """

    layer: int
    head: int
    kind: HeadKind = "attn"
    width: int = 1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise HeadError(f"unknown head kind {self.kind!r}; expected one of {KINDS}")
        if self.layer < 0 or self.head < 0:
            raise HeadError(f"layer and head must be >= 0, got layer={self.layer}, head={self.head}")
        if self.width < 1 or (self.width > 1 and self.kind != "ssm1"):
            raise HeadError(f"width={self.width} is only meaningful (>1) for ssm1 channel groups")

    @property
    def name(self) -> str:
        """Display name, e.g. ``L16H22``; parses back with :meth:`parse`."""
        suffix = f"+{self.width}" if self.width > 1 else ""
        return f"L{self.layer}{_LETTER[self.kind]}{self.head}{suffix}"

    @property
    def channels(self) -> range:
        """Channel indices covered by an ssm1 unit (``range(head, head)`` for one head of other kinds)."""
        return range(self.head, self.head + self.width)

    def __str__(self) -> str:
        return self.name

    @classmethod
    def parse(cls, name: "str | HeadRef") -> "HeadRef":
        """Parse ``L16H22`` / ``L3S5`` / ``L35C3186`` / ``L35C3184+8`` into a HeadRef."""
        if isinstance(name, HeadRef):
            return name
        m = _NAME_RE.match(str(name).strip())
        if m is None:
            raise HeadError(
                f"malformed head name {name!r}: expected L<layer>H<head> (attention), "
                f"L<layer>S<head> (Mamba-2 head) or L<layer>C<channel>[+<width>] (Mamba-1 channel), "
                f"e.g. L16H22, L3S5, L35C3186"
            )
        layer, letter, head, width = m.groups()
        return cls(int(layer), int(head), _KIND_OF_LETTER[letter], int(width) if width else 1)  # type: ignore[arg-type]


def parse_heads(spec: "str | HeadRef | list[str | HeadRef] | tuple[str | HeadRef, ...]") -> list[HeadRef]:
    """Parse a comma-separated string or a list of names/HeadRefs into HeadRefs."""
    if isinstance(spec, (str, HeadRef)):
        items = [s for s in str(spec).split(",") if s.strip()] if isinstance(spec, str) else [spec]
    else:
        items = list(spec)
    return [HeadRef.parse(s) for s in items]
