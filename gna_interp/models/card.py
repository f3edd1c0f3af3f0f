"""A checkpoint's ``card.json`` (zoo models): read by the loader for the KV keys a model was trained on."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from gna_interp.constants import CARD_JSON
from gna_interp.errors import InputError, ModelPathError


def read_card(path: str | os.PathLike) -> dict[str, Any]:
    """The ``card.json`` of a zoo checkpoint directory."""
    f = Path(path) / CARD_JSON
    if not f.is_file():
        raise InputError(f"{str(path)!r} has no {CARD_JSON}; is it a zoo checkpoint?")
    return json.loads(f.read_text(encoding="utf-8"))


def card_keys(location: str | os.PathLike) -> tuple[str, ...] | None:
    """The KV keys a checkpoint was trained with (``card.json``'s ``keys``), if ``location`` has a card."""
    card = Path(location) / CARD_JSON
    if not card.is_file():
        return None
    try:
        keys = read_card(location).get("keys")
    except ValueError as e:
        raise ModelPathError(f"{str(card)!r} is not valid JSON ({e}); re-train or re-install the zoo model") from e
    return tuple(keys) if keys else None
