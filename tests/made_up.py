"""Made-up scan results in the shape `gna scan` writes, for testing figures and the report without a scan."""

from __future__ import annotations

import contextlib

from pathlib import Path
from typing import Any, Iterator

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


def made_up_circuit(model: Any, heads: list[HeadRef], n_pairs: int = 4, n_cards: int = 2) -> Any:
    """A :class:`~gna_interp.circuits.Circuit` of ``heads`` of ``model`` with made-up drops, roles and curve
    (a gather/aggregate pair whatever the model) and real views (patterns of the card heads on
    ``n_cards`` samples of a KV task, computed with ``model``)."""
    import torch

    from gna_interp.circuits import Circuit, HeadScan, card_views
    from gna_interp.tasks import KVRetrieval

    frame = made_up_scan(heads)
    n = 4
    base = {"logit_diff": torch.full((n,), 2.0, dtype=torch.float64), "correct": torch.ones(n, dtype=torch.bool)}
    exact = {HeadRef.parse(r["name"]): {"logit_diff": torch.full((n,), float(r["ablated"]), dtype=torch.float64),
                                        "correct": torch.ones(n, dtype=torch.bool)} for _, r in frame.iterrows()}
    task = KVRetrieval(n_pairs=n_pairs, n_samples=n, seed=0)
    scan = HeadScan(model.name, task.name, "zero", "logit_diff", "exact", list(heads), base, exact)
    roles = frame[["layer", "head", "kind", "name", "role"]].assign(
        gather=[0.9 if r == "gather" else 0.1 for r in frame["role"]],
        aggregate=[0.8 if r == "aggregate" else 0.05 for r in frame["role"]])
    curve = pd.DataFrame([{**row, "heads": ",".join(row["heads"]) if "heads" in row else ""}
                          for row in made_up_curve()])
    circuit = Circuit(model.name, task.to_dict(), scan, roles, {"accuracy": 0.9, "logit_diff": 2.0, "chance": 0.25},
                      curve)
    if n_cards:
        ranked = scan.top(len(heads))
        circuit.views = card_views(model, task, ranked, circuit.to_frame(), circuit.pair(), n_cards=n_cards)
    return circuit


def write_scan_folder(folder: Path, model: Any, heads: list[HeadRef], n_pairs: int = 4, n_cards: int = 2) -> Path:
    """:func:`made_up_circuit` saved into ``folder`` (as `gna scan` saves a circuit)."""
    return made_up_circuit(model, heads, n_pairs, n_cards).save(folder)


def edited_copy(source: Path, folder: Path, change: Any) -> Path:
    """A copy of the result folder ``source`` at ``folder`` whose circuit.json went through ``change(doc)`` (which
    edits the document in place), as a user's hand or a hostile file would leave it."""
    import json
    import shutil

    shutil.copytree(source, folder)
    doc = json.loads((folder / "circuit.json").read_text())
    change(doc)
    (folder / "circuit.json").write_text(json.dumps(doc))
    return folder


class held_lock:
    """A second process holding ``folder``'s gna lock (an OS lock on ``.gna.lock``) for the ``with`` block, as a
    running gna command does."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def __enter__(self):
        import subprocess
        import sys

        code = ("import sys, time\nfrom pathlib import Path\nfrom gna_interp.run_folder import Lock\n"
                "Lock(Path(sys.argv[1])).acquire()\nprint('held', flush=True)\ntime.sleep(120)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(self.folder)], stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout.readline().strip() == "held"
        return self.proc

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait()


def tiny_llama(**changes: int) -> Any:
    """A tiny random Llama of the tiny family's shape (hidden 64, 4 heads of 16, 2 KV heads, 3 layers) with
    ``changes``, as a plain Hugging Face model."""
    import torch
    import transformers as T

    shape = dict(vocab_size=257, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(0)
    return T.LlamaForCausalLM(T.LlamaConfig(**{**shape, **changes})).eval()


@contextlib.contextmanager
def no_forward(m: Any) -> Iterator[None]:
    """Inside the block a forward of the model ``m`` fails the test (a refusal must come before it)."""
    def fail(*_: Any) -> None:
        raise AssertionError("a forward ran before the refusal")

    handle = m.hf_model.register_forward_pre_hook(fail)
    try:
        yield
    finally:
        handle.remove()
