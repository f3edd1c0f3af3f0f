"""`ResultFolder`: how every experiment writes its output folder (table, JSON document, report page).

=======================  ==================================================================
file                     what
=======================  ==================================================================
``NAME.csv``             the experiment's table (one row per measured point)
``NAME.json``            format ``NAME`` (:data:`gna_interp.store.FORMAT_VERSIONS`): settings,
                         the table's records and anything else the experiment keeps
``report.html``          title, notes, the figures (plotly, JS inlined) and the table
``figures/*.png``        the figures as PNG, where kaleido + a Chromium are available
=======================  ==================================================================

Every file is written atomically; the JSON document is written last (it vouches for the others).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd

from gna_interp.constants import FIGURES_DIR, REPORT_FILE, result_files
from gna_interp.errors import InputError, ReportWarning
from gna_interp.options import Options, options
from gna_interp.results import Result, folder_of
from gna_interp.store import atomic_write, make_folder, read_json, records, write_json
from gna_interp.viz.export import png_export_problem, write_pngs
from gna_interp.viz.html import IsolatedParts, figure_div, one_line, page, part


__all__ = ["ExperimentResult", "FIGURES_DIR", "PageParts", "REPORT_FILE", "ResultFolder", "doc_table", "table_html"]


def doc_table(doc: Mapping[str, Any], columns: Sequence[str] | None = None) -> pd.DataFrame:
    """The ``table`` records of a result document (what :meth:`ResultFolder.write` adds) as a DataFrame, with
    ``columns`` in their order when given (a column the records lack is NaN)."""
    df = pd.DataFrame(doc.get("table") or [])
    return df.reindex(columns=list(columns)) if columns is not None else df


def table_html(df: pd.DataFrame, digits: int = 3, max_rows: int = 200) -> str:
    """A plain HTML table of ``df`` (floats to ``digits`` places, at most ``max_rows`` rows)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.{digits}f}"
        return str(v)

    rows = [[cell(v) for v in r] for _, r in df.head(max_rows).iterrows()]
    more = part("note", f"{len(df) - max_rows} more rows in the CSV") if len(df) > max_rows else ""
    return part("table", [str(c) for c in df.columns], rows) + more


def _draw(name: str, fig: Any, drawn: dict[str, Any]) -> list[str]:
    """The figure ``fig`` (or the one the zero-argument callable ``fig`` builds) as a page fragment; kept in
    ``drawn`` for the PNG export once it is drawn."""
    fig = fig() if callable(fig) else fig
    out = [figure_div(fig)]
    drawn[name] = fig
    return out


@options
class PageParts(Options):
    """What a result page shows above its table: ``notes`` (one line each), ``figures`` (name -> plotly figure, or a
    zero-argument callable that builds it, also written as PNGs; each is built and drawn in isolation: one that fails
    is a note on the page) and ``sections`` (extra HTML fragments placed after the figures)."""

    figures: Mapping[str, Any] | None = None
    notes: Sequence[str] = ()
    sections: Sequence[str] = ()


class ResultFolder:
    """The output folder of one experiment named ``name`` (``eval``, ``prune``, ``mask``, ...).

    ``ResultFolder(out, "prune").write(table, doc, title=..., figures={...}, notes=[...])`` writes
    ``prune.csv``, ``prune.json`` (format ``prune``), ``report.html`` and the PNGs; :meth:`load` reads
    the JSON document back.
    """

    def __init__(self, out: str | os.PathLike, name: str) -> None:
        self.path, self.name = folder_of(out, result_files(name)[0]), name  # the folder or its JSON
        if self.path.exists() and not self.path.is_dir():
            raise InputError(f"--out {str(self.path)!r} is an existing file, not a folder; pick a folder path")

    @property
    def csv(self) -> Path:
        return self.path / result_files(self.name)[1]

    @property
    def json(self) -> Path:
        return self.path / result_files(self.name)[0]

    @property
    def report(self) -> Path:
        return self.path / REPORT_FILE

    def write(self, table: pd.DataFrame, doc: Mapping[str, Any], *, title: str, parts: PageParts | None = None,
              png: bool = True, **overrides: Any) -> Path:
        """Write the table, the page and the JSON document (``doc`` plus the table's records under
        ``"table"``); return the folder. ``parts`` (:class:`PageParts`) or keyword ``overrides`` of its fields
        (``figures``, ``notes``, ``sections``) fill the page above the table."""
        shown = PageParts.build(parts, **overrides)
        figures, notes, sections = shown.figures, shown.notes, shown.sections
        make_folder(self.path)
        atomic_write(self.csv, table.to_csv(index=False))
        figures = dict(figures or {})
        parts = IsolatedParts()  # each figure and the table built in isolation: one that fails is a note
        parts.sections += [part("note", n) for n in notes]
        drawn: dict[str, Any] = {}
        for name, fig in figures.items():
            parts.add(f"Figure {name}", lambda name=name, fig=fig: _draw(name, fig, drawn))
        parts.sections += list(sections)
        parts.add("Table", lambda: [part("heading", "Table"), table_html(table)])
        if png and drawn:
            problem = png_export_problem()
            if problem is None:
                try:
                    write_pngs(drawn, self.path / FIGURES_DIR)
                except Exception as e:  # noqa: BLE001 -- the page has the same figures
                    parts.fail("PNG figures", e, note=f"PNG figures not written: {one_line(e.args[0] if isinstance(e, RuntimeError) and e.args else e)}")
            else:
                parts.sections.append(part("note", f"PNG figures not written: {problem}"))
        atomic_write(self.report, page(title, parts.sections, plotly=bool(drawn)))
        write_json(self.json, self.name, {**doc, "table": records(table)})
        for failed in parts.failed:
            warnings.warn(f"report part not drawn ({failed}); report.html says so", ReportWarning, stacklevel=2)
        return self.path

    def load(self) -> dict[str, Any]:
        """The JSON document written by :meth:`write` (its table as a DataFrame under ``"frame"``)."""
        doc = read_json(self.json, self.name)
        doc["frame"] = doc_table(doc)
        return doc


@dataclass
class ExperimentResult(Result):
    """The result of an experiment, a dataclass whose folder is the :class:`ResultFolder` named after its format.

    A subclass names its format as a class keyword (``class Sweep(ExperimentResult, format="sweep")``) and gets
    :attr:`FORMAT`, :attr:`FILE` (``FORMAT.json``) and :meth:`folder`, where its ``save`` writes. Every experiment
    result keeps, as keyword-only fields, the options it ran with (``settings``) and its sentences on the run
    (``notes``: how heads were chosen, the checks, what was left out); :meth:`run_fields` reads both back from a
    document.
    """

    _: KW_ONLY
    settings: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def __init_subclass__(cls, format: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if format is not None:
            cls.FORMAT, cls.FILE = format, result_files(format)[0]

    @staticmethod
    def run_fields(d: Mapping[str, Any]) -> dict[str, Any]:
        """``settings`` and ``notes`` of the document ``d`` (what ``to_dict`` wrote), as keyword arguments."""
        return {"settings": dict(d.get("settings") or {}), "notes": list(d.get("notes") or [])}

    def folder(self, path: str | os.PathLike) -> ResultFolder:
        """The output folder ``path`` (or the folder of ``path`` naming :attr:`FILE`)."""
        return ResultFolder(path, self.FORMAT)
