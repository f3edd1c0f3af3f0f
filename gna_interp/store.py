"""The on-disk formats of gna_interp's results, in one place.

Every file a result writes goes through here: JSON documents and tensor bundles carry a ``format``
(what the file is) and a ``format_version``; every write is atomic (a temporary file in the same
folder, flushed, then ``os.replace``), so a reader never sees half a file; JSON is strict (``NaN`` and
infinities become ``null``); readers refuse a file of another kind or of an unknown version and say
what they found.

=================  =========================================  ===========================
format             file                                        written by
=================  =========================================  ===========================
``scan``           ``scan.json`` (per-sample results)          ``HeadScan.save``
``checkpoint``     ``scan.ckpt.json`` (a scan in progress)     ``scan_heads(checkpoint=)``
``circuit``        ``circuit.json``                            ``Circuit.save``
``views``          ``views.pt`` (card patterns + segments)     ``Circuit.save``
``patterns``       any ``.pt``                                 ``PatternSet.save``
``comparison``     ``compare.json``                            ``gna compare-circuits``
``eval`` ...       ``NAME.json`` of an experiment folder       ``experiments.output.ResultFolder``
                   (``eval``, ``prune``, ``mask``, ``sweep``,
                   ``families``)
``hybrid_plan``    ``hybrid_plan.json``                        ``HybridPlan.save``, ``gna hybrid plan``
``delegation``     ``delegation.json``                         ``Delegation.save`` (in a hybrid's scan folder)
``hybrid_build``   ``hybrid_build.json`` (and its ``.ckpt``)   ``gna hybrid build`` (``experiments.hybrid_build``)
``interactions``   ``interactions.json``                       ``Interactions.save``
``path_effects``   ``path_effects.json``                       ``PathEffects.save``
``evaluation``     ``evaluation.json``                         ``Evaluation.save``
``calibration``    ``calibration.json``                        ``Calibration.save``
``faithfulness``   ``faithfulness.json``,                      ``Faithfulness.save`` (``gna circuit``)
                   ``edge_faithfulness.json``
``circuit_run``    ``circuit_run.json`` (the stages done)      ``gna circuit`` (``experiments.sufficiency_run``)
=================  =========================================  ===========================

``scan.csv`` (the ranked table, for people and spreadsheets) and ``summary.md`` are written atomically
as well. Every read checks the document against its schema (:mod:`gna_interp.schemas`: types, ranges, finite
numbers); the files of one saved circuit carry the same ``run_id`` (circuit format 2), so a folder that mixes
two runs is caught by ``Circuit.load``.
"""

from __future__ import annotations

import io
import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

from gna_interp.errors import InputError

FORMAT_VERSIONS: dict[str, int] = {"scan": 1, "checkpoint": 3, "circuit": 2, "views": 1, "patterns": 1,
                                   "comparison": 1, "eval": 1, "prune": 1, "mask": 1, "sweep": 1, "families": 1,
                                   "hybrid_plan": 1, "delegation": 1,
                                   "hybrid_build": 1, "run_checkpoint": 1, "interactions": 1, "path_effects": 1,
                                   "evaluation": 1, "calibration": 1, "faithfulness": 2, "circuit_run": 1}

__all__ = ["FORMAT_VERSIONS", "as_path", "atomic_write", "clean_json", "file_in", "make_folder", "read_json", "read_tensors",
           "records", "write_files", "write_json", "write_tensors"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``: a reader never sees
    half a file, and a link at ``path`` is replaced, never written through. An :class:`InputError` when ``path`` is a
    folder or one of its parents is a file."""
    path = as_path(path)
    _check_target(path)
    make_folder(path.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; a result is as readable as any new file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def make_folder(folder: str | os.PathLike) -> Path:
    """``folder``, created with its parents when missing; an :class:`InputError` naming the path when it or a parent
    is a file (or a broken link), or it cannot be created."""
    folder = as_path(folder)
    if folder.is_dir():
        return folder
    _check_target(folder / "x")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the folder {str(folder)!r}: {e.strerror or e}; pick a folder you can write "
                         f"to") from None
    return folder


def write_files(folder: str | os.PathLike, fill: Any) -> Path:
    """Let ``fill(tmp)`` write files (a Hugging Face ``save_pretrained``) into a new temporary folder beside
    ``folder``, then move each into ``folder`` by ``os.replace``: each file appears whole, and a link at its name is
    replaced, never written through. Returns ``folder``."""
    import shutil

    folder = make_folder(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder))
    try:
        fill(tmp)
        for f in sorted(tmp.rglob("*")):
            if f.is_file():
                dest = folder / f.relative_to(tmp)
                _check_target(dest)
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(f, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _check_target(path: Path) -> None:
    """Refuse a file path that cannot take a file: a folder, or a parent that is a file (or a dangling link)."""
    if path.is_dir() and not path.is_symlink():
        raise InputError(f"{str(path)!r} is a folder; name a file to write, or another path")
    for parent in path.parents:
        if parent.is_dir():
            return
        if parent.exists() or parent.is_symlink():
            raise InputError(f"cannot write {str(path)!r}: its parent {str(parent)!r} is not a folder (a file or a "
                             f"broken link); pick another path")


def clean_json(value: Any) -> Any:
    """``value`` with every non-finite float replaced by ``None`` (strict JSON has no NaN/Infinity)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean_json(v) for v in value]
    return value


