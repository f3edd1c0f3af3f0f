"""Self-contained HTML pages: the circuitsvis and plotly JavaScript embedded once per page, no network.

Every piece of HTML is a template of :mod:`gna_interp.templates`, rendered with its one escaping rule; the pages'
own JavaScript and CSS are files under ``gna_interp/viz/static`` (:func:`asset`), inlined into the page so it needs
no network.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from gna_interp.templates import Markup, part, render, script_json

__all__ = ["HTMLView", "IsolatedParts", "asset", "circuitsvis_bundle", "circuitsvis_widget", "display_tokens", "figure_div", "one_line",
           "page", "part", "render", "script_json"]

_HERE = Path(__file__).parent

LINE_BREAK = "\u23ce"  # ⏎: how a newline inside a token shows in a widget that draws text on one line


def display_tokens(labels: list[str]) -> list[str]:
    """Token labels as a one-line widget (circuitsvis) should draw them: a newline becomes ⏎, which the widget
    would otherwise draw as a space, so the separators of ``"apple:12\\n"`` stay visible."""
    return [t.replace("\r\n", LINE_BREAK).replace("\n", LINE_BREAK) for t in labels]


@lru_cache(maxsize=None)
def asset(name: str) -> Markup:
    """The shipped static file ``gna_interp/viz/static/<name>`` (JavaScript or CSS), as markup to inline into a
    ``<script>`` or ``<style>`` element; a file that could end that element early is refused."""
    text = (_HERE / "static" / name).read_text(encoding="utf-8")
    if "</script" in text.lower() or "</style" in text.lower():
        raise ValueError(f"static file {name} holds a closing tag, which would end its element early")
    return Markup(text)


@lru_cache(maxsize=1)
def circuitsvis_bundle() -> str:
    """The circuitsvis browser bundle shipped inside the installed ``circuitsvis`` package."""
    import circuitsvis

    path = Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js"
    return path.read_text(encoding="utf-8").replace("</script>", "<\\/script>")


def circuitsvis_widget(element: str, **props: Any) -> str:
    """One circuitsvis React element (e.g. ``AttentionHeads``) as a ``<div>`` plus its render call.

    The page must include :func:`circuitsvis_bundle` once, before the widgets (see :func:`page`). The props
    (token strings included) are embedded with :func:`script_json`, so no token can break out of the script.
    """
    from circuitsvis.utils.convert_props import convert_prop_type

    if not element.isidentifier():
        raise ValueError(f"a circuitsvis element is a JavaScript name, got {element!r}")
    return render("cv_widget.html", div_id=f"cv-{uuid.uuid4().hex[:12]}", element=element,
                  props={k: convert_prop_type(v) for k, v in props.items() if v is not None})


def figure_div(fig: Any, div_id: str | None = None) -> str:
    """A plotly figure as an HTML fragment (``<div>`` + render call) that uses the page's plotly JS
    (:func:`page` with ``plotly=True``); the figure's own ``layout.height`` sets its height. ``div_id`` names
    the ``<div>`` (letters, digits, ``-`` and ``_``), for a script that listens to the plot's events."""
    if div_id is not None and not (div_id and all(c.isascii() and (c.isalnum() or c in "-_") for c in div_id)):
        raise ValueError(f"a figure's div id is letters, digits, '-' and '_' only, got {div_id!r}")
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


