"""``gna eval``: lm-evaluation-harness benchmarks intact, with heads removed and with random heads removed
(:func:`gna_interp.experiments.eval.eval_heads`)."""

from __future__ import annotations

import argparse
import logging
import math
import sys
from pathlib import Path

from gna_interp.constants import CIRCUIT_JSON
from gna_interp.cli import command
from gna_interp.cli.args import (at_least, claim_run, compute_args, folder_args, load_for, model_arg, run_options,
                                 seeds_arg, wrote)
from gna_interp.cli.signals import run_held
from gna_interp.errors import InputError


def _limit(text: str) -> float:
    """An argparse ``type`` for ``--limit``: documents a task (an integer >= 1) or a fraction in (0, 1)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a whole number of documents >= 1 or a fraction in (0, 1), got {text}")
    if value <= 0 or (value >= 1 and value != int(value)):
        raise argparse.ArgumentTypeError(f"must be a whole number of documents >= 1 or a fraction in (0, 1), got {text}")
    return int(value) if value >= 1 else value


@command("eval", "run lm-evaluation-harness benchmarks intact, with G&A heads removed and with random heads removed; "
                 "writes eval.csv, eval_summary.csv, eval.json, report.html")
def _eval_args(p: argparse.ArgumentParser) -> None:
    model_arg(p, "model spec (default: the circuit's model with --circuit, else smollm2-135m when installed, else a "
                 "zoo model)")
    p.add_argument("--tasks", required=True,
                   help="comma-separated lm-eval tasks, groups or tags (mmlu, gsm8k, lambada_openai, bbh, ...), "
                        "the shipped offline tasks gna_kv_mc and gna_kv_gen, or local YAML tasks found under "
                        "--include-path")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--ablate", default=None, metavar="HEADS", help="heads to remove, e.g. L16H0,L18H6")
    which.add_argument("--circuit", default=None, metavar="DIR",
                       help="a `gna scan` output folder: its --top-k best-ranked heads are removed (default, with "
                            "neither: the circuit is discovered first on KV retrieval with gna scan's defaults)")
    p.add_argument("--top-k", type=at_least(1), default=5, help="circuit heads removed (default 5)")
    p.add_argument("--random-k", type=at_least(0), default=None,
                   help="random heads removed per seed (default: as many as removed; 0: no random condition)")
    p.add_argument("--seeds", type=seeds_arg(1), default=3, help="random draws (default 3)")
    p.add_argument("--method", default="zero", choices=["zero", "mean"],
                   help="ablation: zero (the paper's) or mean (each head's mean output over neutral prose)")
    p.add_argument("--limit", type=_limit, default=None,
                   help="documents per task (or a fraction < 1), as lm-eval's --limit; for quick runs")
    p.add_argument("--num-fewshot", type=at_least(0), default=None, help="few-shot examples (default: the task's)")
    p.add_argument("--include-path", action="append", default=None, metavar="DIR",
                   help="folder of local lm-eval task YAML files (repeatable; the shipped gna_kv_mc and gna_kv_gen "
                        "need none: a folder defining tasks of those names replaces them, e.g. one written by "
                        "python -m gna_interp.experiments.eval_tasks --model zoo:transformer-kv --out DIR)")
    p.add_argument("--max-gen-toks", type=at_least(1), default=256,
                   help="new tokens of a generation when the task sets none (default 256)")
    p.add_argument("--bootstrap-iters", type=at_least(0), default=100000,
                   help="lm-eval's bootstrap iterations for standard errors of non-mean metrics (default 100000)")
    compute_args(p, "sequences per forward (default 16)")
    folder_args(p, "gna_eval", "reuse the conditions an earlier run into --out finished (DIR/conditions/*.json)",
                "delete the finished conditions an earlier run left in --out and start over")
    p.set_defaults(run=run_eval)


def run_eval(args: argparse.Namespace) -> int:
    from gna_interp.experiments.eval import (CONDITIONS_DIR, SCAN_CKPT, EvalConfig, condition_files, eval_heads,
                                             resolve_tasks)
    from gna_interp.experiments.harness import require_lm_eval

    require_lm_eval()
    if not args.debug:  # lm-eval logs every task's set-up at WARNING; --debug shows it
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
    out = Path(args.out)
    folder = claim_run(args, "eval", SCAN_CKPT, also=condition_files(out))
    circuit_doc = None
    if args.circuit is not None:
        d = Path(args.circuit)
        if not d.is_dir():
            raise InputError(f"--circuit {args.circuit!r} is not a folder; pass a `gna scan` output folder")
        if not (d / CIRCUIT_JSON).is_file():
            raise InputError(f"--circuit {args.circuit!r} holds no circuit.json; pass a `gna scan` output folder "
                             f"(gna scan --model M --out DIR)")
        from gna_interp.circuits import Circuit

        circuit_doc = Circuit.load(d)
    config = EvalConfig(**run_options(args), top_k=args.top_k, random_k=args.random_k, seeds=args.seeds,
                        limit=args.limit, method=args.method, include_path=args.include_path,
                        num_fewshot=args.num_fewshot, max_gen_toks=args.max_gen_toks,
                        bootstrap_iters=args.bootstrap_iters)  # checked before the model loads
    names, _ = resolve_tasks(args.tasks, args.include_path)  # an unknown task fails before the model loads
    model = load_for(args, args.model or (circuit_doc.model if circuit_doc is not None else None))
    if args.ablate is not None:
        model.check_heads(args.ablate)  # heads out of range fail before any benchmark runs
    result = run_held(args, folder, lambda: eval_heads(model, names, args.ablate, args.circuit, out, config),
                      out / CONDITIONS_DIR, what="conditions")
    print()
    print(result.format_table())
    print(f"wrote {wrote(out, 'eval')}")
    return 0


@command("lm-eval", "lm-evaluation-harness's own command line with gna_interp's model class registered as \"gna\": "
                    "gna lm-eval run --model gna --model_args model=SPEC heads=L16H0;L18H6 --tasks T (lm-eval cannot "
                    "find plug-in model classes by itself)")
def _lm_eval_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("harness_args", nargs=argparse.REMAINDER, metavar="run|ls|validate ...",
                   help="lm-eval's subcommand and its arguments, passed on unchanged (see gna lm-eval run -h), except "
                        "that the shipped offline tasks gna_kv_mc and gna_kv_gen are found with no --include_path")
    p.set_defaults(run=run_lm_eval)


def _with_shipped_tasks(ns: argparse.Namespace) -> list[str]:
    """lm-eval's ``--include_path`` (or the ``include_path`` of its ``--config`` YAML file) with the shipped task
    folder added (:func:`gna_interp.experiments.eval_tasks.task_paths`)."""
    from gna_interp.experiments.eval_tasks import task_paths

    given = ns.include_path
    config = getattr(ns, "config", None)
    if not given and config:  # lm-eval lets the command line override its YAML config: keep the YAML's folder
        import yaml

        try:
            given = (yaml.safe_load(Path(config).read_text(encoding="utf-8")) or {}).get("include_path")
        except (OSError, yaml.YAMLError, AttributeError):
            given = None  # lm-eval reports a bad config file itself
    return task_paths(given)


def run_lm_eval(args: argparse.Namespace) -> int:
    """Register :class:`~gna_interp.experiments.harness.GnaLM` as lm-eval model ``gna`` and run lm-eval's CLI."""
    from gna_interp.experiments.harness import require_lm_eval

    require_lm_eval()
    rest = list(args.harness_args)
    if not rest or rest[0] not in ("run", "ls", "validate"):
        raise InputError(f"gna lm-eval needs one of lm-eval's subcommands first (run, ls, validate), got "
                         f"{' '.join(rest) or 'nothing'}; e.g. gna lm-eval run --model gna --model_args "
                         f"model=zoo:transformer-kv heads=L0H3 --tasks gna_kv_mc --limit 8")
    import torch

    import gna_interp.experiments.harness  # noqa: F401 -- registers the "gna" model class
    from lm_eval._cli import HarnessCLI
    from lm_eval.utils import setup_logging

    if rest[0] == "run" and "--device" not in rest and not torch.cuda.is_available():
        rest += ["--device", "cpu"]  # lm-eval's default device is cuda
    setup_logging()
    cli = HarnessCLI()
    saved = sys.argv
    sys.argv = ["lm-eval", *rest]  # lm-eval's parser reads sys.argv (it rewrites it for its legacy form)
    try:
        ns = cli.parse_args()
        if hasattr(ns, "include_path"):  # run, ls, validate: the shipped tasks are found with no --include_path
            ns.include_path = _with_shipped_tasks(ns)
        cli.execute(ns)
    except SystemExit as e:  # lm-eval's own --help or argument error (already printed)
        return e.code if isinstance(e.code, int) else 2
    finally:
        sys.argv = saved
    return 0
