"""The face every result shares: :class:`Result`.

A result is data (:meth:`Result.to_dict` / :meth:`Result.from_dict`: strict JSON and back), one JSON file
(:meth:`Result.save` / :meth:`Result.load`: a ``format``-labelled document of :mod:`gna_interp.store`, written
atomically: a temporary file in the same folder, then ``os.replace``), a table (:meth:`Result.to_frame`), a figure
(:meth:`Result.plot`: the plotly figure its ``figure(...)`` draws) and a notebook display
(:meth:`Result._repr_html_`: a title, its facts and the head of its table, from the pieces of
:mod:`gna_interp.html_repr`, every text escaped). A result type names its format (:attr:`Result.FORMAT`, a key of
:data:`gna_interp.store.FORMAT_VERSIONS`) and the file it takes in a folder (:attr:`Result.FILE`, a name of
:mod:`gna_interp.constants`), and writes ``to_dict`` / ``from_dict``; it overrides the rest only where it has more to
show or to write.

Two kinds of ``save(path, ...)`` share the one protocol: ``path`` is always the first argument, a file or a folder,
and ``load(path)`` reads what ``save(path)`` returned or the folder it wrote into. A one-file result writes its
:attr:`~Result.FILE` (``path`` a file, or a folder: its ``FILE``); a folder result (a circuit, an experiment) writes
its files into the folder ``path`` (or the folder of ``path`` when ``path`` names its ``FILE``,
:func:`folder_of`) and keeps its own keyword options (``png=``, ``run_id=``).

Imports only :mod:`gna_interp.store`, :mod:`gna_interp.html_repr`, :mod:`gna_interp.errors` and pandas: every layer
that holds a result may use it.
"""

from __future__ import annotations

import numbers
import os
from pathlib import Path
from typing import Any, ClassVar, Mapping, TypeVar

import pandas as pd

from gna_interp import html_repr
from gna_interp.errors import InputError
from gna_interp.store import as_path, file_in, read_json, write_json

__all__ = ["REPR_ROWS", "Result", "folder_of"]

REPR_ROWS = 10  # rows of to_frame() a default display shows (to_frame() has them all)

R = TypeVar("R", bound="Result")


def folder_of(path: str | os.PathLike, file: str) -> Path:
    """The folder a folder result writes into: ``path``, or the folder holding it when ``path`` names the result's
    ``file`` (``save(folder)`` and ``save(folder / file)`` write the same folder)."""
    p = as_path(path)
    return p.parent if p.name == file else p


