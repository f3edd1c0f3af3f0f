"""The offline example tasks of ``gna eval`` and ``gna lm-eval``, shipped inside the package.

:data:`TASKS_DIR` (``gna_interp/data/eval_tasks/``, package data of the wheel) holds two small lm-eval
tasks that need no network: ``gna_kv_mc`` (KV retrieval as multiple choice, ``acc``) and ``gna_kv_gen``
(greedy generation, ``exact_match`` on the first digit), each a YAML file over a jsonl file read by the
custom loader ``gna_local.py`` next to them (the tasks work from any working directory). ``gna eval``,
:func:`~gna_interp.experiments.eval.eval_heads` and ``gna lm-eval`` always search this folder, so
``--tasks gna_kv_mc`` needs no ``--include-path``; a folder of your own passed with ``--include-path``
is searched too, and one that defines a task of the same name replaces the shipped one
(:func:`task_paths`).

A zoo model knows only the key words it was trained on; write a copy of the tasks whose keys are its
words with::

    python -m gna_interp.experiments.eval_tasks --model zoo:transformer-kv --out DIR
    gna eval --model zoo:transformer-kv --tasks gna_kv_mc,gna_kv_gen --include-path DIR ...

``python -m gna_interp.experiments.eval_tasks --out gna_interp/data/eval_tasks`` (from a checkout)
rebuilds the shipped jsonl files. Both files are seeded: the same on every machine.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Sequence

from gna_interp.store import atomic_write, make_folder

TASKS_DIR = Path(__file__).resolve().parents[1] / "data" / "eval_tasks"
"""The shipped task folder (``gna_interp/data/eval_tasks``)."""

SHIPPED_TASKS = ("gna_kv_mc", "gna_kv_gen")
"""The names of the shipped tasks."""

_TASK_FILES = ("gna_kv_mc.yaml", "gna_kv_gen.yaml", "gna_local.py")
_TASK_LINE = re.compile(r"^task:\s*['\"]?([\w.-]+)", re.M)


def _defines_shipped(folder: Path) -> bool:
    """Whether a YAML file under ``folder`` defines a task named like a shipped one (``task: gna_kv_mc``)."""
    for f in folder.rglob("*.yaml"):
        try:
            names = _TASK_LINE.findall(f.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
        if any(n in SHIPPED_TASKS for n in names):
            return True
    return False


def task_paths(include_path: str | Path | Sequence[str | Path] | None = None) -> list[str]:
    """The folders lm-eval should index for local tasks: the shipped :data:`TASKS_DIR`, then ``include_path``
    (one folder or several). When a folder of ``include_path`` defines a task named like a shipped one
    (a copy made by ``python -m gna_interp.experiments.eval_tasks --out DIR``), the shipped folder is
    left out, so that the copy is used whatever order lm-eval merges its folders in."""
    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    own = [str(p) for p in paths]
    if any(Path(p).resolve() == TASKS_DIR for p in own):
        return own
    if any(Path(p).is_dir() and _defines_shipped(Path(p)) for p in own):
        return own
    return [str(TASKS_DIR), *own]


def write_jsonl(out: str | Path, words: Sequence[str] | None = None) -> None:
    """Write both jsonl files into ``out``, keys drawn from ``words`` (default: the shipped word list).

    ``gna_kv_mc.jsonl``: 50 dictionaries of 10 ``word:value`` lines (values 0-9), the official cue
    ``The value of the key 'K' is``; ``choices`` are the ten values (``" 3"``, with the space), ``answer``
    the queried line's index. ``gna_kv_gen.jsonl``: 50 other dictionaries (another seed), ``answer`` the
    value as text (``"3"``), for exact match on a generation."""
    from gna_interp.tasks import KVRetrieval

    out = Path(out)
    w = list(words) if words else None
    mc = KVRetrieval(10, 50, seed=101, max_value=9, words=w)
    gen = KVRetrieval(10, 50, seed=102, max_value=9, words=w)
    atomic_write(out / "gna_kv_mc.jsonl", "".join(
        json.dumps({"prompt": s.prompt, "choices": list(s.candidates), "answer": s.gold}) + "\n" for s in mc))
    atomic_write(out / "gna_kv_gen.jsonl", "".join(
        json.dumps({"prompt": s.prompt, "answer": str(s.meta["value"])}) + "\n" for s in gen))


def write_task_folder(out: str | Path, words: Sequence[str] | None = None) -> Path:
    """A complete task folder in ``out`` (the two YAML files and the loader copied from :data:`TASKS_DIR`, the
    jsonl files written by :func:`write_jsonl` with ``words``), for ``--include-path out``; returns ``out``."""
    out = Path(out)
    make_folder(out)
    if out.resolve() != TASKS_DIR:
        for f in _TASK_FILES:
            atomic_write(out / f, (TASKS_DIR / f).read_bytes())
    write_jsonl(out, words)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m gna_interp.experiments.eval_tasks",
                                description="Write a folder of the example lm-eval tasks (gna_kv_mc, gna_kv_gen) "
                                            "for gna eval --include-path DIR.")
    p.add_argument("--model", default=None, help="draw the keys from this model's key words (zoo models: "
                                                 "zoo:transformer-kv); default: the shipped word list")
    p.add_argument("--out", required=True, help="the folder to write (created)")
    args = p.parse_args(argv)
    words = None
    if args.model:
        from gna_interp.models import load_model

        kv = load_model(args.model).kv_words
        words = list(kv) if kv else None
    out = write_task_folder(args.out, words)
    print(f"wrote {out}: {', '.join(SHIPPED_TASKS)} (use gna eval --include-path {out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
