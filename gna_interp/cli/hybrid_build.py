"""``gna hybrid build``: distil retrieval-guided hybrids from a zoo Transformer and compare them on KV
(:func:`gna_interp.experiments.hybrid_build.hybrid_build`); registered as a subcommand of ``gna hybrid``."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.constants import CIRCUIT_JSON, SCAN_CKPT
from gna_interp.cli.args import (at_least, choice_list, claim_run, model_arg, output_args, run_options, samples_arg,
                                 seeds_arg, wrote)
from gna_interp.cli.signals import run_held
from gna_interp.cli.hybrid import int_list, subcommand


@subcommand("build", "distil the zoo Transformer into Falcon-H1 hybrids (Mamba-2 heads beside the kept attention "
                     "heads) that keep the scan's top-k heads, k random heads or none, over several seeds, and "
                     "compare their KV accuracy by dictionary size; writes every student (a zoo checkpoint), "
                     "hybrid_build.csv, hybrid_build.json, report.html and the figure. CPU, minutes per student")
def _build_args(p: argparse.ArgumentParser) -> None:
    from gna_interp.experiments.hybrid_build import CONDITIONS
    from gna_interp.zoo.hybrid_build import LOSSES, HybridConfig
    from gna_interp.zoo.training import DEFAULT_EVAL_SIZES

    d = HybridConfig()
    model_arg(p, "the teacher: a Llama zoo model (default zoo:transformer-kv)", default="zoo:transformer-kv")
    p.add_argument("--keep", type=choice_list(CONDITIONS), default=list(CONDITIONS),
                   help="conditions, comma-separated: top (the scan's top k heads kept), random (k random heads), "
                        "none (Mamba-2 only); default all three")
    p.add_argument("--k", type=at_least(0), default=2, help="attention heads kept by top and random (default 2)")
    p.add_argument("--seeds", type=seeds_arg(1), default=3, help="students per condition, seeds 0..N-1 (default 3)")
    p.add_argument("--scan", default=None, metavar="DIR",
                   help="a `gna scan` folder (or scan.json) of the teacher whose ranking gives the top heads "
                        "(default: gna scan's default discovery, saved in OUT/circuit)")
    p.add_argument("--pairs", type=int_list(2), default=list(DEFAULT_EVAL_SIZES),
                   help=f"dictionary sizes measured (default {','.join(map(str, DEFAULT_EVAL_SIZES))})")
    p.add_argument("--samples", type=samples_arg(), default=200, help="prompts per size (default 200, as the zoo cards)")
    p.add_argument("--steps", type=at_least(1), default=d.steps, help=f"training steps per student (default {d.steps})")
    p.add_argument("--loss", default=d.loss, choices=LOSSES,
                   help=f"distillation loss (default {d.loss}: KL to the teacher at every position)")
    p.add_argument("--train-teacher-parts", action=argparse.BooleanOptionalAction, default=d.train_teacher_parts,
                   help="also train what is copied from the teacher (embeddings, norms, MLPs, kept heads); "
                        f"default {'on' if d.train_teacher_parts else 'off: only the Mamba-2 mixers train'}")
    p.add_argument("--threads", type=at_least(1), default=1, help="torch CPU threads (default 1)")
    output_args(p, "gna_hybrid_build", "build")
    p.set_defaults(run=run_build)


def run_build(args: argparse.Namespace) -> int:
    from gna_interp.experiments.hybrid_build import CIRCUIT_DIR, CKPT, STUDENTS, HybridBuildConfig, hybrid_build

    out = Path(args.out)
    folder = claim_run(args, "hybrid build", CKPT,
                       also=[out / STUDENTS, out / CIRCUIT_DIR / CIRCUIT_JSON, out / CIRCUIT_DIR / SCAN_CKPT])
    if args.scan is not None and not Path(args.scan).exists():  # before any loading
        from gna_interp.errors import InputError

        raise InputError(f"--scan {args.scan!r} does not exist: pass the folder `gna scan --out DIR` wrote")
    run = HybridBuildConfig(**run_options(args), conditions=args.keep, seeds=args.seeds, pairs=args.pairs,
                            samples=args.samples, scan=args.scan, threads=args.threads)
    result = run_held(args, folder, lambda: hybrid_build(args.model, args.k, out=out, run=run, steps=args.steps,
                                                         loss=args.loss, train_teacher_parts=args.train_teacher_parts),
                      out / CKPT, out / STUDENTS)
    print(result.summary())
    print(f"wrote {wrote(out, 'hybrid build')} and the students in "
          f"{out / STUDENTS} ({result.seconds:.0f}s)")
    return 0