class Result:
    """A result that saves, loads, tabulates and displays itself (see the module docstring).

    Subclasses set :attr:`FORMAT` and :attr:`FILE` and write :meth:`to_dict` / :meth:`from_dict`; ``save(path)``
    then writes one JSON file (``path`` a ``.json`` file, or a folder: its :attr:`FILE`) and ``load(path)`` reads it
    back, so ``type(r).load(r.save(p)).to_dict() == r.to_dict()``. A subclass with a ``figure(...)`` method gets
    :meth:`plot`; one without names in :attr:`DRAWN_BY` the function of a higher layer that draws it.
    """

    FORMAT: ClassVar[str]  # the document's format, a key of store.FORMAT_VERSIONS
    FILE: ClassVar[str]  # the file save writes into a folder (a name of gna_interp.constants)
    INDENT: ClassVar[int | None] = 1  # the JSON document's indent (None: one line)
    DRAWN_BY: ClassVar[str] = ""  # a function of a higher layer that draws a result without a figure of its own

    # ---- data ------------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Everything :meth:`from_dict` needs to rebuild the result, as JSON-able data."""
        raise NotImplementedError(f"{type(self).__name__} does not describe itself as data (to_dict)")

    @classmethod
    def from_dict(cls: type[R], d: Mapping[str, Any]) -> R:
        """The result :meth:`to_dict` described; :class:`~gna_interp.errors.InputError` for a malformed one."""
        raise NotImplementedError(f"{cls.__name__} cannot be rebuilt from data (from_dict)")

    def to_frame(self) -> pd.DataFrame:
        """The result as a table; by default one row of :meth:`to_dict`'s scalar fields."""
        return pd.DataFrame([dict(self._scalars())])

    # ---- one file ----------------------------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write :meth:`to_dict` as a :attr:`FORMAT` document to ``path`` (a ``.json`` file, or a folder: its
        :attr:`FILE`), atomically; return the file."""
        return self._write(path)

    @classmethod
    def load(cls: type[R], path: str | os.PathLike) -> R:
        """Read what :meth:`save` wrote (the file, or the folder holding it); an
        :class:`~gna_interp.errors.InputError` naming the file for a file of another kind, version or shape."""
        return cls._read(path)

    def _write(self, path: str | os.PathLike, **extra: Any) -> Path:
        """:meth:`to_dict` and the ``extra`` fields (a ``run_id``) as a :attr:`FORMAT` document at ``path`` (a file,
        or a folder: its :attr:`FILE`); returns the file."""
        return write_json(file_in(path, self.FILE), self.FORMAT, {**self.to_dict(), **extra}, indent=self.INDENT)

    @classmethod
    def _read(cls: type[R], path: str | os.PathLike, run_id: str | None = None) -> R:
        """The result of the :attr:`FORMAT` document at ``path`` (a file, or a folder: its :attr:`FILE`; given
        ``run_id``, the document must carry it); errors name the file."""
        p = file_in(path, cls.FILE)
        doc = read_json(p, cls.FORMAT, run_id)
        try:
            return cls.from_dict(doc)
        except InputError as e:
            raise InputError(f"{str(p)!r}: {e}") from None

    # ---- figure ------------------------------------------------------------------------------------------------
    def plot(self, **kwargs: Any) -> Any:
        """The result's plotly figure: what its ``figure(**kwargs)`` draws. A result type without a figure raises
        :class:`NotImplementedError` naming the type, its table (:meth:`to_frame`) and, where one exists, the
        function of :mod:`gna_interp.viz` that draws it (:attr:`DRAWN_BY`)."""
        figure = getattr(self, "figure", None)
        if not callable(figure):
            elsewhere = f"; {self.DRAWN_BY} draws it" if self.DRAWN_BY else ""
            raise NotImplementedError(f"{type(self).__name__} has no figure of its own: its numbers are in "
                                      f".to_frame(){elsewhere}")
        return figure(**kwargs)

    # ---- display -----------------------------------------------------------------------------------------------
    def _repr_title(self) -> tuple[str, str]:
        """The display's title and the note after it."""
        return type(self).__name__, ""

    def _repr_facts(self) -> list[tuple[str, Any]]:
        """The display's ``key: value`` lines; by default :meth:`to_dict`'s scalar fields."""
        return [(k, html_repr.fmt(v)) for k, v in self._scalars()]

    def _repr_html_(self) -> str:
        """Jupyter's display: :meth:`_repr_title`, :meth:`_repr_facts` and the first :data:`REPR_ROWS` rows of
        :meth:`to_frame` (numbers to three decimals), every text escaped."""
        text, note = self._repr_title()
        parts = [html_repr.title(text, note)]
        facts = self._repr_facts()
        if facts:
            parts.append(html_repr.facts(facts))
        df = self.to_frame()
        if len(df):
            head = df.head(REPR_ROWS)
            if len(df) > len(head):
                parts.append(html_repr.title(f"first {len(head)} of {len(df)} rows", ".to_frame() has every one"))
            parts.append(html_repr.table([str(c) for c in head.columns],
                                         [[html_repr.fmt(v) for v in row] for row in head.itertuples(index=False)]))
        return html_repr.block(parts)

    def _scalars(self) -> list[tuple[str, Any]]:
        return [(k, v) for k, v in self.to_dict().items()
                if k not in ("format", "format_version") and (v is None or isinstance(v, (str, bool, numbers.Number)))]
