"""What a report is built from: the files that `gna scan` writes into its output folder."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from gna_interp.errors import InputError
from gna_interp.models.heads import HeadRef

SCAN_FILE = "scan.csv"
CIRCUIT_FILE = "circuit.json"


@dataclass
class ReportInputs:
    """The scan table (``scan.csv``: ``layer, head, kind, name, baseline, ablated, drop, rank`` and any
    role columns such as ``role, gather, aggregate``) and the circuit (``circuit.json`` as a dict, as
    :meth:`gna_interp.circuits.discover.Circuit.save` writes it: ``model``, ``task``, ``baseline``,
    ``heads``, ``pair``, ``curve``, ...) of one output folder."""

    folder: Path
    scan: pd.DataFrame
    circuit: dict[str, Any] = field(default_factory=dict)

    @property
    def heads(self) -> pd.DataFrame:
        """Scan rows with the circuit's per-head role information merged in on ``name``, best rank first."""
        df = self.scan.copy()
        ranked = self.circuit.get("heads")
        if isinstance(ranked, list) and ranked and isinstance(ranked[0], dict):
            roles = pd.DataFrame(ranked)
            if "name" in roles:
                extra = [c for c in roles.columns if c == "name" or c not in df.columns]
                df = df.merge(roles[extra], on="name", how="left")
        sort = "rank" if "rank" in df else "drop"
        return df.sort_values(sort, ascending=sort == "rank").reset_index(drop=True)

    @property
    def model_spec(self) -> str | None:
        spec = self.circuit.get("model")
        if isinstance(spec, dict):
            spec = spec.get("spec") or spec.get("name")
        return str(spec) if spec else None

    @property
    def pair(self) -> tuple[HeadRef, HeadRef] | None:
        """The gather/aggregate pair that discovery chose (``circuit.json``'s ``pair``), if any."""
        pair = self.circuit.get("pair")
        if isinstance(pair, dict) and pair.get("gather") and pair.get("aggregate"):
            return HeadRef.parse(pair["gather"]), HeadRef.parse(pair["aggregate"])
        return None

    @property
    def baseline(self) -> dict[str, float]:
        """Baseline metrics (accuracy, logit_diff, chance, ...) of the unablated model."""
        base = self.circuit.get("baseline")
        if isinstance(base, dict):
            return {k: v for k, v in base.items() if isinstance(v, (int, float))}
        if isinstance(base, (int, float)):
            return {self.circuit.get("metric", "baseline"): float(base)}
        if "baseline" in self.scan and len(self.scan):
            return {str(self.circuit.get("metric", "baseline")): float(self.scan["baseline"].iloc[0])}
        return {}


def load_inputs(folder: str | Path) -> ReportInputs:
    """Read ``scan.csv`` (required) and ``circuit.json`` (optional) from ``folder``."""
    d = Path(folder)
    scan_path = d / SCAN_FILE
    if not scan_path.is_file():
        raise InputError(f"{d} has no {SCAN_FILE}: run `gna scan --out {d}` first (the report reads its output)")
    scan = pd.read_csv(scan_path)
    circuit: dict[str, Any] = {}
    circuit_path = d / CIRCUIT_FILE
    if circuit_path.is_file():
        try:
            circuit = json.loads(circuit_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise InputError(f"{circuit_path} is not valid JSON ({e}); rerun `gna scan` to rewrite it") from e
    return ReportInputs(d, scan, circuit)
