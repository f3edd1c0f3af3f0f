"""lm-eval ``custom_dataset`` loader of the offline example tasks: the jsonl file named in the task's
``dataset_kwargs`` (``file:``), read from this folder, as the task's ``test`` split. No network, no
dataset cache; the tasks work from any working directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def load(file: str, **_: Any) -> Any:
    """``{"test": Dataset}`` of the rows of ``file`` (a jsonl file next to this module)."""
    import datasets

    path = Path(__file__).resolve().parent / file
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)})
