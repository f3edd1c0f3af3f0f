"""Errors raised by gna_interp. Each message says what was wrong and what to do."""

from __future__ import annotations


class GnaError(Exception):
    """Base class of every gna_interp error."""


class UnknownModelError(GnaError, ValueError):
    """A model spec that is neither an alias, a path, a zoo name nor a hub id."""


class ModelPathError(GnaError, FileNotFoundError):
    """A spec that names a local path which does not exist or is not a model."""


class ModelUnavailableError(GnaError, OSError):
    """A hub id that cannot be fetched (no network, no such repo)."""


class GGUFError(GnaError, ValueError):
    """A `.gguf` file that cannot be read as a causal language model."""


class UnsupportedArchitectureError(GnaError, ValueError):
    """An architecture that TransformerLens's bridge (or gna_interp) does not support."""


class HeadError(GnaError, ValueError):
    """A head name that does not parse, or a head that the model does not have."""


class InputError(GnaError, ValueError):
    """A prompt or tensor that cannot be fed to the model as given."""


class OptionError(InputError):
    """An option that does not exist (the message names the closest one) or has an invalid value."""


class BridgeOnlyError(GnaError, AttributeError):
    """A TransformerLens name that a :class:`~gna_interp.models.Model` does not carry (``W_U``, ``add_hook``, ...):
    the message says where it lives (``model.bridge.NAME``) or which method of the Model does the job."""


class GnaWarning(UserWarning):
    """Base class of every gna_interp warning."""


class ReportWarning(GnaWarning):
    """A part of a result page (a figure, a table, the PNG files, summary.md) that could not be drawn: the page and
    summary.md say which and why; the results files are complete."""


def terminal_text(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (an escape sequence in a folder name, a bell),
    bidirectional overrides and other invisible format characters written as ``\\xNN`` / ``\\uNNNN``; line breaks,
    carriage returns and tabs kept."""
    return "".join(c if c in "\n\r\t" or c.isprintable() or c == " "
                   else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}" for c in text)


def install_hint(extra: str) -> str:
    """The pip command that adds gna_interp's optional dependencies ``extra`` (an extra of pyproject.toml) to the
    installation this code runs from, as its ``direct_url.json`` records it: the source folder or wheel file it was
    installed from (``pip install '/src/gna_interp[figures]'``; ``-e`` for an editable install), the URL, else the
    package's name (``pip install 'gna-interp[figures]'``, for an install from a package index)."""
    import json
    import shlex
    from importlib.metadata import PackageNotFoundError, distribution
    from urllib.parse import unquote, urlparse

    try:
        info = json.loads(distribution("gna-interp").read_text("direct_url.json") or "{}")
    except (PackageNotFoundError, OSError, ValueError):
        info = {}
    url = info.get("url") if isinstance(info, dict) else None
    if not isinstance(url, str) or not url:
        return f"pip install 'gna-interp[{extra}]'"
    if url.startswith("file://"):
        editable = "-e " if isinstance(info.get("dir_info"), dict) and info["dir_info"].get("editable") else ""
        return f"pip install {editable}{shlex.quote(unquote(urlparse(url).path) + f'[{extra}]')}"
    return f"pip install {shlex.quote(f'gna-interp[{extra}] @ {url}')}"
