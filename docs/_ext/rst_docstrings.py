"""Griffe extension for the docs site: render the reST bits of gna_interp's docstrings as Markdown.

The package writes Google-style docstrings (``Attributes:`` sections) whose prose uses a little reST:
Sphinx cross-reference roles (``:class:`~gna_interp.models.Model```), literal blocks introduced by
``::`` and simple tables (``=====  =====``). mkdocstrings reads docstrings as Markdown, so before they
are parsed this extension rewrites, in every docstring of the package:

- each role into an *optional* autorefs cross-reference (a link where the target is rendered on the
  site, plain code otherwise; it never fails a strict build). Relative targets (``:meth:`save```,
  ``:class:`Task```) are resolved from the scope of the documented object;
- a paragraph ending in ``::`` into one ending in ``:`` (the indented block after it already is a
  Markdown code block);
- simple reST tables into Markdown tables;
- a ``Class attributes:`` section title into ``Attributes:``, the Google section mkdocstrings
  renders as a table (it would otherwise show the entries as one run-on paragraph).

Loaded from ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``). It only
changes what the site shows: the package itself is not touched.
"""

from __future__ import annotations

import html
import re
from typing import Any

from griffe import Extension, Object

ROLE_RE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|data|attr|exc|obj|const):`(?P<body>[^`]+)`")
BORDER_RE = re.compile(r"^(?P<indent> *)(=+)( +=+)* *$")


def _target(body: str) -> tuple[str, str]:
    """``(title, target)`` of a role's body: ``Title <target>``, ``~a.b.C`` (title ``C``) or ``a.b.C``."""
    m = re.fullmatch(r"\s*(?P<title>.+?)\s*<(?P<target>[^<>]+)>\s*", body)
    if m:
        return m["title"], m["target"].lstrip("~")
    target = body.strip()
    if target.startswith("~"):
        target = target[1:]
        return target.rsplit(".", 1)[-1], target
    return target, target


def _resolve(obj: Object, target: str) -> str | None:
    """The full path of ``target`` seen from ``obj`` (``None`` when it cannot be resolved)."""
    if target.startswith("gna_interp.") or target == "gna_interp":
        return target
    first, _, rest = target.partition(".")
    scope: Any = obj
    while scope is not None:
        try:
            path = scope.resolve(first)
        except Exception:  # griffe raises NameResolutionError (or a lookup error) for unknown names
            path = None
        if path:
            return f"{path}.{rest}" if rest else path
        scope = scope.parent
    return None


def _roles(obj: Object, text: str) -> str:
    def repl(m: re.Match[str]) -> str:
        title, target = _target(m["body"])
        if m["role"] in ("func", "meth") and not title.endswith(")"):
            title += "()"
        code = f"<code>{html.escape(title)}</code>"
        path = _resolve(obj, target)
        if path is None or not path.startswith("gna_interp"):
            return code
        return f'<autoref identifier="{html.escape(path, quote=True)}" optional>{code}</autoref>'

    return ROLE_RE.sub(repl, text)


def _cells(line: str, spans: list[tuple[int, int]]) -> list[str]:
    """A table row cut at the column spans (the last column runs to the end of the line)."""
    out = []
    for i, (start, stop) in enumerate(spans):
        end = None if i == len(spans) - 1 else spans[i + 1][0]
        out.append(line[start:end].strip() if end is not None else line[start:].strip())
    return out


def _tables(text: str) -> str:
    """Simple reST tables (border, header, border, rows, border) as Markdown tables."""
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = BORDER_RE.match(lines[i])
        ends = [j for j in range(i + 1, len(lines)) if BORDER_RE.match(lines[j]) and lines[j] == lines[i]]
        if not m or len(ends) < 2:
            out.append(lines[i])
            i += 1
            continue
        border = lines[i]
        spans = [(s.start(), s.end()) for s in re.finditer(r"=+", border)]
        head_end, table_end = ends[0], ends[1]
        header = [" ".join(c) for c in zip(*(_cells(row, spans) for row in lines[i + 1:head_end]))]
        rows = [_cells(row, spans) for row in lines[head_end + 1:table_end] if row.strip()]
        indent = m["indent"]
        if out and out[-1].strip():
            out.append("")
        out.append(indent + "| " + " | ".join(header) + " |")
        out.append(indent + "|" + "|".join("---" for _ in spans) + "|")
        out += [indent + "| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]
        i = table_end + 1
    return "\n".join(out)


def _literal_blocks(text: str) -> str:
    """``text::`` before an indented block becomes ``text:`` (a bare ``::`` line disappears)."""
    text = re.sub(r"(?m)^[ \t]*::[ \t]*$", "", text)
    return re.sub(r"(?m)(\S)::[ \t]*$", r"\1:", text)


def _sections(text: str) -> str:
    """Google section titles griffe does not know, renamed to the ones it does."""
    return re.sub(r"(?m)^([ \t]*)Class attributes:[ \t]*$", r"\1Attributes:", text)


def rewrite(obj: Object, text: str) -> str:
    """The docstring ``text`` of ``obj`` with its reST turned into Markdown."""
    return _roles(obj, _literal_blocks(_tables(_sections(text))))


class RstDocstrings(Extension):
    """Rewrite the reST parts of every docstring of a loaded package (see the module docstring)."""

    def on_package(self, *, pkg: Object, **kwargs: Any) -> None:
        seen: set[int] = set()
        stack: list[Object] = [pkg]
        while stack:
            obj = stack.pop()
            if id(obj) in seen:
                continue
            seen.add(id(obj))
            if obj.docstring is not None:
                obj.docstring.value = rewrite(obj, obj.docstring.value)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
