"""``gna compare-circuits``: two saved circuits of one model side by side
(:func:`gna_interp.circuits.compare_circuits`)."""

from __future__ import annotations

import argparse

from gna_interp.cli import command
from gna_interp.cli.args import at_least, claim_out, model_arg, seeds_arg

@command("compare-circuits", "compare two saved circuits of one model (e.g. KV and multiple choice): overlap, rank "
                             "correlation, each circuit removed on the other's task")
def _compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", help="a `gna scan` output folder")
    p.add_argument("b", help="another `gna scan` output folder, same model")
    model_arg(p, "model spec (default: the spec the circuits were found with)")
    p.add_argument("--top-k", type=at_least(1), default=5, help="circuit heads compared and removed (default 5)")
    p.add_argument("--seeds", type=seeds_arg(1), default=6, help="random k-head draws (default 6; their median is reported)")
    p.add_argument("--batch-size", type=at_least(1), default=16)
    p.add_argument("--out", default=None, help="output folder for compare.json/.csv/.md (default: print only)")
    p.add_argument("--fresh", action="store_true", help="--out may hold another command's results: delete them first")
    p.set_defaults(run=run_compare, runs_model=True)


def run_compare(args: argparse.Namespace) -> int:
    from gna_interp.circuits import Circuit, compare_circuits
    from gna_interp.circuits.search.comparison import check_comparable
    from gna_interp.models import load_model

    folder = claim_out(args, "compare-circuits") if args.out is not None else None  # before the model loads
    a, b = Circuit.load(args.a), Circuit.load(args.b)
    check_comparable(a, b, k=args.top_k, seeds=args.seeds, batch_size=args.batch_size)  # before the model loads
    model = load_model(args.model or a.model, device=getattr(args, "device", None))
    result = compare_circuits(model, a, b, k=args.top_k, seeds=args.seeds, batch_size=args.batch_size)
    print(result.summary())
    if folder is not None:
        with folder.hold(args.fresh):
            print(f"wrote {result.save(folder.path)}")
    return 0
