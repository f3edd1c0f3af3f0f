"""Progress bars, decided in one place: every bar of gna_interp comes from :func:`tqdm` here.

Whether and how a bar shows:

1. off when the caller says ``progress=False`` (or ``disable=True``), when :func:`set_quiet` is on (``gna --quiet``
   sets it) or when the ``TQDM_DISABLE`` environment variable is set to anything but ``""``, ``0``, ``false``,
   ``no`` or ``off``; (tqdm reads ``TQDM_DISABLE`` only for bars that pass no ``disable=``, and ours pass one);
2. in a Jupyter kernel: tqdm's widget bar (``ipywidgets``, in the ``dev`` extra); without ipywidgets, plain lines
   rather than tqdm's ``TqdmWarning: IProgress not found``;
3. on a terminal (the bar's stream is a tty): tqdm's usual bar;
4. anywhere else (a log file, a pipe, CI): plain lines, one when the stage starts, then at most one every
   :data:`LINE_INTERVAL_S` seconds and one when it ends, with no carriage returns or cursor movement.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterable

LINE_INTERVAL_S = 10.0  # a stage in a log says where it is at least this often (when it makes progress)
_LINE_FORMAT = "{desc}: {n_fmt}/{total_fmt} {unit} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
_FALSE = {"", "0", "false", "no", "off"}
_quiet = False


def set_quiet(quiet: bool = True) -> bool:
    """Turn every gna_interp progress bar off (``True``) or back to the default (``False``) for this process;
    returns the previous setting (to restore it). The bars of transformers and huggingface_hub (shard loading and
    writing, downloads) go with ours: :func:`third_party_bars` is called with the new setting."""
    global _quiet
    was, _quiet = _quiet, bool(quiet)
    third_party_bars(not _all_quiet())
    return was


_silenced: set[str] = set()  # the libraries whose bars set_quiet turned off (and so turns back on)


def third_party_bars(on: bool) -> None:
    """Switch the progress bars of transformers (``transformers.utils.logging.disable_progress_bar``: "Loading
    weights", "Writing model shards") and huggingface_hub (``huggingface_hub.utils.disable_progress_bars``:
    downloads) off, or back on where this function turned them off (a bar the user switched off stays off).
    A library that is not imported yet is left alone: nothing of it has shown, and it is switched when imported
    only if :func:`set_quiet` runs again; ``gna --quiet`` calls this before any model loads."""
    for name, off, on_, is_on in (
            ("transformers", "transformers.utils.logging:disable_progress_bar",
             "transformers.utils.logging:enable_progress_bar", "transformers.utils.logging:is_progress_bar_enabled"),
            ("huggingface_hub", "huggingface_hub.utils:disable_progress_bars",
             "huggingface_hub.utils:enable_progress_bars", "huggingface_hub.utils:are_progress_bars_disabled")):
        if not on and name not in sys.modules:
            try:  # both are light to import next to torch; a missing one has no bars to silence
                __import__(name)
            except Exception:  # noqa: BLE001
                continue
        if name not in sys.modules:
            continue
        try:
            fns = [_resolve(x) for x in (off, on_, is_on)]
        except Exception:  # noqa: BLE001 -- an older or newer library without these switches
            continue
        enabled_now = fns[2]() if name == "transformers" else not fns[2]()
        if not on and enabled_now:
            fns[0]()
            _silenced.add(name)
        elif on and name in _silenced:
            fns[1]()
            _silenced.discard(name)


def _resolve(path: str) -> Any:
    import importlib

    module, attr = path.split(":")
    return getattr(importlib.import_module(module), attr)


def quiet() -> bool:
    """Whether bars are off for the whole process: :func:`set_quiet` or the ``TQDM_DISABLE`` environment variable."""
    return _all_quiet()


def _all_quiet() -> bool:
    return _quiet or os.environ.get("TQDM_DISABLE", "").strip().lower() not in _FALSE


def enabled(progress: bool = True) -> bool:
    """Whether a bar the caller asks for (``progress``) shows at all."""
    return bool(progress) and not quiet()


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (where bars are widgets)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and "IPKernelApp" in shell.config
    except Exception:  # noqa: BLE001 -- an odd IPython: treat as no notebook
        return False


def _widgets() -> bool:
    try:
        from tqdm.notebook import IProgress
    except Exception:  # noqa: BLE001
        return False
    return IProgress is not None


def on_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default ``sys.stderr``, where bars go) is a terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001 -- a stream without isatty, or a closed one
        return False


def terminal_bars() -> bool:
    """Whether a third-party bar we cannot restyle (transformers' GGUF de-quantising) may show: only on a
    terminal with bars on; in notebooks, logs and under ``--quiet`` / ``TQDM_DISABLE`` it is silenced."""
    return not quiet() and not in_notebook() and on_terminal()


class _Lines:
    """A stream wrapper for :class:`LineBar`: it passes whole lines and drops tqdm's bare ``\\r`` / ``\\n``."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(text) if text.strip() else 0

    def flush(self) -> None:
        flush = getattr(self.stream, "flush", None)
        if flush is not None:
            flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _line_bar_class() -> type:
    from tqdm.std import tqdm as std_tqdm

    class LineBar(std_tqdm):  # type: ignore[misc,valid-type]
        """tqdm that writes plain lines: for logs and pipes."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["file"] = _Lines(kwargs.get("file") or sys.stderr)
            kwargs.setdefault("mininterval", LINE_INTERVAL_S)
            if kwargs.get("total", getattr(args[0] if args else kwargs.get("iterable"), "__len__", None)) is not None:
                kwargs.setdefault("bar_format", _LINE_FORMAT)
            super().__init__(*args, **kwargs)

        def display(self, msg: str | None = None, pos: int | None = None) -> bool:
            if msg == "":  # tqdm clearing a leave=False bar: nothing to take back in a log
                return True
            text = self.__str__() if msg is None else msg
            self.fp.write(text.rstrip() + "\n")
            self.fp.flush()
            return True

    return LineBar


def tqdm(iterable: Iterable[Any] | None = None, *args: Any, progress: bool = True, disable: bool | None = False,
         **kwargs: Any) -> Any:
    """A progress bar (a drop-in for ``tqdm.auto.tqdm``) shown or not, and in which form, as the module doc says.

    ``progress=False`` or ``disable=True`` turn it off; ``disable=None`` (tqdm's "off when not a tty") means
    plain lines there instead. Always returns a tqdm object, so ``with``, ``update`` and ``set_postfix`` work.
    """
    from tqdm.std import tqdm as std_tqdm

    if disable is True or not enabled(progress):
        return std_tqdm(iterable, *args, disable=True, **kwargs)
    if in_notebook():
        if _widgets():
            from tqdm.notebook import tqdm as notebook_tqdm

            return notebook_tqdm(iterable, *args, **kwargs)
        return _line_bar_class()(iterable, *args, **kwargs)
    if on_terminal(kwargs.get("file")):
        return std_tqdm(iterable, *args, **kwargs)
    return _line_bar_class()(iterable, *args, **kwargs)
