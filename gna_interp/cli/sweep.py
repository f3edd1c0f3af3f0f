"""``gna sweep``: KV accuracy vs dictionary size with the G&A heads removed
(:func:`gna_interp.experiments.sweep.sweep`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.constants import CIRCUIT_JSON, N_BOOTSTRAP, SCAN_CKPT
from gna_interp.cli import command
from gna_interp.cli.args import (CIRCUIT_MODEL_HELP, at_least, check_pairs, claim_run, compute_args, first_default,
                                 model_arg, output_args, removal_args, run_options, set_threads, task_args, task_options,
                                 wrote)
from gna_interp.cli.signals import run_held

PAPER_PAIRS = "10,15,20,25,30,35,40,45,50"


def pairs_list(text: str) -> list[int]:
    """An argparse ``type``: comma-separated dictionary sizes, integers >= 2, each once."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of sizes; give comma-separated integers, e.g. "
                                         f"{PAPER_PAIRS}")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a list of integers, e.g. {PAPER_PAIRS}") from None
    small = [v for v in vals if v < 2]
    if small:
        raise argparse.ArgumentTypeError(f"sizes must be at least 2 (a dictionary needs two lines to choose "
                                         f"between), got {small}")
    dup = sorted({v for v in vals if vals.count(v) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"size(s) {dup} given more than once")
    return sorted(vals)


def single_heads(text: str) -> str:
    """An argparse ``type``: ``--heads`` parsed now (a malformed name, a repeat or an empty list is refused before
    any model loads); kept as text, the model checks the heads exist."""
    from gna_interp.errors import HeadError
    from gna_interp.experiments.sweep import parse_single

    try:
        parse_single(text)
    except HeadError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


@command("sweep", "KV accuracy vs dictionary size: intact, top-1 / top-k G&A heads removed, k random heads removed "
                  "(the paper's constant drop), single heads removed (--heads gather,aggregate,L16H0); each "
                  "condition's drop slope over size; writes sweep.csv, sweep.json, report.html")
def _sweep_args(p: argparse.ArgumentParser) -> None:
    model_arg(p, CIRCUIT_MODEL_HELP)
    p.add_argument("--pairs", type=pairs_list, default=pairs_list(PAPER_PAIRS),
                   help=f"dictionary sizes (default {PAPER_PAIRS}, the paper's)")
    p.add_argument("--circuit", default=None, help="a `gna scan` folder whose heads are removed (default: discover "
                                                   "them first with gna scan's defaults; saved in DIR/circuit)")
    removal_args(p, "heads removed together (default 5; at most a quarter of the scanned heads)",
                 "random k-head draws (default 5; median and band)")
    p.add_argument("--heads", type=single_heads, default=None,
                   help="single heads, each removed alone as one more condition: head names (L16H0,L18H6) and/or "
                        "gather, aggregate (the circuit's gather/aggregate pair); head names only and no --circuit: "
                        "nothing is discovered and only intact and these heads are measured")
    p.add_argument("--bootstrap", type=at_least(0), default=N_BOOTSTRAP,
                   help=f"resamples of the prompts for the drop slopes' 95%% interval (default {N_BOOTSTRAP}; 0: none)")
    task_args(p, samples=(48, "prompts per dictionary size (default 48)"),
              max_value=(99, "values are 0..MAX (default 99, the paper's range; must be at least the largest size - 1)"),
              seed=(0, "seed of the prompts (discovery uses seed+1)"),
              template=(None, "KV template (default: the --circuit's KV task's, else official)"))
    compute_args(p)
    output_args(p, "gna_sweep", "sweep")
    p.set_defaults(run=run_sweep)


def run_sweep(args: argparse.Namespace) -> int:
    from gna_interp.circuits import Circuit
    from gna_interp.experiments.sweep import CIRCUIT_DIR, CKPT, SweepConfig, sweep

    out = Path(args.out)
    folder = claim_run(args, "sweep", CKPT,
                       also=[out / CIRCUIT_DIR / SCAN_CKPT, out / CIRCUIT_DIR / CIRCUIT_JSON])
    check_pairs(max(args.pairs), args.max_value)
    circuit = Circuit.load(args.circuit) if args.circuit else None  # a bad folder fails before loading the model
    found = circuit.kv_args if circuit is not None else {}
    template = args.template or str(found.get("template", "official"))
    set_threads(args)
    spec = args.model or (circuit.model if circuit is not None else None) or first_default()  # the circuit's model
    print(f"loading {spec} ({args.dtype}) ...", flush=True)
    config = SweepConfig(**vars(task_options(args, pairs=args.pairs, template=template)), **run_options(args),
                         k=args.top_k, seeds=args.seeds, heads=args.heads, bootstrap=args.bootstrap,
                         device=getattr(args, "device", None), dtype=args.dtype)
    result = run_held(args, folder, lambda: sweep(spec, circuit=circuit, out=out, config=config), out / CKPT,
                      out / CIRCUIT_DIR / SCAN_CKPT)
    print(result.summary())
    print(f"wrote {wrote(out, 'sweep')} ({result.seconds:.0f}s)")
    return 0
