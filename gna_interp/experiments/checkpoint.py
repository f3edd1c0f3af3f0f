"""One checkpoint for every experiment: a settings fingerprint and the finished points, in one JSON file
written atomically (:func:`gna_interp.store.write_json`) as each point finishes.

- :func:`fingerprint` / :func:`settings_fingerprint`: the run key (the model's name, dtype and a weight
  checksum, and the settings; or the settings alone);
- :func:`stale_files`: the up-front rule of ``--resume`` / ``--fresh`` (a folder holding an earlier run's
  checkpoint is refused unless one of them says what to do with it);
- :class:`Checkpoint`: the points of one run, read back only by a run with the same fingerprint.

A checkpoint is kept when its run finishes, as when it is interrupted: a later run into the folder needs
``--resume`` (continue, or rebuild the outputs of a finished run from its points) or ``--fresh``. ``partial: true`` in
the file says it holds points, not a result. ``gna scan`` keeps its own per-head store
(:mod:`gna_interp.circuits.scan.store`).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Iterable

from gna_interp.errors import InputError
from gna_interp.models.model import Model
from gna_interp.run_folder import check_out_dir
from gna_interp.store import read_json, write_json

__all__ = ["FORMAT", "Checkpoint", "fingerprint", "settings_fingerprint", "stale_files"]


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """A hash of ``settings`` (JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def fingerprint(model: Model, settings: dict[str, Any]) -> str:
    """A hash of the model (name, dtype, a weight checksum) and ``settings``: a checkpoint is resumed only
    by the run it belongs to."""
    first = next(model.hf_model.parameters())
    payload = {"model": model.name, "arch": model.architecture, "dtype": str(first.dtype),
               "weights": float(first.detach().double().sum()), **settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def stale_files(out: str | os.PathLike, ckpt: str, resume: bool, fresh: bool, also: Iterable[Path] = ()) -> list[Path]:
    """Refuse an output folder that cannot be one, or that holds a checkpoint when neither ``resume``
    nor ``fresh`` says what to do with it (``gna scan``'s rule); returns the checkpoint files found
    (``ckpt`` in ``out`` and any of ``also`` that exist)."""
    if resume and fresh:
        raise InputError("resume and fresh exclude each other: resume continues the saved points, fresh deletes them")
    out = check_out_dir(out)
    stale = [p for p in [out / ckpt, *also] if p.exists()]
    if stale and not (resume or fresh):
        raise InputError(f"{out} holds the saved points of an earlier run ({', '.join(_rel(p, out) for p in stale)}); "
                         f"--resume continues it (or rebuilds the outputs), --fresh deletes it and starts over, or "
                         f"pick another --out")
    return stale


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return str(path)


FORMAT = "run_checkpoint"


class Checkpoint:
    """Finished points of one run of experiment ``fmt`` (``sweep``, ``prune``, ...), mirrored to a checkpoint
    file (format ``run_checkpoint``, ``partial: true``) as each one finishes; reading it back refuses a
    checkpoint of another experiment or run (other fingerprint). Without a path the points are kept in memory
    only."""

    def __init__(self, path: Path | None, fmt: str, fp: str) -> None:
        self.path, self.fmt, self.fp = path, fmt, fp
        self.points: dict[str, Any] = {}
        self.extra: dict[str, Any] = {}
        if path is not None and path.exists():
            try:
                doc = read_json(path, FORMAT)
            except InputError as e:
                raise InputError(f"checkpoint {str(path)!r} cannot be read: {e}; use --fresh to start over") from e
            if doc.get("experiment") != fmt or doc.get("fingerprint") != fp:
                raise InputError(f"checkpoint {str(path)!r} belongs to a different run, with other settings (model, "
                                 f"heads, task or settings differ); --fresh deletes it and starts over, or pick "
                                 f"another --out")
            self.points = dict(doc.get("points") or {})
            self.extra = dict(doc.get("extra") or {})

    def __contains__(self, key: str) -> bool:
        return key in self.points

    def __getitem__(self, key: str) -> Any:
        return self.points[key]

    def put(self, key: str, value: Any) -> None:
        """Record a finished point and rewrite the checkpoint (atomically)."""
        self.points[key] = value
        self.save()

    def drop(self, key: str) -> None:
        """Forget a recorded point, so that it is measured again, and rewrite the checkpoint."""
        self.points.pop(key, None)
        self.save()

    def save(self) -> None:
        """Write the checkpoint (nothing without a path)."""
        if self.path is not None:
            write_json(self.path, FORMAT, {"partial": True, "experiment": self.fmt, "fingerprint": self.fp,
                                           "points": self.points, "extra": self.extra}, indent=None)

