"""``gna mask``: keep-only-G&A masks on a model's G&A heads (:func:`gna_interp.experiments.mask.mask_experiment`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.constants import CIRCUIT_JSON
from gna_interp.cli import command
from gna_interp.cli.args import (CIRCUIT_MODEL_HELP, at_least, check_pairs, claim_run, compute_args, folder_args,
                                 load_for, model_arg, run_options, seeds_arg, task_args, task_options, word_or,
                                 wrote)
from gna_interp.cli.signals import run_held
from gna_interp.errors import InputError


@command("mask", "keep-only-G&A masks: KV accuracy with the G&A heads seeing nothing, seeing only their G&A pattern "
                 "(gather: own line; aggregate: the summary tokens), and the same for random heads; writes mask.csv, "
                 "mask.json, report.html")
def _mask_args(p: argparse.ArgumentParser) -> None:
    model_arg(p, CIRCUIT_MODEL_HELP)
    src = p.add_mutually_exclusive_group()
    src.add_argument("--circuit", default=None, help="a `gna scan` output folder whose heads and roles to mask "
                                                     "(default: discover them here, saved in OUT/circuit)")
    src.add_argument("--heads", default=None,
                     help="heads to mask, with roles (L0H3=gather,L1H3=aggregate) or without (their role is measured)")
    task_args(p, pairs=(None, "dictionary lines per prompt (default: the circuit's KV task's, else 10)"),
              samples=(48, "evaluation prompts (default 48)"),
              max_value=(None, "values are 0..MAX (default: the circuit's KV task's, else 9)"),
              template=(None, "KV template of the evaluation task (default: the circuit's KV task's, else official)"),
              seed=(0, "discovery task seed; the evaluation prompts use seed+1 (prompts the circuit was not found on)"))
    p.add_argument("--top-k", type=at_least(1), default=16,
                   help="best-ranked circuit heads considered (those whose removal hurts; default 16)")
    p.add_argument("--seeds", type=seeds_arg(0), default=3, help="random-head draws (default 3)")
    p.add_argument("--offset", type=word_or("auto", at_least(0)), default="auto",
                   help="SSM summary offset: where an SSM head reads a line, in tokens after its last token "
                        "(auto: measured, 0..conv width-1; attention heads always 0)")
    p.add_argument("--renormalize", action="store_true",
                   help="rescale masked attention rows to sum to 1 (default: keep the pattern's own weights)")
    p.add_argument("--role-samples", type=at_least(1), default=8, help="samples the role scores are measured on")
    p.add_argument("--scan-samples", type=at_least(1), default=24, help="discovery prompts when no circuit is given")
    compute_args(p)
    folder_args(p, "gna_mask", "continue an interrupted run from OUT/mask.ckpt.json (or rebuild the outputs of a "
                "finished one)",
                "delete the checkpoint an earlier run left in OUT and start over",
                allow_chance="run even when the intact model is near chance on the task (refused by default)")
    p.set_defaults(run=run_mask)


def run_mask(args: argparse.Namespace) -> int:
    from gna_interp.experiments.mask import (CHECKPOINT, MaskConfig, checkpoint_files, mask_experiment,
                                            parse_head_roles)

    out = Path(args.out)
    folder = claim_run(args, "mask", CHECKPOINT, also=checkpoint_files(out)[1:])
    if args.circuit is not None and not (Path(args.circuit) / CIRCUIT_JSON).is_file() \
            and not str(args.circuit).endswith(CIRCUIT_JSON):
        raise InputError(f"--circuit {args.circuit!r} is not a `gna scan` folder (no circuit.json in it)")
    if args.pairs is not None and args.max_value is not None:
        check_pairs(args.pairs, args.max_value)
    if args.heads is not None:
        parse_head_roles(args.heads)  # names, roles and repeats, before the model loads
    config = MaskConfig(**vars(task_options(args)), **run_options(args), top_k=args.top_k, seeds=args.seeds,
                        offset=args.offset, renormalize=args.renormalize, role_samples=args.role_samples,
                        scan_samples=args.scan_samples, allow_chance=args.allow_chance)  # checked before the load
    from gna_interp.circuits import Circuit

    found = Circuit.load(args.circuit) if args.circuit is not None else None  # a bad folder fails before the model
    config.resolve(found.kv_args if found is not None else {})  # the KV knobs taken must fit, before the load
    model = load_for(args, args.model or (found.model if found is not None else None))  # the circuit's model
    result = run_held(args, folder, lambda: mask_experiment(model, args.circuit, args.heads, out, config),
                      *checkpoint_files(out))
    print(result.summary())
    print(f"wrote {wrote(out, 'mask')}")
    return 0
