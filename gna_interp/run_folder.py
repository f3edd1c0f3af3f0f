"""Output folders (``--out``) as untrusted places: what every command checks before it loads a model.

A result folder is shared between people (a colleague's scan, a paper's supplement), so a command writing into
``--out`` first makes sure, before any work:

- the path can be a folder (not an existing file, no name longer than the file system allows, a parent we may
  write into);
- nothing written can follow a link out of it: no folder inside ``--out`` is a symbolic link (``figures`` linked
  to another run's figures would have its PNGs overwritten). Files are replaced by rename, which replaces a
  link rather than writing through it;
- no live gna process is writing into it (``.gna.lock`` with the writer's pid; a lock left by a dead process is
  taken over);
- it does not hold **another command's results** (``gna scan`` into a ``gna hybrid plan`` folder would replace
  its ``report.html``): refused unless ``--fresh``, which deletes those results (the files :data:`RESULTS`
  names for that command, ``report.html`` and ``figures/``; nothing else) before the command writes;
- for ``gna scan``, it does not hold a **finished scan whose checkpoint is gone**: a new scan would replace it
  without a word; refused unless ``--fresh``.

:func:`check_out_file` does the same for commands whose ``--out`` is one file (``gna patterns``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Iterable, Iterator

from gna_interp.errors import InputError

__all__ = ["LOCK_FILE", "RESULTS", "Lock", "RunFolder", "check_out_dir", "check_out_file", "check_writable", "owner_of"]

LOCK_FILE = ".gna.lock"

# The files that mark a folder as holding a command's results (its JSON document first: it is written last).
RESULTS: dict[str, tuple[str, ...]] = {
    "scan": ("circuit.json", "scan.json", "scan.csv", "control.json", "views.pt", "summary.md"),
    "hybrid plan": ("hybrid_plan.json", "hybrid_plan.csv"),
    "hybrid build": ("hybrid_build.json", "hybrid_build.csv"),
    "eval": ("eval.json", "eval.csv"),
    "prune": ("prune.json", "prune.csv"),
    "mask": ("mask.json", "mask.csv"),
    "sweep": ("sweep.json", "sweep.csv"),
    "compare": ("families.json", "families.csv"),
    "compare-circuits": ("compare.json", "compare.csv", "compare.md"),
    "circuit": ("faithfulness.json", "faithfulness.csv", "faithfulness.md", "faithfulness.html"),
    "zoo train": ("MODEL_CARD.md", "model.safetensors"),
}
_SHARED = ("report.html", "figures")  # every command with a page writes these


def owner_of(folder: Path) -> tuple[str, str] | None:
    """The command whose results ``folder`` holds and the file that shows it (its JSON document or
    first result file), or None."""
    for command, names in RESULTS.items():
        for name in names:
            if (folder / name).exists():
                return command, name
    return None


def _name_max(path: Path) -> int:
    try:
        return os.pathconf(path, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        return 255


def _check_name(out: Path, what: str) -> None:
    """Refuse a path with a name longer than the file system allows (checked first: asking such a path whether
    it exists raises)."""
    limit = _name_max(next((p for p in out.parents if p.is_dir()), Path(".")))
    long = next((part for part in out.parts if len(os.fsencode(part)) > limit), None)
    if long is not None:
        raise InputError(f"{what} {str(out)[:60]!r}...: the name {long[:40]!r}... has {len(os.fsencode(long))} bytes, "
                         f"more than the {limit} this file system allows in one name; pick a shorter path")


def _check_path(out: Path, what: str) -> Path:
    """The nearest existing ancestor of ``out``; refuse a parent we cannot write into."""
    parent = out if out.exists() else next((p for p in out.parents if p.exists()), Path("."))
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{what} {str(out)!r}: cannot write into {str(parent)!r}; pick a folder you can write to")
    return parent


def _check_not_empty(out: str | os.PathLike, what: str) -> None:
    """Refuse an empty path (``Path("")`` is the current directory: the results would land there unasked)."""
    if not str(out).strip():
        raise InputError(f"{what} is empty: name an output folder (e.g. {what} runs/scan); an empty path would "
                         f"write the results into the current directory")


def check_out_dir(out: str | os.PathLike, what: str = "--out") -> Path:
    """Refuse an output folder path that cannot be one: a name too long, an existing file, a dangling link, a parent
    that cannot be written. Reads only; returns ``out`` as a path."""
    _check_not_empty(out, what)
    out = Path(out)
    _check_name(out, what)
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {str(out)!r} is an existing file, not a folder; pick a folder path")
    if out.is_symlink() and not out.exists():
        raise InputError(f"{what} {str(out)!r} is a symbolic link to {os.readlink(out)!r}, which does not exist; "
                         f"remove the link or pick another folder")
    _check_path(out, what)
    return out


def _links_inside(folder: Path) -> list[Path]:
    """Folders inside ``folder`` (at any depth, links not followed) that are symbolic links."""
    found = []
    for root, dirs, _files in os.walk(folder, followlinks=False):
        found += [Path(root) / d for d in dirs if (Path(root) / d).is_symlink()]
        dirs[:] = [d for d in dirs if not (Path(root) / d).is_symlink()]
    return found


def _check_no_links(folder: Path, what: str) -> None:
    """Refuse a folder that holds a folder link: whatever a command wrote there would land in the link's
    target, outside ``folder``."""
    links = _links_inside(folder) if folder.is_dir() else []
    if links:
        first = links[0]
        raise InputError(f"{what} {str(folder)!r}: {str(first.relative_to(folder))!r} is a symbolic link to "
                         f"{os.readlink(first)!r}; gna writes only inside the folder and never through a link: "
                         f"remove the link or pick another folder")


def check_writable(folder: Path, files: Iterable[str] = (), dirs: Iterable[str] = (), what: str = "--out") -> None:
    """Refuse, before anything is written, an existing folder that holds a folder link (at any depth), whose output
    ``files`` are folders, or whose output ``dirs`` are files or symbolic links (a dangling one included): writing
    there would fail half-way or land outside ``folder``."""
    _check_no_links(folder, what)
    for name in files:
        if (folder / name).is_dir() and not (folder / name).is_symlink():
            raise InputError(f"{what} {str(folder)!r}: {name!r} is a folder where gna writes a file; move it away")
    for name in dirs:
        p = folder / name
        if p.is_symlink():
            raise InputError(f"{what} {str(folder)!r}: {name!r} is a symbolic link (to {os.readlink(p)!r}); gna writes "
                             f"only inside the folder and never through a link: remove the link")
        if p.exists() and not p.is_dir():
            raise InputError(f"{what} {str(folder)!r}: {name!r} is a file where gna writes a folder; move it away")


class Lock:
    """``DIR/.gna.lock`` held while a command writes into ``DIR``: a second command into the same folder is
    refused (a lock left by a process that no longer runs is taken over)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_FILE

    def check(self) -> None:
        """Refuse when a live process holds the lock, or when something else than a lock file sits at its name (a
        folder, a link, a FIFO: never read, followed or removed); read only: touches nothing."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            what = "a symbolic link" if self.path.is_symlink() else "a folder" if self.path.is_dir() else "not a file"
            raise InputError(f"{self.path} is {what}, not gna's lock file: gna neither reads nor removes it; move it "
                             f"away (or pick another --out)")
        if self.path.exists() and self._held():
            raise InputError(f"{self.path.parent} is in use by another gna process ({self.path} names pid "
                             f"{self._pid() or '?'}); wait for it to finish, pick another --out, or delete the lock "
                             f"file if no gna process uses the folder")

    def _pid(self) -> int:
        try:
            return int(self.path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _held(self) -> bool:
        pid = self._pid()
        if pid:
            return _alive(pid)
        try:  # empty: another process is between creating it and writing its pid, unless it is old
            return time.time() - self.path.stat().st_mtime < 60
        except OSError:
            return False

    def __enter__(self) -> "Lock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except (FileExistsError, IsADirectoryError):
                self.check()
                self.path.unlink(missing_ok=True)  # stale: its process is gone
                continue
            with os.fdopen(fd, "w") as f:
                f.write(str(os.getpid()))
            return self
        raise InputError(f"could not take the lock {self.path}; delete it if no gna process uses {self.path.parent}")

    def __exit__(self, *exc: object) -> None:
        self.path.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunFolder:
    """The ``--out`` folder of one ``command`` (a key of :data:`RESULTS`).

    ``RunFolder(out, "scan").check(fresh=..., checkpoints=[...])`` runs every check of this module before any
    work; ``with folder.hold(fresh):`` holds the folder while writing; :meth:`clear_foreign` is what ``--fresh``
    does to another command's results.
    """

    def __init__(self, out: str | os.PathLike, command: str) -> None:
        if command not in RESULTS:
            raise ValueError(f"unknown command {command!r}")
        _check_not_empty(out, "--out")
        self.path, self.command = Path(out), command

    def check(self, *, fresh: bool = False, resume: bool = False, checkpoints: Iterable[Path] = (),
              inputs: Iterable[str | os.PathLike] = ()) -> None:
        """Refuse (:class:`InputError`, naming the folder and the way out) an ``--out`` that cannot take this
        command's results; touches nothing. ``checkpoints``: the command's own checkpoint files (a finished
        ``gna scan`` without them is refused unless ``fresh``); ``inputs``: the folders or files the command reads
        (``--out`` may be none of them, hold one, or lie inside one: ``--fresh`` would delete what it reads)."""
        out = self.path
        _check_name(out, "--out")
        _not_an_input(out, inputs)
        check_out_dir(out)
        if not out.is_dir():
            return
        check_writable(out, (*RESULTS[self.command], *_SHARED[:1], "summary.md"), _SHARED[1:])
        Lock(out).check()
        owner = owner_of(out)
        if owner is None or fresh:
            return
        command, marker = owner
        if command != self.command:
            raise InputError(f"--out {str(out)!r} holds the results of `gna {command}` ({marker}); `gna {self.command}` "
                             f"would replace its report.html: pick another --out, or add --fresh to delete those "
                             f"results ({', '.join(self.foreign_files())}) and write there")
        if self.command == "scan" and not any(Path(c).exists() for c in checkpoints):
            raise InputError(f"--out {str(out)!r} holds a finished gna scan ({marker}) and no checkpoint"
                             f"{' to resume' if resume else ''}; a new scan would replace it: pick another --out, or "
                             f"add --fresh to replace it")

    def foreign_files(self) -> list[str]:
        """The results of other commands in the folder (names relative to it) that ``--fresh`` deletes."""
        owner = owner_of(self.path) if self.path.is_dir() else None
        if owner is None or owner[0] == self.command:
            return []
        names = [n for c, ns in RESULTS.items() if c != self.command for n in ns] + list(_SHARED)
        return [n for n in dict.fromkeys(names) if (self.path / n).exists() or (self.path / n).is_symlink()]

    def clear_foreign(self) -> list[str]:
        """Delete the results of another command (``--fresh``); return what was deleted."""
        gone = self.foreign_files()
        for name in gone:
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        return gone

    @contextlib.contextmanager
    def hold(self, fresh: bool = False) -> Iterator["RunFolder"]:
        """Hold the folder's lock while the command writes; with ``fresh``, first delete another command's
        results (:meth:`clear_foreign`)."""
        with Lock(self.path):
            if fresh:
                self.clear_foreign()
            yield self


def _not_an_input(out: Path, inputs: Iterable[str | os.PathLike]) -> None:
    mine = out.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if src.is_file():  # a file: --out may not be its folder or hold it (a sibling or a subfolder is fine)
            clash = mine == src.parent or src.is_relative_to(mine)
        else:  # a folder: nor may --out lie inside it (its figures/, its circuit/)
            clash = mine == src or src.is_relative_to(mine) or mine.is_relative_to(src)
        if clash:
            how = "is" if mine in (src, src.parent) else "holds" if src.is_relative_to(mine) else "lies inside"
            raise InputError(f"--out {str(out)!r} {how} the input {str(given)!r} this command reads; writing there "
                             f"(or --fresh) would replace what it reads: pick another --out")


def check_out_file(out: str | os.PathLike, what: str = "--out") -> Path:
    """Refuse an output *file* path that cannot be one: a folder (``/`` included), a symbolic link (dangling
    or not: gna replaces files, it never writes through a link), a name too long, a parent we cannot write."""
    out = Path(out)
    _check_name(out, what)
    if out.is_symlink():
        raise InputError(f"{what} {str(out)!r} is a symbolic link (to {os.readlink(out)!r}); gna writes a new file "
                         f"and never through a link: remove the link or pick another file name")
    if out.is_dir():
        raise InputError(f"{what} {str(out)!r} is a folder; name a file, e.g. {str(out / 'patterns.html')!r}")
    _check_path(out, what)
    return out
