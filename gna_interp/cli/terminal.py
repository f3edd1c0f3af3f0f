"""What ``gna`` prints goes through here: gna's own warnings as one line, and every stream escaped so that a name
read from a command line or a results file cannot drive the terminal."""

from __future__ import annotations

import sys
from typing import Any, Callable

from gna_interp.errors import GnaWarning, terminal_text


def one_line_warning(show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` that prints gna's own warnings (a report part not drawn, ...) as one line
    ``gna: warning: ...`` on stderr, with control characters escaped, and leaves the others to ``show``."""
    def one_line(message: Warning | str, category: type[Warning], *args: object, **kwargs: object) -> None:
        if issubclass(category, GnaWarning):
            print(f"gna: warning: {' '.join(str(message).split())}", file=sys.stderr, flush=True)
        else:
            show(message, category, *args, **kwargs)
    return one_line


class Escaping:
    """A text stream that writes through :func:`~gna_interp.errors.terminal_text`: a name read from a command line
    or a results file (a folder called ``\x1b[2J``, a stored label) cannot drive the terminal."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(terminal_text(text))
        return len(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
