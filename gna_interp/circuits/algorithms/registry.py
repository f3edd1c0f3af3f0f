"""The registry of discovery algorithms: ``@algorithm("eap")`` registers a function ``(model, task, **options) ->
GraphScores`` under a name, :func:`score_graph` runs one by its name. Every module of
:mod:`gna_interp.circuits.algorithms` but this one and :mod:`~gna_interp.circuits.algorithms.scores` is an
algorithm: they are imported on first use, so adding one is adding its file."""

from __future__ import annotations

import difflib
import functools
import importlib
import inspect
import pkgutil
import time
from dataclasses import replace
from typing import Any, Callable, Protocol

from gna_interp.circuits.algorithms.scores import GraphScores
from gna_interp.errors import InputError, OptionError
from gna_interp.models.model import Model
from gna_interp.options import check_names
from gna_interp.registry import Registry
from gna_interp.tasks.base import Task

__all__ = ["Algorithm", "algorithm", "algorithms", "get_algorithm", "score_graph", "unregister_algorithm"]

PACKAGE = "gna_interp.circuits.algorithms"
_NOT_ALGORITHMS = ("registry", "scores")


class Algorithm(Protocol):
    """The one signature: the model, the task and keyword options in, one :class:`GraphScores` out."""

    def __call__(self, model: Model, task: Task, **options: Any) -> GraphScores: ...


_REGISTRY: Registry[Algorithm] = Registry("discovery algorithm", OptionError)
_LOADED: list[str] = []  # the package's algorithm modules, once imported


def _load() -> None:
    """Import every algorithm module of the package (once): each registers itself."""
    if _LOADED:
        return
    package = importlib.import_module(PACKAGE)
    names = [m.name for m in pkgutil.iter_modules(package.__path__) if m.name not in _NOT_ALGORITHMS]
    _LOADED.extend(names)
    for name in names:
        importlib.import_module(f"{PACKAGE}.{name}")


def algorithm(name: str) -> Callable[[Callable[..., GraphScores]], Algorithm]:
    """Register the decorated function as discovery algorithm ``name`` (lower case, not taken). The function takes
    ``(model, task, **options)`` and returns a :class:`GraphScores`; the registered function (returned) fills in its
    ``algorithm`` and ``seconds``."""
    _load()

    def register(fn: Callable[..., GraphScores]) -> Algorithm:
        @functools.wraps(fn)
        def timed(model: Model, task: Task, **options: Any) -> GraphScores:
            start = time.perf_counter()
            out = fn(model, task, **options)
            if not isinstance(out, GraphScores):
                raise InputError(f"discovery algorithm {name!r} returned a {type(out).__name__}, not GraphScores")
            return replace(out, algorithm=name, seconds=time.perf_counter() - start)

        return _REGISTRY.add(name, timed)

    return register


def unregister_algorithm(name: str) -> None:
    """Forget discovery algorithm ``name``."""
    _load()
    _REGISTRY.remove(name)


def algorithms() -> tuple[str, ...]:
    """The registered algorithms' names, the package's first."""
    _load()
    return _REGISTRY.names()


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; an :class:`OptionError` naming the closest one for an unknown name."""
    known = algorithms()
    if name not in known:
        close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise OptionError(f"unknown discovery algorithm {name!r}{hint} Registered: {', '.join(known)}")
    return _REGISTRY.get(name)


def score_graph(model: Model, task: Task, name: str, **options: Any) -> GraphScores:
    """Score ``model``'s graph on ``task`` with the algorithm registered as ``name`` and its ``options`` (an unknown
    option is refused naming the closest one)."""
    fn = get_algorithm(name)
    params = inspect.signature(fn).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params):
        check_names(options, [p.name for p in params if p.kind is p.KEYWORD_ONLY], f"discovery algorithm {name!r}")
    return fn(model, task, **options)
