"""Output folders (``--out``) as untrusted places: what every command checks before it loads a model.

A result folder is shared between people (a colleague's scan, a paper's supplement), so a command writing into
``--out`` first makes sure, before any work:

- the path can be a folder (not an existing file, no name longer than the file system allows, a parent we may
  write into);
- nothing written can follow a link out of it: no folder inside ``--out`` is a symbolic link (``figures`` linked
  to another run's figures would have its PNGs overwritten). Files are replaced by rename, which replaces a
  link rather than writing through it;
- no other gna process is writing into it: every command that writes takes ``.gna.lock``, an OS lock that dies
  with its process, when it claims the folder (before its model loads) and holds it until it ends; a lock file left
  by a crashed run blocks nothing, and its contents are never trusted;
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
import stat
from pathlib import Path
from typing import Any, Iterable, Iterator

from gna_interp.constants import (
    CARD_MD, CIRCUIT_JSON, CIRCUIT_RUN_JSON, EDGE_FAITHFULNESS, WHOLE_DIR, COMPARE_CSV, COMPARE_JSON, COMPARE_MD, CONTROL_JSON, EDGES_CSV, EDGE_GRAPH_HTML,
    EDGE_SCREEN_CSV, EVAL_SUMMARY_CSV, FAITHFULNESS_CSV, FAITHFULNESS_HTML, FAITHFULNESS_JSON, FAITHFULNESS_MD,
    FIGURES_DIR, PATTERNS_HTML, PRUNE_CSV, PRUNE_JSON, REPORT_FILE, ROLES_CSV, SCAN_CSV, SCAN_JSON, SUMMARY_MD, VIEWS_PT,
    result_files,
)
from gna_interp.errors import InputError

__all__ = ["LOCK_FILE", "RESULTS", "Lock", "RunFolder", "check_out_dir", "check_out_file", "check_writable", "owner_of",
           "reading", "release_held"]

LOCK_FILE = ".gna.lock"

# The files that mark a folder as holding a command's results (its JSON document first: it is written last).
RESULTS: dict[str, tuple[str, ...]] = {
    "scan": (CIRCUIT_JSON, SCAN_JSON, SCAN_CSV, CONTROL_JSON, VIEWS_PT, SUMMARY_MD),
    "hybrid plan": result_files("hybrid_plan"),
    "hybrid build": result_files("hybrid_build"),
    "eval": (*result_files("eval"), EVAL_SUMMARY_CSV),
    "prune": (PRUNE_JSON, PRUNE_CSV),
    "mask": result_files("mask"),
    "sweep": result_files("sweep"),
    "compare": result_files("families"),
    "compare-circuits": (COMPARE_JSON, COMPARE_CSV, COMPARE_MD),
    "circuit": (FAITHFULNESS_JSON, CIRCUIT_RUN_JSON, FAITHFULNESS_CSV, FAITHFULNESS_MD, FAITHFULNESS_HTML, EDGES_CSV, ROLES_CSV,
                EDGE_SCREEN_CSV, EDGE_GRAPH_HTML, *(EDGE_FAITHFULNESS + x for x in (".json", ".csv", ".md", ".html")),
                WHOLE_DIR),
    "zoo train": (CARD_MD, "model.safetensors"),
}
_SHARED = (REPORT_FILE, FIGURES_DIR)  # every command with a page writes these
_FOLDERS = frozenset({WHOLE_DIR, FIGURES_DIR})  # the results above that are folders, not files
# commands that write their results stage by stage: a folder holding an earlier run takes --resume or --fresh
_STAGED = frozenset({"circuit"})


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
    """``DIR/.gna.lock`` held while a command writes into ``DIR``: a second command into the same folder is refused.

    The lock is an OS lock (``fcntl.flock``) on that file, so it dies with the process that holds it: a run that
    crashed, was killed or stopped on a full disk never blocks the next one, whatever file it left. The file's
    contents (the holder's pid, for people) are never read as a number or trusted. Only commands that write take
    it; reading a folder (``Circuit.load``, ``HeadScan.load``, ...) takes no lock and works in a read-only folder.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_FILE
        self._fd: int | None = None
        self._made: Path | None = None  # the folder this lock created (removed again on release when left empty)

    @property
    def held(self) -> bool:
        """Whether this object holds the lock."""
        return self._fd is not None

    def _refuse_odd(self) -> None:
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            what = "a symbolic link" if self.path.is_symlink() else "a folder" if self.path.is_dir() else "not a file"
            raise InputError(f"{self.path} is {what}, not gna's lock file: gna neither reads nor removes it; move it "
                             f"away (or pick another --out)")

    def _in_use(self) -> InputError:
        return InputError(f"{self.path.parent} is in use by another gna process (it holds {self.path}); wait for it "
                          f"to finish or pick another --out")

    def check(self) -> None:
        """Refuse when another process holds the lock, or when something else than a lock file sits at its name (a
        folder, a link, a FIFO: never read, followed or removed); touches nothing (a lock file nobody holds, left
        by a process that is gone, is no obstacle)."""
        self._refuse_odd()
        if self.held or not self.path.exists():
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return  # unreadable here: taking the lock (which needs write access) will say why
        try:
            if not _try_lock(fd, shared=True):
                raise self._in_use()
        finally:
            os.close(fd)  # closing drops the probe's shared lock

    def acquire(self) -> "Lock":
        """Take the lock (creating the folder when missing), or refuse with :class:`InputError`: the folder in
        use, the lock's name taken by something else than a file, a folder gna cannot write into."""
        if self.held:
            return self
        folder = self.path.parent
        self._refuse_odd()
        top = None  # the highest folder this lock creates
        for p in [folder, *folder.parents]:
            if p.exists() or p.is_symlink():
                break
            top = p
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InputError(f"cannot create the folder {str(folder)!r}: {e.strerror or e}; pick a folder you can "
                             f"write to") from None
        self._made = top
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o644)
            except OSError as e:
                self._refuse_odd()
                self._remove_made()
                raise InputError(f"cannot take the lock {self.path} ({e.strerror or e}): gna writes into "
                                 f"{str(folder)!r} and cannot there; pick a folder you can write to") from None
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise InputError(f"{self.path} is not a regular file, not gna's lock file: gna neither reads nor "
                                     f"removes it; move it away (or pick another --out)")
                if not _try_lock(fd, shared=False):
                    raise self._in_use()
            except BaseException:
                os.close(fd)
                self._remove_made()
                raise
            if _same_file(fd, self.path):
                self._fd = fd
                _note_pid(fd)
                _HELD[id(self)] = self
                return self
            os.close(fd)  # the holder before us removed the file as we opened it: take the new one
        self._remove_made()
        raise InputError(f"could not take the lock {self.path}: it keeps being replaced; is another gna process "
                         f"starting in {str(folder)!r}?")

    def release(self) -> None:
        """Give the lock back: the file is removed while still held, then closed (the OS lock goes with it); the
        folder it created is removed again when nothing was written there."""
        fd, self._fd = self._fd, None
        _HELD.pop(id(self), None)
        if fd is None:
            return
        try:
            if _same_file(fd, self.path):
                self.path.unlink(missing_ok=True)
        except OSError:
            pass  # a read-only or vanished folder: the OS lock still goes with the descriptor
        finally:
            os.close(fd)
        self._remove_made()

    def _remove_made(self) -> None:
        made, self._made = self._made, None
        if made is None:
            return
        for p in [self.path.parent, *self.path.parent.parents]:
            try:
                p.rmdir()  # only when empty
            except OSError:
                return
            if p == made:
                return

    def __enter__(self) -> "Lock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_HELD: dict[int, Lock] = {}  # the locks this process holds (released by release_held at the end of a command)