def _check(doc: Any, fmt: str, path: Path) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise InputError(f"{str(path)!r} is not a gna_interp {fmt} file (it holds a {type(doc).__name__})")
    found, version = doc.get("format"), doc.get("format_version")
    if found != fmt:
        what = f"a {found[:60]}" if isinstance(found, str) and found else "an unlabelled"
        raise InputError(f"{str(path)!r} is {what} file, not a gna_interp {fmt} file (one written by an older gna, or "
                         f"another program): rewrite it (rerun the command that made it)")
    want = FORMAT_VERSIONS[fmt]
    if version != want:
        raise InputError(f"{str(path)!r} has {fmt} format version {version!r}; this gna_interp reads version {want} "
                         f"(rewrite it with this version, e.g. rerun the command that made it)")
    return doc


def records(df: Any) -> list[dict[str, Any]]:
    """The rows of a pandas DataFrame as plain JSON-able dicts (numpy scalars converted; :func:`write_json` writes
    NaN as null)."""
    return [{str(k): (v.item() if hasattr(v, "item") else v) for k, v in rec.items()}
            for rec in df.to_dict(orient="records")]


def write_json(path: str | os.PathLike, fmt: str, body: dict[str, Any], indent: int | None = 1) -> Path:
    """Write ``body`` as a strict-JSON ``fmt`` document (``format`` and ``format_version`` added)."""
    doc = {"format": fmt, "format_version": FORMAT_VERSIONS[fmt], **clean_json(body)}
    return atomic_write(path, json.dumps(doc, indent=indent, allow_nan=False) + "\n")


def read_json(path: str | os.PathLike, fmt: str, run_id: str | None = None) -> dict[str, Any]:
    """Read a ``fmt`` document written by :func:`write_json`; a clear error when missing, truncated, of another
    kind or version, off its schema, or (given ``run_id``) written by another run."""
    path = _regular_file(path)
    try:
        text = path.read_text(encoding="utf-8")
        doc = json.loads(text, parse_constant=_no_constant, parse_float=_finite, parse_int=_bounded_int,
                         object_pairs_hook=_unique_keys)
    except _TooLarge as e:
        raise InputError(f"{str(path)!r} is not a valid {fmt} file: {_where_too_large(text)} holds an integer of "
                         f"{e.digits} digits, larger than any gna_interp field holds (at most {e.limit:,}); it was "
                         f"edited or comes from another program: rewrite it (rerun the command that made it)") from None
    except RecursionError:
        raise InputError(f"{str(path)!r} nests its JSON too deeply to be a gna_interp {fmt} file") from None
    except (OSError, ValueError) as e:
        raise InputError(f"{str(path)!r} cannot be read as JSON ({e}); it may be truncated: rewrite it") from e
    return _same_run(_validated(_check(doc, fmt, path), fmt, path), run_id, path)


def _same_run(doc: dict[str, Any], run_id: str | None, path: Path) -> dict[str, Any]:
    """``doc`` when it carries ``run_id`` (or none is asked for): the files of one saved result carry the id of
    the run that wrote them, so a file copied in from another run is caught."""
    if run_id is not None and doc.get("run_id") != run_id:
        found = doc.get("run_id")
        raise InputError(f"{str(path)!r} comes from another run (run_id {str(found)[:32] if found else 'missing'}, the "
                         f"folder's circuit.json has {run_id}): the folder mixes two runs; rerun the command that made "
                         f"it or put the file's own folder back together")
    return doc


