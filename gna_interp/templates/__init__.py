"""The HTML templates of every page, view and notebook display, and the one rule they escape by.

Each ``*.html`` file here is a Jinja2 template; :func:`render` fills one, :func:`part` calls one macro of
``parts.html`` (a heading, a note, a table, a list of links) or of ``repr.html`` (the pieces of the results'
``_repr_html_``). A value written into a template is escaped (``html.escape``, quotes included: safe in text and in
attributes) unless it is :class:`~markupsafe.Markup` -- markup another template, plotly or a shipped asset made. JSON
data goes into ``<script type="application/json">`` through the ``script_json`` filter (:func:`script_json`), which
no string can break out of.

Imports nothing from the package: every layer may use it.
"""

from __future__ import annotations

import html
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

__all__ = ["Markup", "escape", "part", "render", "script_json"]

# Inside <script>, the HTML parser ends the element at the first "</script" (and "<!--" changes how it scans), whatever
# JavaScript would make of it. Writing <, > and & as JSON escapes leaves the value the same and the script unbreakable;
# U+2028/2029 are line ends to older JavaScript parsers. A JSON text holds these characters only inside strings.
_SCRIPT_SAFE = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028",
                              "\u2029": "\\u2029"})


def script_json(value: Any) -> str:
    """``value`` as JSON that is safe to write inside a ``<script>`` element: no string in it (a token
    ``</script><script>alert(1)</script>``, say) can end the element or start markup; JavaScript reads the
    same value."""
    return json.dumps(value).translate(_SCRIPT_SAFE)


def escape(value: Any) -> Markup:
    """The one escaping rule of every template: markup (:class:`~markupsafe.Markup`, or anything with an
    ``__html__`` method) passes as it is, anything else is text (``html.escape``, quotes included)."""
    if hasattr(value, "__html__"):
        return Markup(value.__html__())
    return Markup(html.escape(str(value), quote=True))


def _json_filter(value: Any) -> Markup:
    return Markup(script_json(value))


@lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=True, finalize=escape,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["script_json"] = _json_filter
    return env


def render(template: str, **context: Any) -> str:
    """The template ``gna_interp/templates/<template>`` filled with ``context`` (escaped unless
    :class:`~markupsafe.Markup`)."""
    return str(_environment().get_template(template).render(**context))


def part(macro: str, *args: Any, library: str = "parts.html", **kwargs: Any) -> str:
    """One macro of the template ``library`` (``parts.html``: ``heading``, ``note``, ``table``, ``links``;
    ``repr.html``: the pieces of the results' displays), called with ``args`` and ``kwargs``."""
    return str(getattr(_environment().get_template(library).module, macro)(*args, **kwargs))
