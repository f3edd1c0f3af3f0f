"""``gna patterns``: a standalone HTML page with the patterns of chosen heads on one prompt."""

from __future__ import annotations

import argparse

from gna_interp.cli import command
from gna_interp.cli.args import dtype_arg, first_default, heads_arg, model_arg
from gna_interp.constants import PATTERNS_HTML
from gna_interp.run_folder import check_out_file

@command("patterns", "write a standalone HTML page with the patterns of chosen heads on one prompt")
def _patterns_args(p: argparse.ArgumentParser) -> None:
    model_arg(p)
    p.add_argument("--prompt", required=True, help="the prompt text")
    p.add_argument("--heads", type=heads_arg, default=None, help="comma-separated heads, e.g. L3H1,L5H2 or L1S0 (default: heads of the first two layers; Mamba-1 layers as 16 channel groups)")
    p.add_argument("--out", default=PATTERNS_HTML, help="output HTML file")
    p.add_argument("--form", default="exact", choices=["exact", "attention"],
                   help="SSM implicit-attention form (exact: with the Δ_s factor, reproduces the scan; default)")
    dtype_arg(p)
    p.set_defaults(run=run_patterns, runs_model=True)


def run_patterns(args: argparse.Namespace) -> int:
    from gna_interp.experiments.run import model_of
    from gna_interp.mixing import patterns
    from gna_interp.viz.attention import patterns_page

    out = check_out_file(args.out)  # before the model loads
    spec = args.model or first_default()
    model = model_of(spec, getattr(args, "device", None), args.dtype)
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
