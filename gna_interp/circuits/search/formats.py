"""Retrieval heads, not format heads: one head scan per retrieval format, and the heads that matter in all.

A scan on one prompt format ranks the heads that retrieve *and* the heads that serve that format (its cue,
its value tokens). Scanning the same model on two or more formats (two KV templates, KV and stated
multiple choice) separates them: a retrieval head's removal hurts every format. Drops are compared as
**relative drops**, each format's logit-difference drop over that format's intact logit difference, and a
head's **consistent effect** is its smallest relative drop over the formats (a head matters in all formats
only as much as in the one it matters least in). :func:`cross_format` makes the scans comparable: every
format runs exactly the heads any format ranks in its top ``certify`` (the others keep their attribution
estimates, which :func:`format_frame` marks).
"""

from __future__ import annotations

import math
from typing import Mapping, Sequence

import pandas as pd

from gna_interp.circuits.scan import HeadScan, ScanConfig, scan_heads
from gna_interp.models.heads import HeadRef
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.engine.metrics import LOGIT_DIFF

__all__ = ["ONE_FORMAT_RATIO", "consistency_order", "cross_format", "format_frame", "one_format_heads"]

ONE_FORMAT_RATIO = 0.25  # a head matters in one format only when its consistent effect is below this x its best


def cross_format(model: Model, scans: Mapping[str, HeadScan], tasks: Mapping[str, Task], config: ScanConfig,
                 certify: int = 10) -> None:
    """Run exactly, in every format, the heads any format ranks in its top ``certify`` that it has only
    estimated (merged into that format's ``exact``): the consistent effect then compares exact drops."""
    lead = list(dict.fromkeys(h for s in scans.values() for h in s.top(certify)))
    for name, scan in scans.items():
        missing = [h for h in lead if h not in scan.exact]
        if missing:
            extra = scan_heads(model, tasks[name], heads=missing, config=config.replace(
                strategy="exact", checkpoint=None, focus=None, progress=False))
            scan.exact.update(extra.exact)


def _relative(scan: HeadScan, head: HeadRef) -> tuple[float, str]:
    base = LOGIT_DIFF.value(scan.baseline)
    src = "exact" if head in scan.exact else "attribution" if head in scan.estimates else "none"
    return scan.drop(head, "logit_diff") / (abs(base) or 1.0), src


def format_frame(scans: Mapping[str, HeadScan]) -> pd.DataFrame:
    """One row per head of the first scan: ``name``, ``rel_drop_<format>`` and ``rel_source_<format>``
    (``exact`` / ``attribution``) for each format, and ``consistent`` (the smallest relative drop)."""
    first = next(iter(scans.values()))
    rows = []
    for h in first.heads:
        row: dict[str, object] = {"name": h.name}
        for name, scan in scans.items():
            row[f"rel_drop_{name}"], row[f"rel_source_{name}"] = _relative(scan, h)
        vals = [float(row[f"rel_drop_{n}"]) for n in scans]  # type: ignore[arg-type]
        row["consistent"] = min(vals) if not any(math.isnan(v) for v in vals) else math.nan
        rows.append(row)
    return pd.DataFrame(rows)


def consistency_order(frame: pd.DataFrame) -> list[str]:
    """Head names by consistent effect, largest first (NaN last)."""
    return list(frame.sort_values("consistent", ascending=False, na_position="last", kind="stable")["name"])


def one_format_heads(frame: pd.DataFrame, formats: Sequence[str], top: int = 10,
                     ratio: float = ONE_FORMAT_RATIO) -> list[tuple[str, str, float, float]]:
    """Heads in some format's top ``top`` (by relative drop) whose consistent effect is below ``ratio`` times
    their relative drop there: ``(head, format, relative drop there, consistent effect)``, largest first."""
    out = {}
    for f in formats:
        col = f"rel_drop_{f}"
        for _, r in frame.sort_values(col, ascending=False).head(top).iterrows():
            if r[col] > 0 and not r["consistent"] >= ratio * r[col] and r["name"] not in out:
                out[r["name"]] = (r["name"], f, float(r[col]), float(r["consistent"]))
    return sorted(out.values(), key=lambda t: -t[2])
