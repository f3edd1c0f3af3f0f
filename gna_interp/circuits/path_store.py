"""Saving and loading :class:`~gna_interp.circuits.paths.PathEffects`: a strict-JSON ``path_effects`` document.

The document holds the metric, the interval level, the intact model's per-sample results and, per edge set, its
edges (``sender``, ``receiver`` or null for a direct edge, ``input``, ``positions``) and its per-sample results, so
:meth:`~gna_interp.circuits.paths.PathEffects.effects`, ``intervals()`` and ``to_frame()`` read the same numbers
after a round trip.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gna_interp.circuits.paths import Edge, PathEffects
from gna_interp.circuits.scan.result import results_from_json, results_to_json
from gna_interp.constants import PATH_EFFECTS_JSON
from gna_interp.errors import InputError
from gna_interp.store import file_in, read_json, write_json

FORMAT = "path_effects"

__all__ = ["FORMAT", "load_path_effects", "path_effects_from_dict", "path_effects_to_dict", "save_path_effects"]


def _edge_to_dict(e: Edge) -> dict[str, Any]:
    return {"sender": e.sender.name, "receiver": e.receiver.name if e.receiver else None, "input": e.input,
            "positions": e.positions}


def path_effects_to_dict(effects: PathEffects) -> dict[str, Any]:
    """``effects`` as JSON-able data (per-sample results as lists; :func:`path_effects_from_dict` reads it back)."""
    return {"metric": effects.metric, "level": effects.level, "baseline": results_to_json(effects.baseline),
            "sets": [{"edges": [_edge_to_dict(e) for e in es], "results": results_to_json(r)}
                     for es, r in zip(effects.sets, effects.patched)]}


def path_effects_from_dict(d: dict[str, Any], where: str = "path effects") -> PathEffects:
    """The :class:`PathEffects` :func:`path_effects_to_dict` described; :class:`InputError` (naming ``where``) for a
    malformed body."""
    try:
        sets = [[Edge(e["sender"], e["receiver"], e["input"], e["positions"]) for e in s["edges"]] for s in d["sets"]]
        patched = [results_from_json(s["results"]) for s in d["sets"]]
        out = PathEffects(str(d["metric"]), results_from_json(d["baseline"]), sets, patched, float(d["level"]))
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{where}: not a path-effects document ({type(e).__name__}: {str(e)[:120]})") from None
    n = {len(v) for r in (out.baseline, *out.patched) for v in r.values()}
    if len(n) > 1:
        raise InputError(f"{where}: per-sample lists differ in length ({sorted(n)})")
    return out


def save_path_effects(effects: PathEffects, path: str | os.PathLike) -> Path:
    """Write ``effects`` to ``path`` (a ``.json`` file, or a folder: its ``path_effects.json``), atomically; return
    the file."""
    return write_json(file_in(path, PATH_EFFECTS_JSON), FORMAT, path_effects_to_dict(effects))


def load_path_effects(path: str | os.PathLike) -> PathEffects:
    """Read what :func:`save_path_effects` wrote (the file, or the folder holding it)."""
    p = file_in(path, PATH_EFFECTS_JSON)
    return path_effects_from_dict(read_json(p, FORMAT), str(p))
