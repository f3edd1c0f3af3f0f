"""``gna compare``: model families side by side (:func:`gna_interp.experiments.families.compare`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.constants import CIRCUIT_JSON, SCAN_CKPT
from gna_interp.cli import command
from gna_interp.cli.args import (at_least, check_pairs, claim_run, compute_args, output_args, removal_args, run_options,
                                 set_threads, task_args, task_options, wrote)
from gna_interp.cli.signals import run_held
from gna_interp.errors import InputError


def spec_list(text: str) -> list[str]:
    """An argparse ``type``: two or more comma-separated model specs, each once."""
    specs = [s.strip() for s in text.split(",")]
    if any(not s for s in specs):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty entry; give comma-separated model specs, e.g. "
                                         f"zoo:transformer-kv,zoo:mamba2-kv,zoo:hybrid-kv")
    if len(specs) < 2:
        raise argparse.ArgumentTypeError(f"{text!r} names one model; compare needs two or more, comma-separated")
    dup = sorted({s for s in specs if specs.count(s) > 1})
    if dup:
        raise argparse.ArgumentTypeError(f"model(s) {dup} listed more than once")
    return specs


def circuit_list(text: str) -> list[str | None]:
    """An argparse ``type``: comma-separated ``gna scan`` folders, an empty entry where a model's heads are to
    be discovered (``DIR1,,DIR3``)."""
    return [s.strip() or None for s in text.split(",")]


@command("compare", "model families side by side on KV retrieval: their aggregate heads' sharpness and the accuracy "
                    "removing 1..k top heads costs vs random heads (SSM G&A smoother and more redundant; which mixer "
                    "kind aggregates in a hybrid); writes families.csv, families.json, report.html")
def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=spec_list, required=True,
                   help="two or more model specs, comma-separated "
                        "(e.g. zoo:transformer-kv,zoo:mamba2-kv,zoo:hybrid-kv)")
    p.add_argument("--circuit", type=circuit_list, default=None,
                   help="`gna scan` folders, one per model in the same order (an empty entry: discover that model's "
                        "heads; default: discover every model's with gna scan's default discovery on a task like the "
                        "measured one, seeded seed+1; saved in DIR/circuits)")
    removal_args(p, "most heads removed (default 5; at most a quarter of a model's scanned heads)",
                 "random head orders (default 5; median and band)")
    task_args(p, pairs=(10, "dictionary lines of the measured task (default 10)"),
              samples=(24, "prompts of the measured task (default 24)"), max_value=(9, "values are 0..MAX (default 9)"),
              template=("official", "KV template of the measured task (default official; SmolLM2 solves completion "
                                    "with --max-value 99, see docs/discovery.md)"),
              seed=(0, "seed of the measured prompts (discovery uses seed+1)"))
    p.add_argument("--sharp-samples", type=at_least(1), default=8,
                   help="prompts the aggregation scores (sharpness) are read on (default 8)")
    p.add_argument("--pool", type=at_least(1), default=64,
                   help="best-ranked heads of each model whose aggregation is scored (default 64)")
    compute_args(p)
    output_args(p, "gna_compare", "comparison")
    p.set_defaults(run=run_compare_families)


def run_compare_families(args: argparse.Namespace) -> int:
    from gna_interp.circuits import Circuit
    from gna_interp.experiments.families import CIRCUITS_DIR, CKPT, CompareConfig, compare
    from gna_interp.experiments.run import slug

    out = Path(args.out)
    cdirs = [out / CIRCUITS_DIR / slug(s) for s in args.model]
    folder = claim_run(args, "compare", CKPT,
                       also=[p for c in cdirs for p in (c / SCAN_CKPT, c / CIRCUIT_JSON)])
    check_pairs(args.pairs, args.max_value)
    circuits = args.circuit if args.circuit is not None else [None] * len(args.model)
    if len(circuits) != len(args.model):
        raise InputError(f"--circuit lists {len(circuits)} folders for {len(args.model)} models; give one per model, "
                         f"in the same order (an empty entry, as in DIR1,,DIR3, discovers that model's heads)")
    for c in circuits:  # a bad folder fails before any model is loaded
        if c:
            Circuit.load(c)
    set_threads(args)
    print(f"comparing {', '.join(args.model)} ({args.dtype}) ...", flush=True)
    config = CompareConfig(**vars(task_options(args)), **run_options(args), k=args.top_k, seeds=args.seeds,
                           sharp_samples=args.sharp_samples, pool=args.pool, device=getattr(args, "device", None),
                           dtype=args.dtype)
    result = run_held(args, folder, lambda: compare(args.model, circuits, out, config), out / CKPT,
                      *(c / SCAN_CKPT for c in cdirs))
    print(result.summary())
    print(f"wrote {wrote(out, 'compare')} ({result.seconds:.0f}s)")
    return 0