@contextlib.contextmanager
def reading(folder: str | os.PathLike) -> Iterator[None]:
    """Hold ``folder``'s lock shared while a command reads it (a result folder another command reads whole, such as
    the scan ``gna circuit`` measures): a gna command writing there holds it exclusively, so the reader is refused
    (an :class:`InputError` saying to wait) rather than reading half of one run and half of another. Where the lock
    cannot be created (a read-only folder, which no gna command can write either) the folder is read as it is; a
    lock file this reader created is removed again when no one else holds it."""
    path = Path(folder) / LOCK_FILE
    Lock(Path(folder))._refuse_odd()
    existed = path.exists()
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | os.O_NONBLOCK, 0o644)
    except OSError:
        yield  # read-only: nobody writes here through gna
        return
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputError(f"{path} is not a regular file, not gna's lock file: move it away")
        if not _try_lock(fd, shared=True):
            raise InputError(f"{str(folder)!r} is being written by another gna process (it holds {path}); wait for it "
                             f"to finish, then run again")
        yield
        if not existed and _try_lock(fd, shared=False) and _same_file(fd, path):
            path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def release_held() -> None:
    """Release every lock this process still holds (the end of a ``gna`` command, however it ended)."""
    for lock in list(_HELD.values()):
        lock.release()


def _try_lock(fd: int, shared: bool) -> bool:
    """Take an OS lock on ``fd`` without waiting; False when another process holds a conflicting one."""
    import fcntl

    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as e:  # a file system without locks: say so rather than write unguarded
        raise InputError(f"cannot lock files in this folder ({e.strerror or e}); pick an --out on a local disk") from None
    return True


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        here = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def _note_pid(fd: int) -> None:
    """Write the holder's pid into the lock file, for people; a full disk leaves it empty, which changes nothing."""
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
    except OSError:
        pass


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
        self._lock = Lock(self.path)

    def check(self, *, fresh: bool = False, resume: bool = False, checkpoints: Iterable[Path] = (),
              inputs: Iterable[str | os.PathLike] = (), locked_by_lead: bool = False) -> None:
        """Refuse (:class:`InputError`, naming the folder and the way out) an ``--out`` that cannot take this
        command's results; touches nothing. ``checkpoints``: the command's own checkpoint files (a finished
        ``gna scan`` without them is refused unless ``fresh``); ``inputs``: the folders or files the command reads
        (``--out`` may be none of them, hold one, or lie inside one: ``--fresh`` would delete what it reads);
        ``locked_by_lead``: a rank of a torchrun job other than the lead, whose lead holds the lock."""
        out = self.path
        _check_name(out, "--out")
        _not_an_input(out, inputs)
        check_out_dir(out)
        if not out.is_dir():
            return
        mine = (*RESULTS[self.command], *_SHARED, SUMMARY_MD)
        check_writable(out, [n for n in mine if n not in _FOLDERS], [n for n in mine if n in _FOLDERS])
        if not locked_by_lead:
            self._lock.check()
        owner = owner_of(out)
        if owner is None or fresh:
            return
        command, marker = owner
        if command != self.command:
            raise InputError(f"--out {str(out)!r} holds the results of `gna {command}` ({marker}); `gna {self.command}` "
                             f"would replace its report.html: pick another --out, or add --fresh to delete those "
                             f"results ({', '.join(self.foreign_files())}) and write there")
        if self.command in _STAGED and not resume:
            raise InputError(f"--out {str(out)!r} holds an earlier `gna {self.command}` run ({marker}): add --resume to "
                             f"continue it (its finished stages are kept when the scan and options are the same), "
                             f"--fresh to start over, or pick another --out")
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

    def clear_foreign(self, own: bool = False) -> list[str]:
        """Delete the results of another command (``--fresh``); with ``own``, this command's as well (a command that
        writes stage by stage starting over); return what was deleted."""
        gone = self.foreign_files()
        if own:
            gone += [n for n in (*RESULTS[self.command], *_SHARED) if n not in gone and
                     ((self.path / n).exists() or (self.path / n).is_symlink())]
        for name in gone:
            p = self.path / name
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)
        return gone

    def claim(self, **check: Any) -> "RunFolder":
        """:meth:`check` (keyword arguments as there), then take the folder's lock and keep it -- until :meth:`hold`
        ends, :meth:`release`, or :func:`release_held` at the end of the command: from here on no other gna
        command can write there, even while this one is still loading its model."""
        self.check(**check)
        self._lock.acquire()
        return self

    def release(self) -> None:
        """Give the folder's lock back (nothing when it is not held)."""
        self._lock.release()

    @contextlib.contextmanager
    def hold(self, fresh: bool = False) -> Iterator["RunFolder"]:
        """Hold the folder's lock while the command writes (taking it unless :meth:`claim` did), then give it back;
        with ``fresh``, first delete another command's results (:meth:`clear_foreign`). Refused when another
        command's results appeared since the check and ``fresh`` is not given."""
        self._lock.acquire()
        try:
            owner = owner_of(self.path)
            if owner is not None and owner[0] != self.command and not fresh:
                raise InputError(f"--out {str(self.path)!r} now holds the results of `gna {owner[0]}` ({owner[1]}); "
                                 f"`gna {self.command}` would replace its report.html: pick another --out, or add "
                                 f"--fresh to delete those results")
            if fresh:
                self.clear_foreign(own=self.command in _STAGED)
            yield self
        finally:
            self._lock.release()


def _not_an_input(out: Path, inputs: Iterable[str | os.PathLike]) -> None:
    mine = out.resolve()
    for given in inputs:
        src = Path(given).resolve()
        if src.is_file():  # a file: --out may not be its folder or hold it (a sibling or a subfolder is fine)
            clash = mine == src.parent or src.is_relative_to(mine)
        else:  # a folder: nor may --out lie inside it (its figures/, its circuit/)
            clash = mine == src or src.is_relative_to(mine) or mine.is_relative_to(src)
        if clash:
            how = "is" if mine == src else "holds" if src.is_relative_to(mine) else "lies inside"
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
        raise InputError(f"{what} {str(out)!r} is a folder; name a file, e.g. {str(out / PATTERNS_HTML)!r}")
    _check_path(out, what)
    return out
