"""``gna hybrid``: retrieval-guided hybrids, one subcommand each.

- ``gna hybrid plan --model M --scan DIR``: the heads a hybrid keeps for each k and its inference memory
  next to the full Transformer (:func:`gna_interp.circuits.hybrid.plan_hybrid`); prints the table and writes
  ``hybrid_plan.csv``, ``hybrid_plan.json`` (format ``hybrid_plan``) and ``report.html`` with ``--out DIR``.

Adding a subcommand (e.g. ``build``) is one decorated function that adds its arguments and sets ``run``,
in this module or any other module of this package::

    @subcommand("build", "distil a hybrid student ...")
    def _build_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", ...)
        p.set_defaults(run=run_build)

:func:`subcommand` registers it in :data:`SUBCOMMANDS`; ``gna hybrid`` builds one subparser per entry when
the parser is built (after every module of the package is imported), so ``gna hybrid build --help`` works
with nothing else changed. Each subparser sets its own ``run``; ``args.hybrid_command`` names the one chosen.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Callable

from gna_interp.cli import command
from gna_interp.cli.args import COUNT_CAP, at_least, claim_out, model_arg, wrote
from gna_interp.errors import InputError

SUBCOMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], str]] = {}


def subcommand(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable]:
    """Register ``gna hybrid NAME``: decorate a function that adds its arguments and sets ``run``."""
    def deco(add_args: Callable[[argparse.ArgumentParser], None]) -> Callable:
        SUBCOMMANDS[name] = (add_args, help)
        return add_args
    return deco


@command("hybrid", "retrieval-guided hybrids: `gna hybrid plan` (the heads to keep and the inference memory)")
def _hybrid_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="hybrid_command", required=True, parser_class=type(p))
    for name, (add_args, help) in SUBCOMMANDS.items():
        add_args(sub.add_parser(name, help=help, description=help, allow_abbrev=False))


def int_list(minimum: int, at_most: int = COUNT_CAP) -> Callable[[str], list[int]]:
    """An argparse ``type``: comma-separated integers in ``minimum..at_most`` (e.g. ``0,5,10``)."""
    one = at_least(minimum, at_most=at_most)

    def parse(text: str) -> list[int]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"{text!r}: give comma-separated integers, e.g. 0,5,10")
        return list(dict.fromkeys(one(t) for t in items))
    parse.__name__ = "list"
    return parse


@subcommand("plan", "the attention heads a retrieval-guided hybrid keeps for each k (top k of a scan) and its "
                    "inference memory (kept heads' KV cache + the replaced heads' Mamba-2 state) next to the full "
                    "Transformer's KV cache; loads shapes only (no weights)")
def _plan_args(p: argparse.ArgumentParser) -> None:
    from gna_interp.circuits.hybrid import DEFAULT_D_CONV, DEFAULT_D_STATE, DEFAULT_KS, DEFAULT_LENGTHS

    model_arg(p, "model spec (a Transformer; its config is enough: config:llama-3.2-1b, a folder, zoo:NAME, ...)",
              required=True)
    p.add_argument("--scan", default=None, metavar="DIR",
                   help="a `gna scan` output folder (or its scan.json) of this model: heads are kept in its ranking "
                        "order (retrieval-guided). Required unless --order random")
    p.add_argument("--order", default="scan", choices=["scan", "random"],
                   help="scan: the scan's ranking (default); random: every head shuffled with --seed -- NOT "
                        "retrieval-guided, but the memory depends only on how many heads and KV heads are kept")
    p.add_argument("--seed", type=int, default=None, help="seed of --order random")
    p.add_argument("--ks", type=int_list(0), default=list(DEFAULT_KS),
                   help=f"heads kept as attention (default {','.join(map(str, DEFAULT_KS))}; capped at the head count)")
    p.add_argument("--lengths", type=int_list(1, at_most=10**8), default=list(DEFAULT_LENGTHS),
                   help=f"sequence lengths L (default {','.join(map(str, DEFAULT_LENGTHS))}), batch 1")
    p.add_argument("--d-state", type=at_least(1), default=DEFAULT_D_STATE,
                   help=f"state size of a replaced head's Mamba-2 head (default {DEFAULT_D_STATE}, Llamba's; the "
                        f"retrieval-aware distillation paper shrinks it to 8)")
    p.add_argument("--d-conv", type=at_least(0), default=DEFAULT_D_CONV,
                   help=f"Mamba-2 convolution width counted in the conv state (default {DEFAULT_D_CONV}; 0: leave the "
                        f"conv state out)")
    p.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                   help="dtype of the caches (default: the dtype the checkpoint was saved in, else float32)")
    p.add_argument("--out", default=None, help="output folder for hybrid_plan.csv, hybrid_plan.json, report.html "
                                               "(default: print only)")
    p.add_argument("--fresh", action="store_true", help="--out may hold another command's results: delete them first")
    p.set_defaults(run=run_plan)


def run_plan(args: argparse.Namespace) -> int:
    from gna_interp.circuits.hybrid import FORMAT, plan_hybrid
    from gna_interp.experiments.output import ResultFolder
    from gna_interp.viz.html import part
    from gna_interp.models import load_model

    out = Path(args.out) if args.out is not None else None
    if out is not None:
        folder = claim_out(args, "hybrid plan")
    if args.order == "random" and args.scan is not None:
        raise InputError("--order random ranks the heads at random: drop --scan (or drop --order random)")
    if args.order == "random" and args.seed is None:
        raise InputError("--order random needs --seed N (so the plan can be repeated)")
    if args.order == "scan" and args.seed is not None:
        raise InputError("--seed is only used with --order random")
    if args.order == "scan" and args.scan is None:
        raise InputError("gna hybrid plan needs --scan DIR (a `gna scan --model M --out DIR` folder of this model) for "
                         "the retrieval-guided order; a model with no weights to scan (config:NAME) can use --order "
                         "random --seed N instead: NOT retrieval-guided, but the memory depends only on how many heads "
                         "and KV heads are kept")
    if args.scan is not None and not Path(args.scan).exists():  # before loading the model
        raise InputError(f"--scan {args.scan!r} does not exist: pass the folder `gna scan --out DIR` wrote")
    print(f"loading {args.model} (shapes only) ...", flush=True)
    model = load_model(args.model, device="meta")
    plan = plan_hybrid(model, args.scan, ks=args.ks, lengths=args.lengths, d_state=args.d_state, d_conv=args.d_conv,
                       dtype=args.dtype, order=args.order, seed=args.seed)
    print(plan.summary())
    if out is not None:
        with folder.hold(args.fresh):
            head = plan.header()
            ResultFolder(out, FORMAT).write(plan.to_frame(), plan.to_dict(), title=head[0], notes=[n[2:] for n in head[1:]],
                                            sections=[part("heading", "Memory by k kept heads (MB = 10^6 bytes; "
                                                                    "x = full / hybrid)"), plan.wide_html()], png=False)
        print(f"wrote {wrote(out, 'hybrid plan')}")
    return 0
