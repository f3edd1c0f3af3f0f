"""Load a task saved with :meth:`Task.to_dict` (e.g. next to a circuit), in a new process.

Every dict carries ``format_version`` and ``kind``:

- ``"kv"``: :class:`KVRetrieval` arguments (``args``); the seeded rebuild gives identical samples;
- ``"mc"``: :class:`MultipleChoice` arguments plus the questions themselves (the hub or file they
  came from need not be at hand), rebuilt through the constructor;
- ``"knowledge"``: :class:`Knowledge` arguments (``args``); the seeded rebuild gives identical samples;
- ``"samples"``: any other task (e.g. one wrapped in a chat template), its samples stored whole.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from gna_interp.errors import InputError
from gna_interp.tasks.base import FORMAT_VERSION, Task
from gna_interp.tasks.knowledge import Knowledge
from gna_interp.tasks.kv import KVRetrieval
from gna_interp.tasks.mmlu import MultipleChoice, Question
from gna_interp.tasks.sample import JSON_SCALARS, Sample
from gna_interp.tasks.segments import CharSegments

__all__ = ["KINDS", "sample_from_dict", "task_from_dict"]

_INT, _STR, _OPT_STR = (int,), (str,), (str, type(None))


def _get(d: Mapping[str, Any], key: str, types: tuple[type, ...], where: str) -> Any:
    """``d[key]``, checked to be one of ``types`` (``bool`` never passes for ``int``)."""
    if key not in d:
        raise InputError(f"{where} lacks {key!r}; it has {sorted(d)}. Save tasks with Task.to_dict()")
    value = d[key]
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        names = " or ".join("null" if t is type(None) else t.__name__ for t in types)
        raise InputError(f"{where}: {key!r} must be {names}, got {value!r} ({type(value).__name__})")
    return value


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{where} must be a JSON object (dict), got {type(value).__name__}")
    return value


def _span(value: Any, where: str) -> tuple[int, int]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in value)):
        raise InputError(f"{where} must be a [start, end] pair of integers, got {value!r}")
    return int(value[0]), int(value[1])


def _args(d: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]], where: str) -> dict[str, Any]:
    args = _get(d, "args", (Mapping,), where)
    unknown = sorted(set(args) - set(schema))
    if unknown:
        raise InputError(f"{where} 'args' has unknown argument(s) {unknown}; this gna_interp knows {sorted(schema)}")
    return {k: _get(args, k, types, f"{where} 'args'") for k, types in schema.items() if k in args}


def sample_from_dict(d: Mapping[str, Any]) -> Sample:
    """The :class:`Sample` that :meth:`Sample.to_dict` wrote."""
    d = _mapping(d, "a sample")
    where = "sample"
    candidates = _get(d, "candidates", (list, tuple), where)
    if not all(isinstance(c, str) for c in candidates):
        raise InputError(f"sample 'candidates' must be strings, got {candidates!r}")
    spans = _get(d, "spans", (Mapping,), where)
    items = _get(spans, "items", (list, tuple), "sample 'spans'")
    query = _get(spans, "query", (list, tuple, type(None)), "sample 'spans'")
    meta = _get(d, "meta", (Mapping,), where)
    bad = {k: v for k, v in meta.items() if not isinstance(v, JSON_SCALARS)}
    if bad:
        raise InputError(f"sample 'meta' values must be JSON scalars, got {bad!r}")
    return Sample(_get(d, "prompt", _STR, where), tuple(candidates), _get(d, "gold", _INT, where),
                  CharSegments(tuple(_span(s, "a span in 'items'") for s in items),
                               None if query is None else _span(query, "the 'query' span")),
                  _get(d, "cue_start", _INT, where), dict(meta))


def _load_samples(d: Mapping[str, Any]) -> Task:
    samples = _get(d, "samples", (list, tuple), "task dict")
    return Task(_get(d, "name", _STR, "task dict"), [sample_from_dict(s) for s in samples])


KV_ARGS: dict[str, tuple[type, ...]] = {"n_pairs": _INT, "n_samples": _INT, "seed": _INT, "template": _STR,
                                        "max_value": _INT, "words": (list, tuple, type(None)),
                                        "value_suffix": _OPT_STR}


def _load_kv(d: Mapping[str, Any]) -> Task:
    args = _args(d, KV_ARGS, "kv task dict")
    suffix = args.pop("value_suffix", None)
    task = KVRetrieval(**args)
    if suffix is not None and suffix != task.value_suffix:
        task = task.with_value_suffix(suffix)
    task.name = _get(d, "name", _STR, "task dict")
    return task


MC_ARGS: dict[str, tuple[type, ...]] = {"format": _STR, "name": _STR, "header": _OPT_STR, "letter_prefix": _STR,
                                        "shots": (list, tuple)}


def _question(d: Any) -> Question:
    d = _mapping(d, "a question")
    choices = _get(d, "choices", (list, tuple), "question")
    if not all(isinstance(c, str) for c in choices):
        raise InputError(f"question 'choices' must be strings, got {choices!r}")
    return Question(_get(d, "question", _STR, "question"), tuple(choices), _get(d, "answer", _INT, "question"),
                    _get(d, "subject", _STR, "question") if "subject" in d else "")


def _load_mc(d: Mapping[str, Any]) -> Task:
    questions = [_question(q) for q in _get(d, "questions", (list, tuple), "mc task dict")]
    args = _args(d, MC_ARGS, "mc task dict")
    if "shots" in args:
        args["shots"] = [_question(q) for q in args["shots"]]
    task = MultipleChoice(questions, **args)
    task.name = _get(d, "name", _STR, "task dict")
    return task


KNOWLEDGE_ARGS: dict[str, tuple[type, ...]] = {"n_samples": _INT, "seed": _INT, "n_choices": _INT,
                                               "categories": (list, tuple, type(None))}


def _load_knowledge(d: Mapping[str, Any]) -> Task:
    task = Knowledge(**_args(d, KNOWLEDGE_ARGS, "knowledge task dict"))
    task.name = _get(d, "name", _STR, "task dict")
    return task


KINDS: dict[str, Callable[[Mapping[str, Any]], Task]] = {"kv": _load_kv, "mc": _load_mc, "knowledge": _load_knowledge,
                                                         "samples": _load_samples}


def task_from_dict(d: Mapping[str, Any]) -> Task:
    """Rebuild the task that :meth:`Task.to_dict` saved (after a JSON round trip or not).

    Raises :class:`InputError` for a dict of an unknown ``kind``, without ``format_version`` or
    written by a newer gna_interp (``format_version`` above this one's), or with malformed fields.
    """
    d = _mapping(d, "a saved task")
    if "format_version" not in d:
        raise InputError(f"this task dict has no 'format_version' (keys: {sorted(d)}); this gna_interp reads "
                         f"format_version 1..{FORMAT_VERSION}, as written by Task.to_dict()")
    version = d["format_version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= FORMAT_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > FORMAT_VERSION
        raise InputError(f"task dict has format_version={version!r}; this gna_interp reads format_version "
                         f"1..{FORMAT_VERSION}" + ("; upgrade gna_interp to load it" if newer else ""))
    kind = d.get("kind")
    if not isinstance(kind, str) or kind not in KINDS:
        raise InputError(f"unknown task kind {kind!r}; this gna_interp loads the kinds {sorted(KINDS)}")
    task = KINDS[kind](d)
    if "n_samples" in d and d["n_samples"] != len(task):
        raise InputError(f"the saved {kind} task {task.name!r} says n_samples={d['n_samples']!r} but rebuilds "
                         f"with {len(task)}; the dict was edited or written by a different gna_interp")
    return task
