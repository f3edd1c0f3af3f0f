"""Each stage of a finished ``gna scan`` run beside its floor: ``python benchmarks/floors.py RUN_FOLDER [...]``.

A stage's *floor* is the work its definition needs, counted in block-tokens (one token through one block, the unit
:mod:`gna_interp.engine.profile` counts) and priced at a clean forward's CPU seconds per block-token: one clean pass
of the engine over the task's prompts (``run_plan``, the pass the ``check`` stage makes when it does not read the
scan's), measured here (the least of ``--repeat`` runs, with ``--threads`` threads: the run's own count, 2 by
default). Run it on the machine and in the hour of the run it prices. With ``L`` blocks, ``T`` the tokens one clean
pass of the task carries through a block (its prompts and candidate rows as the engine lays them out), ``P`` the
control prose's and ``l(S)`` the first layer a head set ``S`` touches:

- check: one clean forward, ``L T`` (none where it reads the scan's clean pass);
- scan: one clean forward (the attribution pass's), ``L T``, and one replay from each exactly-run head's layer on,
  ``sum_h (L - l(h)) T``; where heads were estimated, the backward of the attribution pass is priced as two more
  forwards (``2 L T``, CPU seconds only: a backward runs no block forward, so the profile does not count it);
- control: the same on the prose, ``L P + sum_h (L - l(h)) P`` over the control's exact heads (``+ 2 L P``);
- curve: a seed's sets are nested (the first ``j`` heads of one order), so each replays from the first layer of the
  heads it adds, ``sum_j (L - l(S_j minus S_j-1)) T``, and the LM loss of the sets at ``j = k`` (and the generic set)
  on the prose, ``sum_S (L - l(S)) P``;
- paths: one clean pass from the first sender's layer that records the senders' writes, ``(L - l_0) T``, and per
  edge into a head the receiver's block run once on the patched stream (its input projections) and the replay from
  the receiver's layer on, ``sum_e (L - l(receiver) + 1) T`` (an edge into the logits replays no block);
- calibrate, roles, twin, views: clean forwards (or pattern reads) only, so their block count is their floor.

The prose is priced at its own clean pass: the LM loss reads every position, so each pass over the prose pays
the full vocabulary's log-softmax at every token (at 262,144 tokens the largest part of it). Prefix reuse is
assumed perfect (no block before ``l(S)`` runs); stacking and batching change no count. The table
gives, per stage, the block-tokens run and their floor, the CPU seconds and the floor's, and the ratio of the two
times; ``--json FILE`` keeps it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pandas as pd

ONLY_FORWARDS = ("calibrate", "roles", "twin", "views")


def _layer(name: str) -> int:
    """The layer of the head or MLP named ``name`` (:class:`~gna_interp.models.graph.Node`)."""
    from gna_interp.models.graph import Node

    return int(Node.parse(name).layer or 0)


def _first_layer(heads: str) -> int | None:
    names = [h for h in str(heads).split(",") if h and h != "nan"]
    return min(_layer(h) for h in names) if names else None


def clean_pass(model: Any, plan: Any, repeat: int = 3) -> tuple[float, int]:
    """One clean pass of the engine over ``plan`` (``run_plan``, laid out as every stage lays it out): its CPU
    seconds per block-token (the least of ``repeat`` runs, after one to warm up) and the tokens it carries through
    each block."""
    from gna_interp.engine.forward import run_plan
    from gna_interp.engine.profile import Meter

    best, tokens = float("inf"), 0
    with Meter(model) as meter:
        for i in range(repeat + 1):
            with meter.stage() as cost:
                run_plan(model, plan)
            tokens = cost.block_tokens // max(1, model.n_layers)
            if i:
                best = min(best, cost.cpu_s / max(cost.block_tokens, 1))
    return best, tokens


def _curve_floor(curve: pd.DataFrame, n_layers: int, t_task: int, t_prose: int) -> tuple[float, float]:
    """Block-tokens of the curve's ablated sets: each series (a seed's order) is a chain of nested sets, so a set
    replays from the first layer of the heads it adds to the one before it (the first set of a chain, from its own
    first layer); the sets whose LM loss is read replay once more over the prose, from their first layer."""
    total = 0.0
    for _, chain in curve[curve["heads"].fillna("") != ""].groupby(["series", "seed"], sort=False):
        before: set[str] = set()
        for heads in chain.sort_values("k")["heads"]:
            names = set(str(heads).split(","))
            added = names - before if before <= names else names
            total += (n_layers - min(_layer(h) for h in added)) * t_task if added else 0
            before = names
    loss = curve[curve["lm_loss"].notna() & (curve["heads"].fillna("") != "")]
    return total, sum((n_layers - (_first_layer(h) or 0)) * t_prose for h in set(loss["heads"]))


def stage_floors(folder: Path, repeat: int = 3) -> pd.DataFrame:
    """The floor table of the run in ``folder`` (its circuit.json and scan.csv); loads the model named there for its
    tokenizer and depth and to measure a clean pass (:func:`clean_pass`)."""
    from gna_interp import load_model
    from gna_interp.circuits.scan.specificity import control_task
    from gna_interp.engine.plan import plan_scoring
    from gna_interp.tasks.io import task_from_dict

    doc = json.loads((folder / "circuit.json").read_text())
    prof: dict[str, dict[str, Any]] = doc["profile"]
    model = load_model(doc["model"])
    n_layers = model.n_layers
    task = task_from_dict(doc["task"])
    rate, t_task = clean_pass(model, plan_scoring(model, task.samples), repeat)
    ctl, _ = control_task(model)
    prose_rate, t_prose = clean_pass(model, plan_scoring(model, ctl.samples), repeat) if ctl is not None else (0, 0)
    scan = pd.read_csv(folder / "scan.csv")
    exact = [int(r.layer) for r in scan.itertuples() if r.source == "exact"]
    ctl_exact = [int(r.layer) for r in scan.itertuples() if getattr(r, "control_source", "") == "exact"]
    estimated = "est_drop" in scan and scan["est_drop"].notna().any()
    ctl_estimated = "control_source" in scan and (scan["control_source"] == "attribution").any()
    # per stage: (block-tokens of the task, of the prose, backward of the task, of the prose)
    floor: dict[str, tuple[float, float, float, float]] = {
        "check": (n_layers * t_task, 0, 0, 0),
        "scan": (n_layers * t_task + sum(n_layers - l for l in exact) * t_task, 0,
                 2 * n_layers * t_task if estimated else 0, 0),
        "control": (0, n_layers * t_prose + sum(n_layers - l for l in ctl_exact) * t_prose, 0,
                    2 * n_layers * t_prose if ctl_estimated else 0),
    }
    curve = pd.DataFrame(doc.get("curve") or [])
    if len(curve):
        floor["curve"] = (*_curve_floor(curve, n_layers, t_task, t_prose), 0, 0)
    if doc.get("edges"):
        senders = [_layer(e["sender"]) for e in doc["edges"]]
        floor["paths"] = ((n_layers - min(senders)) * t_task + sum(
            (n_layers - _layer(e["receiver"]) + 1) * t_task for e in doc["edges"] if e["receiver"] != "logits"), 0, 0, 0)
    rows = []
    for stage, cost in prof.items():
        if stage in ONLY_FORWARDS or stage == "check" and not cost["block_tokens"]:
            parts: tuple[float, float, float, float] | None = (cost["block_tokens"], 0, 0, 0)
        else:
            parts = floor.get(stage)
        f_bt = None if parts is None else parts[0] + parts[1]
        f_cpu = None if parts is None else (parts[0] + parts[2]) * rate + (parts[1] + parts[3]) * prose_rate
        rows.append({"stage": stage, "block_tokens": cost["block_tokens"], "floor_block_tokens": f_bt,
                     "cpu_s": cost["cpu_s"], "wall_s": cost["wall_s"], "floor_cpu_s": f_cpu,
                     "ratio": None if not f_cpu else cost["cpu_s"] / f_cpu, "peak_rss_mb": cost["peak_rss_mb"]})
    frame = pd.DataFrame(rows)
    frame.attrs.update(model=doc["model"], n_layers=n_layers, task_tokens=t_task, prose_tokens=t_prose,
                       cpu_s_per_block_token=rate, prose_cpu_s_per_block_token=prose_rate)
    return frame


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("folders", nargs="+", type=Path, help="finished gna scan folders")
    ap.add_argument("--json", type=Path, help="write the tables here")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the run's; default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed clean passes (the least is kept)")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    out = {}
    for folder in args.folders:
        frame = stage_floors(folder, args.repeat)
        a = frame.attrs
        print(f"\n{a['model']}: {a['n_layers']} blocks, task {a['task_tokens']} tokens, prose {a['prose_tokens']} "
              f"tokens; a clean pass {1e6 * a['cpu_s_per_block_token']:.0f} CPU us a block-token on the task, "
              f"{1e6 * a['prose_cpu_s_per_block_token']:.0f} on the prose (the LM loss reads every position)")
        print(frame.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
        out[str(folder)] = {"attrs": dict(a), "stages": frame.to_dict(orient="records")}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