@dataclass(frozen=True, repr=False)
class HTMLView:
    """An HTML fragment plus the JS bundles it needs; displays itself in Jupyter / VS Code notebooks.

    ``str(view)`` and ``view.fragment`` are the bare fragment, for a page that embeds the bundles once
    itself (:func:`page` accepts views as sections); ``view.page()`` is a standalone offline document and
    ``view.save(path)`` writes it. In a notebook the view renders as an ``<iframe srcdoc>`` holding that
    document, so it needs no network and no trusted-script support from the frontend.
    """

    fragment: str
    title: str = "gna_interp"
    circuitsvis: bool = False
    plotly: bool = False
    heading: bool = True  # whether page() starts with <h1>title</h1>
    frame_height: int = 600  # the iframe's height before its content sizes it

    def page(self) -> str:
        """The fragment as a complete offline HTML document, each needed bundle inlined once."""
        return page(self.title, [self.fragment], circuitsvis=self.circuitsvis, plotly=self.plotly,
                    heading=self.heading)

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`page` to ``path`` atomically (:func:`~gna_interp.store.atomic_write`) and return the path."""
        from gna_interp.store import atomic_write

        return atomic_write(path, self.page())

    def _repr_html_(self) -> str:
        """Notebook display: an iframe whose ``srcdoc`` is :meth:`page` (plus a script that fits its height)."""
        doc = page(self.title, [self.fragment, render("script.html", script=asset("fit_frame.js"))],
                   circuitsvis=self.circuitsvis, plotly=self.plotly, heading=self.heading)
        return render("iframe.html", title=self.title, height=int(self.frame_height), doc=doc)

    def __str__(self) -> str:
        return self.fragment

    def __repr__(self) -> str:
        needs = [n for n, on in (("circuitsvis", self.circuitsvis), ("plotly", self.plotly)) if on]
        return (f"<HTMLView {self.title!r}: {len(self.fragment):,} chars of HTML"
                f"{' using ' + ', '.join(needs) if needs else ''}; .save(path) writes a standalone page>")


def page(title: str, sections: Sequence[str | HTMLView], *, circuitsvis: bool = False, plotly: bool = False,
         heading: bool = True) -> str:
    """A complete HTML document with ``sections`` as its body and the needed JS bundles inlined once.

    :class:`HTMLView` sections are embedded as their fragments and switch on the bundles they need.
    """
    views = [s for s in sections if isinstance(s, HTMLView)]
    circuitsvis = circuitsvis or any(v.circuitsvis for v in views)
    plotly = plotly or any(v.plotly for v in views)
    plotly_js = ""
    if plotly:
        from plotly.offline import get_plotlyjs

        plotly_js = get_plotlyjs()
    return render("page.html", title=title, css=asset("page.css"), heading=heading,
                  sections=[Markup(str(s)) for s in sections], circuitsvis_js=Markup(circuitsvis_bundle()) if circuitsvis else None,
                  plotly_js=Markup(plotly_js) if plotly else None)


class IsolatedParts:
    """The parts of a result page, each built in isolation: a part that raises becomes a visible note (``Not
    drawn: ...``) in its place, and :attr:`failed` lists it (``"title: ErrorType: message"``, one line), so the page
    and the results beside it are still written.

    ``parts.add("Ablation curve", lambda: [figure_div(...)])`` appends the fragments the builder returns, under the
    heading ``title`` when it fails. Ctrl-C (``KeyboardInterrupt``) and ``SystemExit`` are not caught."""

    def __init__(self) -> None:
        self.sections: list[str] = []
        self.failed: list[str] = []

    def add(self, title: str, build: Any) -> bool:
        """Append the fragments ``build()`` returns; on an exception append a note instead and return False."""
        try:
            got = build()
        except Exception as e:  # noqa: BLE001 -- a part that cannot be drawn must not sink the page
            self.fail(title, e)
            return False
        self.sections += [got] if isinstance(got, str) else list(got)
        return True

    def fail(self, title: str, error: BaseException | str, note: str | None = None) -> None:
        """Record ``title`` as not drawn (``error``: the exception or the reason) and put a note in its place
        (``note``: that note's text, default ``Not drawn: ...``)."""
        why = one_line(error)
        self.failed.append(f"{title}: {why}")
        text = note if note is not None else f"Not drawn: {why}. The results files are complete."
        self.sections += [part("heading", title), part("note", text)]


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """An exception (``Type: message``) or a text as one line of at most ``limit`` characters."""
    text = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else str(error)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + "..."
