"""``gna mask``: keep-only-G&A masks on a model's G&A heads (:func:`gna_interp.experiments.mask.mask_experiment`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.cli import (_check_pairs, _compute_args, _load_for, _resume_args, at_least, claim_out, command,
                            say_interrupted, seeds_arg, spec_text, task_args)
from gna_interp.errors import InputError


def _offset(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'auto' nor an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 'auto' or an integer >= 0, got {value}")
    return value


@command("mask", "keep-only-G&A masks: KV accuracy with the G&A heads seeing nothing, seeing only their G&A pattern "
                 "(gather: own line; aggregate: the summary tokens), and the same for random heads; writes mask.csv, "
                 "mask.json, report.html")
def _mask_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=spec_text, default=None,
                   help="model spec (default: smollm2-135m when installed, else a zoo model)")
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
    p.add_argument("--offset", type=_offset, default="auto",
                   help="SSM summary offset: where an SSM head reads a line, in tokens after its last token "
                        "(auto: measured, 0..conv width-1; attention heads always 0)")
    p.add_argument("--renormalize", action="store_true",
                   help="rescale masked attention rows to sum to 1 (default: keep the pattern's own weights)")
    p.add_argument("--role-samples", type=at_least(1), default=8, help="samples the role scores are measured on")
    p.add_argument("--scan-samples", type=at_least(1), default=24, help="discovery prompts when no circuit is given")
    _compute_args(p)
    p.add_argument("--out", default="gna_mask", help="output folder (default ./gna_mask)")
    _resume_args(p, "continue an interrupted run from OUT/mask.ckpt.json",
                 "delete the checkpoint an earlier run left in OUT and start over")
    p.add_argument("--allow-chance", action="store_true",
                   help="run even when the intact model is near chance on the task (refused by default)")
    p.add_argument("--no-png", action="store_true", help="do not export the figure as PNG")
    p.set_defaults(run=run_mask)


def run_mask(args: argparse.Namespace) -> int:
    from gna_interp.experiments.mask import MaskConfig, checkpoint_files, mask_experiment

    out = Path(args.out)
    folder = claim_out(args, "mask")
    if args.circuit is not None and not (Path(args.circuit) / "circuit.json").is_file() \
            and not str(args.circuit).endswith("circuit.json"):
        raise InputError(f"--circuit {args.circuit!r} is not a `gna scan` folder (no circuit.json in it)")
    pairs, max_value = args.pairs, args.max_value
    if pairs is not None and max_value is not None:
        _check_pairs(pairs, max_value)
    stale = [f for f in checkpoint_files(out) if f.exists()]
    if stale and not (args.resume or args.fresh):
        raise InputError(f"{out} holds the checkpoint of an unfinished mask run ({stale[0].relative_to(out)}); "
                         f"--resume continues it, --fresh deletes it and starts over, or pick another --out")
    model = _load_for(args)
    with folder.hold(args.fresh):
        try:
            config = MaskConfig(pairs=pairs, samples=args.samples, max_value=max_value, template=args.template,
                                seed=args.seed, top_k=args.top_k, seeds=args.seeds, offset=args.offset,
                                renormalize=args.renormalize, role_samples=args.role_samples,
                                scan_samples=args.scan_samples, batch_size=args.batch_size,
                                allow_chance=args.allow_chance, resume=args.resume, fresh=args.fresh,
                                png=not args.no_png)
            result = mask_experiment(model, args.circuit, args.heads, out, config)
        except KeyboardInterrupt:
            say_interrupted(args, *checkpoint_files(out))
            raise
    print(result.summary())
    print(f"wrote {out / 'mask.csv'}, {out / 'mask.json'}, {out / 'report.html'}")
    return 0
