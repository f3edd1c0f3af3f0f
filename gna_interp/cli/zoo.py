"""``gna zoo``: list the shipped zoo models, or train one."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.cli import command
from gna_interp.cli.args import at_least, claim_out

@command("zoo", "list the shipped zoo models, or train one (gna zoo train NAME)")
def _zoo_args(p: argparse.ArgumentParser) -> None:
    zsub = p.add_subparsers(dest="zoo_command", required=True)
    zsub.add_parser("list", help="shipped zoo models with their card numbers, and the trainable recipes")
    t = zsub.add_parser("train", help="train one zoo model on CPU and write checkpoint + model card")
    t.add_argument("name", help="zoo model name (see `gna zoo list`)")
    t.add_argument("--steps", type=at_least(1), default=None, help="training steps (default: the recipe's)")
    t.add_argument("--seed", type=int, default=None, help="seed (default: the recipe's)")
    t.add_argument("--threads", type=at_least(1), default=None, help="torch threads (default: the recipe's)")
    t.add_argument("--eval-samples", type=at_least(1), default=200, help="samples per dictionary size for the card")
    dest = t.add_mutually_exclusive_group()
    dest.add_argument("--out", default=None, help="output directory (default: ./zoo/NAME)")
    dest.add_argument("--install", action="store_true", help="write into the package's zoo folder (replaces the shipped model)")
    t.add_argument("--fresh", action="store_true", help="--out may hold another command's results: delete them first")
    p.set_defaults(run=run_zoo)


def run_zoo(args: argparse.Namespace) -> int:
    from gna_interp.models import zoo_dir, zoo_names
    from gna_interp.zoo.training import RECIPES, read_card, recipe, train

    if args.zoo_command == "list":
        shipped = zoo_names()
        for name in shipped:
            card = read_card(zoo_dir() / name)
            acc = ", ".join(f"{n}: {v['accuracy']:.2f}" for n, v in card["evaluation"]["by_pairs"].items())
            print(f"zoo:{name}  {card['architecture']}, {card['parameters']['total']:,} params, "
                  f"{card['training']['steps']} steps; accuracy by pairs {acc}")
        if not shipped:
            print("no zoo models shipped with this install")
        print(f"recipes: {', '.join(sorted(RECIPES))} (gna zoo train NAME)")
        return 0
    recipe(args.name)  # clear error for an unknown name before any work
    args.out = zoo_dir() / args.name if args.install else (args.out if args.out is not None else Path("zoo") / args.name)
    folder = claim_out(args, "zoo train")
    with folder.hold(args.fresh):
        train(args.name, folder.path, steps=args.steps, seed=args.seed, threads=args.threads,
              eval_samples=args.eval_samples)
    return 0