def as_path(value: Any, what: str = "path") -> Path:
    """``value`` (a ``str`` or ``os.PathLike``, not empty) as a :class:`~pathlib.Path`; an :class:`InputError` naming
    ``what`` for anything else (a number, None, bytes, an empty string, a NUL character)."""
    if isinstance(value, (str, os.PathLike)) and not isinstance(value, bytes):
        text = os.fspath(value)
        if isinstance(text, str) and text.strip() and "\0" not in text:
            return Path(text)
    raise InputError(f"{what} must be a file or folder path (a str or pathlib.Path, not empty), got "
                     f"{type(value).__name__} {value!r:.60}")


def file_in(path: str | os.PathLike, name: str) -> Path:
    """``path`` itself, or the file ``name`` inside it when ``path`` is a folder (``save(folder)`` / ``load(folder)``)."""
    p = as_path(path)
    return p / name if p.is_dir() else p


def _regular_file(path: str | os.PathLike) -> Path:
    """``path`` when it is a regular file (a link to one included); a clear error for a missing path, a folder, or a
    FIFO or device (which would block or never end: never opened)."""
    path = as_path(path)
    if path.is_file():
        return path
    if path.is_dir():
        raise InputError(f"{str(path)!r} is a folder, not a file")
    if path.exists():
        raise InputError(f"{str(path)!r} is not a regular file (a FIFO, socket or device); a result file is a file")
    raise InputError(f"{str(path)!r} does not exist")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"the key {k[:60]!r} appears twice in one object")
        seen.add(k)
    return dict(pairs)


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number (gna writes a non-finite value as null)")


class _TooLarge(ValueError):
    def __init__(self, digits: int, limit: int) -> None:
        super().__init__(f"an integer of {digits} digits")
        self.digits, self.limit = digits, limit


def _bounded_int(text: str) -> int:
    """An integer literal that fits int64 (every integer gna writes does); a longer one is refused here, before it
    can overflow a float in a report (``10**400``) or size a loop."""
    from gna_interp.schemas import MAX_INT

    value = int(text) if len(text) <= 25 else None
    if value is None or abs(value) > MAX_INT:
        raise _TooLarge(len(text.lstrip("-")), MAX_INT)
    return value


def _where_too_large(text: str) -> str:
    """``field 'task' (at 'task/args/max_value')``: where the first too-large integer of a JSON ``text`` is."""
    from gna_interp.schemas import MAX_INT

    marker = object()

    def find(node: Any, at: tuple[str, ...]) -> tuple[str, ...] | None:
        if node is marker:
            return at
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for k, v in items:
            hit = find(v, (*at, str(k)))
            if hit is not None:
                return hit
        return None

    try:
        doc = json.loads(text, parse_int=lambda t: marker if len(t) > 25 or abs(int(t)) > MAX_INT else int(t))
        at = find(doc, ())
    except (ValueError, RecursionError):
        at = None
    if not at:
        return "a field"
    return f"field {at[0]!r}" + (f" (at {'/'.join(at)!r})" if len(at) > 1 else "")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:40]} overflows a float")
    return value


def _validated(doc: dict[str, Any], fmt: str, path: Path) -> dict[str, Any]:
    """``doc`` when it fits its format's schema (:mod:`gna_interp.schemas`), else a one-line error naming the file
    and the field."""
    from gna_interp.schemas import schema_error

    problem = schema_error(doc, fmt)
    if problem:
        raise InputError(f"{str(path)!r} is not a valid {fmt} file: {problem}; it was edited or comes from another "
                         f"program: rewrite it (rerun the command that made it)")
    return doc


def write_tensors(path: str | os.PathLike, fmt: str, body: dict[str, Any]) -> Path:
    """Write tensors, lists, strings and numbers as a ``fmt`` bundle (``torch.save``, loadable with
    ``weights_only=True``)."""
    import torch

    buf = io.BytesIO()
    torch.save({"format": fmt, "format_version": FORMAT_VERSIONS[fmt], **body}, buf)
    return atomic_write(path, buf.getvalue())


def read_tensors(path: str | os.PathLike, fmt: str, run_id: str | None = None) -> dict[str, Any]:
    """Read a bundle written by :func:`write_tensors` (no code is unpickled); checked as :func:`read_json`."""
    import torch

    path = _regular_file(path)
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises several types for a bad file; its messages run over many lines
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise InputError(f"{str(path)!r} cannot be read as a tensor bundle ({type(e).__name__}: {first}); it may be "
                         f"truncated, or not a gna_interp file (no code in it was run): rewrite it") from None
    return _same_run(_validated(_check(doc, fmt, path), fmt, path), run_id, path)
