"""Write the jsonl files of the offline example tasks from gna_interp's KV-retrieval generator.

    python tests/data/eval_tasks/make_data.py                       # the shipped files, in this folder
    python tests/data/eval_tasks/make_data.py --model zoo:transformer-kv --out DIR

``gna_kv_mc.jsonl``: 50 dictionaries of 10 ``word:value`` lines (values 0-9), the official cue
``The value of the key 'K' is``; ``choices`` are the ten values (``" 3"``, with the space), ``answer``
the queried line's index. ``gna_kv_gen.jsonl``: 50 other dictionaries (another seed), ``answer`` the
value as text (``"3"``), for exact match on a generation. Seeded: the same files on every machine.

``--model`` draws the keys from that model's own key words (a zoo model knows only the words it was
trained on) and ``--out`` writes a complete task folder there (the YAML files and loader copied), for
``gna eval --include-path DIR``.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from gna_interp.tasks import KVRetrieval

HERE = Path(__file__).resolve().parent


def write(out: Path, words: list[str] | None = None) -> None:
    """Write both jsonl files into ``out`` (keys drawn from ``words``, default the shipped word list)."""
    mc = KVRetrieval(10, 50, seed=101, max_value=9, words=words)
    gen = KVRetrieval(10, 50, seed=102, max_value=9, words=words)
    with open(out / "gna_kv_mc.jsonl", "w", encoding="utf-8") as f:
        for s in mc:
            f.write(json.dumps({"prompt": s.prompt, "choices": list(s.candidates), "answer": s.gold}) + "\n")
    with open(out / "gna_kv_gen.jsonl", "w", encoding="utf-8") as f:
        for s in gen:
            f.write(json.dumps({"prompt": s.prompt, "answer": str(s.meta["value"])}) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="draw the keys from this model's key words (zoo models)")
    p.add_argument("--out", default=None, help="write a complete task folder here (default: this folder's jsonl)")
    args = p.parse_args()
    words = None
    if args.model:
        from gna_interp.models import load_model

        kv = load_model(args.model).kv_words
        words = list(kv) if kv else None
    out = Path(args.out) if args.out else HERE
    out.mkdir(parents=True, exist_ok=True)
    if out.resolve() != HERE:
        for f in ("gna_kv_mc.yaml", "gna_kv_gen.yaml", "gna_local.py"):
            shutil.copy(HERE / f, out / f)
    write(out, words)


if __name__ == "__main__":
    main()
