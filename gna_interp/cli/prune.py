"""``gna prune``: layer pruning and head-keeping tables (:func:`gna_interp.experiments.prune.prune`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gna_interp.constants import KEEP_CSV, PRUNE_CSV, PRUNE_JSON, REPORT_FILE
from gna_interp.cli import command
from gna_interp.cli.args import (at_least, check_pairs, check_questions_reachable, choice_list, claim_run, compute_args,
                                 folder_args, load_for, model_arg, run_options, task_args, task_options)
from gna_interp.cli.signals import run_held


@command("prune", "layer pruning: retrieval (KV, MC letters) and knowledge (MC cloze) accuracy as the last blocks are "
                  "removed and with each block removed alone, plus head-keeping tables (--keep-layers 0-A --keep-heads "
                  "...); writes prune.csv, keep.csv, prune.json, report.html")
def _prune_args(p: argparse.ArgumentParser) -> None:
    from gna_interp.experiments.prune import MODES, TASKS

    model_arg(p)
    p.add_argument("--tasks", type=choice_list(TASKS), default=list(TASKS),
                   help="kv (KV retrieval), mc (multiple choice scored on the letters: retrieval), cloze (the same "
                        "questions scored on the option texts: knowledge); default kv,mc,cloze. A task the model "
                        "cannot tokenize or does not solve is left out, with its numbers")
    p.add_argument("--modes", type=choice_list(MODES), default=list(MODES),
                   help="from_end (the last k blocks removed, k = 0..n) and/or single (one block removed at a time)")
    task_args(p, pairs=(10, "KV dictionary lines per prompt (default 10)"),
              max_value=(9, "KV values are 0..MAX (default 9)"), samples=(32, "prompts per task (default 32)"),
              seed=(0, "task seed"),
              questions=("categories", "mc/cloze questions: categories (offline, default), synthetic, a local "
                                       ".jsonl/.json/.csv/.parquet FILE, or hub[:SUBJECT] (MMLU)"),
              shots=(3, "solved questions before each mc/cloze question"),
              mc_form=("letters", "mc prompt form (letters: MMLU's; stated: the answer's text given, its letter "
                                  "retrieved)"))
    p.add_argument("--keep-layers", default=None, metavar="0-A",
                   help="head keeping: layers 0..A keep every head (default with --keep-heads: up to the first "
                        "kept head's layer)")
    p.add_argument("--keep-heads", default=None, metavar="HEADS",
                   help="head keeping: the only heads kept in layers A+1..B (B: the last of them); e.g. L16H0,L17H2. "
                        "The table adds each one removed in turn and random heads kept instead")
    p.add_argument("--keep-seeds", type=at_least(0), default=3,
                   help="random draws in the head-keeping table (default 3)")
    compute_args(p)
    folder_args(p, "gna_prune", "continue an interrupted run from OUT/prune.ckpt.json (or rebuild the outputs of a "
                "finished one)",
                "delete the checkpoint an earlier run left in OUT and start over",
                allow_chance="keep tasks the intact model does not solve (left out by default)", figures="figures")
    p.set_defaults(run=run_prune)


def run_prune(args: argparse.Namespace) -> int:
    from gna_interp.experiments.prune import CHECKPOINT, PruneConfig, prune

    out = Path(args.out)
    folder = claim_run(args, "prune", CHECKPOINT)
    if "kv" in args.tasks:
        check_pairs(args.pairs, args.max_value)
    config = PruneConfig(**vars(task_options(args)), **run_options(args), tasks=args.tasks, modes=args.modes,
                         keep_layers=args.keep_layers, keep_heads=args.keep_heads, keep_seeds=args.keep_seeds,
                         allow_chance=args.allow_chance)  # a malformed range, a missing --questions file: refused here
    if "mc" in args.tasks or "cloze" in args.tasks:
        check_questions_reachable(args.questions)
    model = load_for(args)
    result = run_held(args, folder, lambda: prune(model, out, config), out / CHECKPOINT)
    print(result.summary())
    written = [out / f for f in (PRUNE_CSV, KEEP_CSV, PRUNE_JSON, REPORT_FILE) if (out / f).exists()]
    print(f"wrote {', '.join(map(str, written))}")
    return 0
