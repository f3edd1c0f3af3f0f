"""Saving and loading :class:`~gna_interp.circuits.edges.paths.PathEffects` as functions: a strict-JSON ``path_effects``
document, written and read by the result's own :meth:`~gna_interp.circuits.edges.paths.PathEffects.save` /
:meth:`~gna_interp.circuits.edges.paths.PathEffects.load` (and ``to_dict`` / ``from_dict``), which these call.

The document holds the metric, the interval level, the intact model's per-sample results and, per edge set, its
edges (``sender``, ``receiver`` or null for a direct edge, ``input``, ``positions``) and its per-sample results, so
:meth:`~gna_interp.circuits.edges.paths.PathEffects.effects`, ``intervals()`` and ``to_frame()`` read the same numbers
after a round trip.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gna_interp.circuits.edges.paths import EFFECTS_FORMAT, PathEffects

FORMAT = EFFECTS_FORMAT

__all__ = ["FORMAT", "load_path_effects", "path_effects_from_dict", "path_effects_to_dict", "save_path_effects"]


def path_effects_to_dict(effects: PathEffects) -> dict[str, Any]:
    """``effects`` as JSON-able data (:meth:`PathEffects.to_dict`; :func:`path_effects_from_dict` reads it back)."""
    return effects.to_dict()


def path_effects_from_dict(d: dict[str, Any], where: str = "path effects") -> PathEffects:
    """The :class:`PathEffects` :func:`path_effects_to_dict` described (:meth:`PathEffects.from_dict`);
    :class:`~gna_interp.errors.InputError` (naming ``where``) for a malformed body."""
    return PathEffects.from_dict(d, where)


def save_path_effects(effects: PathEffects, path: str | os.PathLike) -> Path:
    """Write ``effects`` to ``path`` (a ``.json`` file, or a folder: its ``path_effects.json``), atomically; return
    the file (:meth:`PathEffects.save`)."""
    return effects.save(path)


def load_path_effects(path: str | os.PathLike) -> PathEffects:
    """Read what :func:`save_path_effects` wrote (the file, or the folder holding it; :meth:`PathEffects.load`)."""
    return PathEffects.load(path)
