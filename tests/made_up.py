"""Made-up scan results in the shape `gna scan` writes, for testing figures and the report without a scan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gna_interp.models.heads import HeadRef


def made_up_scan(heads: list[HeadRef], seed: int = 0) -> pd.DataFrame:
    """A scan-shaped frame (``layer, head, kind, name, baseline, ablated, drop, rank, role``); the
    best-ranked head is labelled aggregate and the second gather."""
    rng = np.random.default_rng(seed)
    df = pd.DataFrame([{"layer": h.layer, "head": h.head, "kind": h.kind, "name": h.name, "baseline": 2.0,
                        "ablated": 2.0 - float(rng.random())} for h in heads])
    df["drop"] = df["baseline"] - df["ablated"]
    df["rank"] = df["drop"].rank(ascending=False, method="first").astype(int)
    df["role"] = "other"
    df.loc[df["rank"] == 1, "role"] = "aggregate"
    df.loc[df["rank"] == 2, "role"] = "gather"
    return df


def made_up_curve(k_max: int = 4, seeds: int = 3) -> list[dict[str, Any]]:
    """Ablation-curve records: the top-k series falls fast, the random ones slowly."""
    rows: list[dict[str, Any]] = [{"k": k, "series": "top", "seed": None, "accuracy": 0.9 - 0.2 * k,
                                   "heads": [f"L1H{i}" for i in range(k)]} for k in range(k_max + 1)]
    rows += [{"k": k, "series": "random", "seed": s, "accuracy": 0.9 - 0.02 * k * s} for s in range(seeds)
             for k in range(k_max + 1)]
    return rows


def write_scan_folder(folder: Path, model_spec: str, heads: list[HeadRef], n_pairs: int = 4) -> Path:
    """``scan.csv`` and ``circuit.json`` for ``heads`` of the model at ``model_spec``, in the format of
    :meth:`gna_interp.circuits.discover.Circuit.save`, with a gather/aggregate pair whatever the model."""
    folder.mkdir(parents=True, exist_ok=True)
    scan = made_up_scan(heads)
    scan.to_csv(folder / "scan.csv", index=False)
    by_role = {r: scan.loc[scan["role"] == r, "name"].iloc[0] for r in ("gather", "aggregate")}
    curve = [{**row, "heads": ",".join(row["heads"]) if "heads" in row else ""} for row in made_up_curve()]
    circuit = {"model": model_spec, "task": {"name": f"kv{n_pairs}-official", "kind": "kv", "n_pairs": n_pairs,
                                             "n_samples": 4, "seed": 0, "template": "official"},
               "metric": "logit_diff", "method": "zero", "strategy": "exact",
               "baseline": {"accuracy": 0.9, "logit_diff": 2.0, "chance": 0.25}, "chance": 0.25,
               "heads": scan.to_dict("records"), "pair": by_role, "curve": curve}
    (folder / "circuit.json").write_text(json.dumps(circuit), encoding="utf-8")
    return folder
