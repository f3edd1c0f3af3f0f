"""``gna scan``: find the G&A heads of a model (:func:`gna_interp.circuits.discover`), alone or sharded over the
ranks of a torchrun job (:func:`gna_interp.circuits.scan.distributed.run_job`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from gna_interp.constants import CIRCUIT_JSON, CONTROL_SUFFIX, REPORT_FILE, SCAN_CKPT, SUMMARY_MD
from gna_interp.cli import command
from gna_interp.cli.args import (FORMATS, at_least, check_pairs, check_questions_reachable, choice_list, claim_out,
                                 compute_args, load_for, model_arg, resume_args, say_figures, seeds_arg, task_args,
                                 task_options)
from gna_interp.cli.stages import announced_stages, heartbeat
from gna_interp.cli.signals import say_interrupted
from gna_interp.errors import InputError

@command("scan", "find the G&A heads of a model on KV retrieval or multiple choice; writes scan.csv, scan.json, circuit.json, views.pt, summary.md, report.html")
def _scan_args(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--task", default="kv", choices=["kv", "mc", "cloze"],
                   help="kv: KV retrieval; mc: multiple choice scored on the letters (its cloze form is measured as "
                        "the knowledge twin); cloze: multiple choice scored on the option texts")
    task_args(p, questions=("categories", "mc/cloze questions: categories (offline knowledge questions, default), "
                                          "synthetic (answer stated in the question's context), a local .jsonl/.json/"
                                          ".csv/.parquet FILE, or hub[:SUBJECT] (MMLU)"),
              mc_form=(None, "mc prompt form: letters (MMLU: 'A. text' lines, 'Answer:'), or stated (lines 'text (A)', "
                             "cue 'Answer: TEXT (': the answer is stated and its letter retrieved; small models that "
                             "fail letters solve it); default: the one the model solves, by calibration"),
              shots=(3, "solved questions before each mc/cloze question (default 3)"),
              template=(None, "KV template: official ('The value of the key K is') or completion ('K:'); default: "
                              "chosen by calibration"),
              pairs=(None, "KV dictionary lines per prompt (default: chosen by calibration among 10 and 20)"),
              max_value=(None, "KV values are 0..MAX (default: chosen by calibration among 9 and 99, the paper's "
                               "range)"),
              samples=(24, "prompts (default 24)"))
    p.add_argument("--calibrate", type=at_least(0), default=16, metavar="N",
                   help="before discovery, evaluate the intact model on N prompts of each task form whose knobs "
                        "(--template, --max-value, --pairs; mc: --mc-form) were not named, and scan the most "
                        "accurate one that clears chance, forms at 0.95 or more counting as equal (default 16; 0: no calibration, unnamed knobs take "
                        "completion / 99 / 10 pairs / stated). The grid and the choice go into summary.md, "
                        "circuit.json and the report")
    task_args(p, seed=(0, "task seed"))
    p.add_argument("--formats", type=choice_list(FORMATS), default=[],
                   help="other retrieval formats to scan beside the task (comma-separated: official, completion -- KV "
                        "templates with the task's values and pairs; stated, letters -- multiple choice on --questions): "
                        "the circuit is then ranked by each head's consistent effect over all formats, and the summary "
                        "names heads that matter in one format only (costs one more scan a format)")
    p.add_argument("--strategy", default="auto", choices=["auto", "exact", "attribution", "naive"])
    p.add_argument("--method", default="zero", choices=["zero", "mean", "resample"],
                   help="ablation (mean/resample read a second task of the same kind built with seed+1)")
    p.add_argument("--metric", default="logit_diff", choices=["logit_diff", "accuracy"])
    p.add_argument("--verify", type=at_least(0), default=None,
                   help="heads auto runs exactly before calibrating its error bound (default: 20)")
    p.add_argument("--certify", type=at_least(0), default=10,  # circuits.scan.DEFAULT_CERTIFY (not imported: keeps start-up light)
                   help="leading heads auto settles exactly (default 10)")
    p.add_argument("--max-exact", type=at_least(1), default=None,
                   help="auto stops after this many exact heads and reports how many could still enter the top "
                        "(default: until settled)")
    p.add_argument("--top-k", type=at_least(1), default=5, help="heads removed together in the ablation curve (default 5)")
    p.add_argument("--seeds", type=seeds_arg(1), default=6, help="random-head draws for the curve (default 6; the summary "
                   "compares the top k with their median)")
    compute_args(p)
    p.add_argument("--out", default="gna_scan", help="output folder (default ./gna_scan)")
    resume_args(p, "continue an interrupted scan from DIR/scan.ckpt.json",
                 "delete the checkpoint an earlier scan left in DIR and start over (refused without --resume or "
                 "--fresh: a checkpoint is never thrown away silently)")
    p.add_argument("--keep-generic", action="store_true",
                   help="keep generic heads (removing them raises the LM loss on neutral text by >= 2%%) in the circuit")
    p.add_argument("--no-control", action="store_true", help="skip the LM-loss control scan (no generic labels)")
    p.add_argument("--allow-chance", action="store_true",
                   help="scan even when the intact model is near chance on the task (refused by default)")
    p.add_argument("--no-png", action="store_true",
                   help="do not export the report's figures as PNG files (report.html draws every one)")
    p.add_argument("--verbose", action="store_true",
                   help="print every calibrated form, the notes, the whole summary (summary.md) and every file "
                        "written, instead of a three-line result")
    p.add_argument("--profile", action="store_true",
                   help="print each stage's cost (wall and CPU seconds, blocks run with their rows and tokens, peak "
                        "memory); it is always in circuit.json ('profile') and summary.md")
    p.set_defaults(run=run_scan)


def run_scan(args: argparse.Namespace) -> int:
    """``gna scan``. Under torchrun every rank loads the model and runs the head scan sharded
    (:func:`gna_interp.circuits.scan.distributed.run_job`); then the other ranks exit and rank 0 runs the rest of
    :func:`~gna_interp.circuits.discover` (its scan resumes from the merged checkpoint) and writes the outputs."""
    from gna_interp.circuits.scan.distributed import active, local_device
    from gna_interp.report import build_report

    out = Path(args.out)
    folder, stale = _claim_scan(args, out)
    choice = scan_choice(args)  # every check the arguments alone decide, before the model loads
    shard = active()  # under torchrun: joins the job; None in one process
    if shard is not None:
        args.device = local_device(getattr(args, "device", None))  # one GPU per rank where there are GPUs
    model = load_for(args)
    circuit = _discover(args, model, choice, folder, stale, shard)
    if circuit is None:
        print(f"rank {shard.rank}: head scan done; rank 0 writes the outputs", flush=True)  # type: ignore[union-attr]
        return 0
    _say_result(circuit, out, args.verbose)
    if args.profile:
        from gna_interp.report.summary import profile_lines

        print("\n".join(profile_lines(circuit)), flush=True)
    with heartbeat(lambda line: print(line, flush=True), f"writing {out / REPORT_FILE}"):
        report = build_report(out, png=not args.no_png, circuit=circuit)
    print(f"wrote {report}: open it in a browser; the full summary is in {out / SUMMARY_MD}", flush=True)
    if not args.no_png:
        say_figures(out)
    return 0


def _say_result(circuit: Any, out: Path, verbose: bool) -> None:
    """Print the circuit found: three plain lines (:func:`~gna_interp.report.summary.circuit_brief`), or with
    ``verbose`` the whole summary and every file written in ``out``."""
    from gna_interp.circuits.search.circuit import FILES
    from gna_interp.report.summary import circuit_brief, circuit_summary

    if verbose:
        print(circuit_summary(circuit, top=10))
        print(f"wrote {', '.join(str(out / f) for f in FILES if (out / f).exists())} ({circuit.seconds:.0f}s)",
              flush=True)
    else:
        print("\n".join(circuit_brief(circuit)), flush=True)


def scan_choice(args: argparse.Namespace) -> Any:
    """The :class:`~gna_interp.tasks.choice.TaskChoice` of ``gna scan``'s task options (validated: a task form no
    model could be given, a missing ``--questions`` file or an unreachable hub source is refused here)."""
    from gna_interp.tasks.choice import TaskChoice

    if args.pairs is not None and args.max_value is not None:  # refused for every kind; named as flags here
        check_pairs(args.pairs, args.max_value)
    choice = task_options(args, kind=args.task, calibrate=args.calibrate, formats=tuple(args.formats),
                          batch_size=args.batch_size, cls=TaskChoice)
    if choice.reads_questions:
        check_questions_reachable(choice.questions)
    return choice


def _claim_scan(args: argparse.Namespace, out: Path) -> tuple[Any, list[Path]]:
    """``--out`` claimed for the scan, and the checkpoints an earlier scan left there (refused unless
    ``--resume`` or ``--fresh`` says what to do with them)."""
    from gna_interp.circuits.scan.distributed import rank_files

    ckpt = out / SCAN_CKPT
    lead = os.environ.get("RANK", "0").strip() in ("", "0")  # under torchrun only rank 0 locks --out
    folder = claim_out(args, "scan", checkpoints=[ckpt, ckpt.with_suffix(CONTROL_SUFFIX)], lead=lead)
    stale = [f for f in (ckpt, ckpt.with_suffix(CONTROL_SUFFIX)) if f.exists()] + rank_files(ckpt)
    if stale and not (args.resume or args.fresh):
        done = "a finished scan and its checkpoint" if (out / CIRCUIT_JSON).exists() else \
            "the checkpoint of an unfinished scan"
        raise InputError(f"{out} holds {done} ({', '.join(f.name for f in stale)}); --resume continues it (or "
                         f"rebuilds the outputs), --fresh deletes it and starts over, or pick another --out")
    return folder, stale


def _choose(model: Any, choice: Any, verbose: bool) -> Any:
    """:func:`~gna_interp.tasks.choice.choose_task`, printing each calibrated form and the notes (``verbose``), else
    one line for the calibration."""
    from gna_interp.tasks.choice import choose_task

    def say(line: str) -> None:
        print(line, flush=True)

    with heartbeat(say, "[calibrate] the task form"):
        chosen = choose_task(model, choice, progress=say if verbose else None)
    cal = chosen.calibration
    if verbose:
        for note in chosen.notes:
            say(f"note: {note}")
    elif cal is not None:
        form = ", ".join(f"{k}={v}" for k, v in cal.form.items())
        say(f"[calibrate] task form {cal.rows[cal.chosen].task} ({form}), chosen among {len(cal.rows)} measured: "
            f"{cal.seconds:.1f} s")
    return chosen


def _discover(args: argparse.Namespace, model: Any, choice: Any, folder: Any, stale: list[Path],
              shard: Any) -> Any:
    """Choose the task, then discover the circuit and save it in ``--out`` (sharded under torchrun: None on the
    ranks other than 0)."""
    from gna_interp.circuits import DiscoverConfig, discover, scan_heads
    from gna_interp.circuits.search.discovery import check_solvable
    from gna_interp.circuits.scan.distributed import rank_files, run_job
    from gna_interp.engine.profile import Meter

    out = Path(args.out)
    ckpt = out / SCAN_CKPT
    with Meter(model) as meter, meter.stage() as calibrate:
        chosen = _choose(model, choice, args.verbose)
    task = chosen.task
    reference = chosen.reference(model) if args.method != "zero" else None
    cfg = DiscoverConfig.build(strategy=args.strategy, method=args.method, metric=args.metric, reference=reference,
                               k=args.top_k, seeds=args.seeds, batch_size=args.batch_size, checkpoint=ckpt,
                               verify=args.verify, certify=args.certify, max_exact=args.max_exact,
                               keep_generic=args.keep_generic, control=not args.no_control,
                               allow_chance=args.allow_chance, twin=chosen.twin, formats=chosen.formats)
    lead = shard is None or shard.lead

    def header() -> None:
        if lead:
            print(f"{model.name}: {len(model.heads())} heads; task {task.name}, {len(task)} samples; "
                  f"{args.strategy} scan, {args.method} ablation, metric {args.metric}"
                  + (f"; head scan sharded over {shard.world} ranks" if shard is not None else ""), flush=True)

    def prepare() -> None:
        if args.fresh:
            for f in stale:
                f.unlink(missing_ok=True)

    def sharded() -> Any:
        header()
        check_solvable(model, task, args.batch_size, args.allow_chance)  # refuse before scanning, as discover
        return scan_heads(model, task, config=cfg.scan)  # rank 0 has written every head into the checkpoint

    def rest(scan: Any, seconds: float) -> Any:
        if scan is None:
            header()
        circuit = discover(model, chosen, config=cfg)
        circuit.profile = {"calibrate": calibrate, **circuit.profile}
        if scan is not None:  # discover's scan only read the sharded scan back: count the sharded one's time
            circuit.scan.seconds = scan.seconds
            circuit.timings = {"sharded scan": seconds, **circuit.timings}
            circuit.seconds += seconds
        circuit.save(out)
        return circuit

    try:
        with announced_stages(lambda line: print(line, flush=True) if lead else None):
            return run_job(shard, lambda: folder.hold(args.fresh), prepare, sharded, rest)
    except KeyboardInterrupt:
        if lead:
            say_interrupted(args, ckpt, what="heads", ranks=rank_files(ckpt),
                            world=shard.world if shard is not None else None)
        raise
