"""``gna circuit``: whether a scanned circuit suffices -- its faithfulness curve, the smallest circuit keeping a
threshold of the intact logit difference, and each of its heads' own contribution
(:func:`~gna_interp.circuits.search.sufficiency.faithfulness`)."""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable, Iterator

from gna_interp.cli import command
from gna_interp.cli.args import (COUNT_CAP, at_least, claim_out, compute_args, load_for, model_arg, resume_args,
                                 seeds_arg)
from gna_interp.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from gna_interp.circuits.edges.edge_screen import EdgeScreen
    from gna_interp.tasks.base import Task


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 0, got {text!r}")
    if max(sizes) > COUNT_CAP:
        raise argparse.ArgumentTypeError(f"sizes must be at most {COUNT_CAP:,} (heads of a circuit), got "
                                         f"{max(sizes):,}")
    return sizes


def _in_interval(name: str, ok: Callable[[float], bool], interval: str) -> Callable[[str], float]:
    """An argparse type: a float for which ``ok`` holds, else an error naming the ``interval``."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            v = None
        if v is None or not ok(v):
            raise argparse.ArgumentTypeError(f"expected a {name} in {interval}, got {text!r}")
        return v
    return parse


_share = _in_interval("share", lambda v: 0 <= v < 1, "[0, 1)")
_fraction = _in_interval("fraction", lambda v: 0 < v <= 1, "(0, 1]")


@command("circuit", "whether a scanned circuit suffices: every head outside the first k of the scan's ranking "
                    "ablated, the fraction of the intact logit difference kept as k grows (beside random circuits), "
                    "the smallest circuit keeping --threshold of it; writes faithfulness.json/.csv/.md/.html")
def _circuit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scan", help="a `gna scan` output folder (its model, task and ranking)")
    model_arg(p, "model spec (default: the spec the circuit was found with)")
    p.add_argument("--method", choices=("mean", "zero"), default="mean",
                   help="what replaces the heads outside the circuit (mean: their mean over the task's prompts; "
                        "default)")
    p.add_argument("--threshold", type=_fraction, default=0.8,
                   help="fraction of the intact logit difference the smallest circuit keeps (default 0.8)")
    p.add_argument("--sizes", type=_sizes, default=None,
                   help="circuit sizes of the curve, e.g. 1,2,5,10 (default: 0-4, then doubling up to every head)")
    p.add_argument("--quick", action="store_true",
                   help="the light defaults for the options below (a rough third of the forwards; see each option): "
                        "no minimality, the scan's own edge table, 20 verified edges, the first 10 prompts")
    p.add_argument("--samples", type=at_least(0), default=None,
                   help="measure on the first N of the scan's prompts (default 0: all of them; --quick 10, which cuts the "
                        "default task's forwards by about 60%% and widens its intervals by about 1.5x)")
    p.add_argument("--seeds", type=seeds_arg(0), default=None,
                   help="random circuits at each size (default 1: one random series, about a third of the curve's "
                        "forwards; 3 for their spread)")
    p.add_argument("--minimality", type=at_least(0), default=None,
                   help="measure the own contribution of the smallest circuit's first N heads, each replayed from its "
                        "layer (default 5; --quick 0)")
    p.add_argument("--edges", type=at_least(0), default=None,
                   help="measure the edge table among the first N heads of the circuit (the ranking without its generic "
                        "heads) by path patching (k/v at the lines and at the decision, q at the decision, each head's "
                        "direct path), with each head's causal role; the rows the scan's own edge table measured the "
                        "same way (zero ablation, all of its prompts) are read from it (default 5; 0, the --quick "
                        "default: the scan's own edge table and roles)")
    p.add_argument("--verify", type=at_least(0), default=None,
                   help="screen every edge of the whole graph (embeddings, heads, MLPs -> heads' q/k/v, MLPs, logits) "
                        "by edge attribution and measure N of them exactly (default 30, --quick 20: the strongest, the "
                        "strongest of each edge kind and a random draw; the agreement is read per kind; 0: no screen)")
    p.add_argument("--ig-steps", type=at_least(0, at_most=IG_STEPS_CAP,
                                               why_most="each step is a forward and a backward over every prompt; "
                                                        "EAP-IG needs 5-10"), default=0,
                   help="score the screen's edges with integrated gradients along the ablation path at N points "
                        "(EAP-IG; default 0: the gradient of the intact model, plain EAP)")
    p.add_argument("--edge-seeds", type=seeds_arg(0), default=None,
                   help="random edge circuits at each size of the edge curve (default 0: none; 1 draws a random "
                        "series beside the ranked one, about a third more edge circuits)")
    p.add_argument("--edge-precision", type=_share, default=None,
                   help="stop the search for the smallest edge circuit once it is known to within this share of its "
                        "size (default 0.1: finer than the interval of its fraction tells apart)")
    p.add_argument("--edge-minimality", type=at_least(0), default=None,
                   help="measure the own contribution of the smallest edge circuit's first N edges, each run from the "
                        "block that reads it (default 4; --quick 0)")
    compute_args(p)
    p.add_argument("--out", default="gna_circuit", help="output folder (default gna_circuit)")
    resume_args(p, "continue an earlier gna circuit run in --out: its finished stages are read back, not measured "
                   "again (the same scan and options only)",
                "delete what --out holds (an earlier gna circuit run, or another command's results) and start over")
    p.set_defaults(run=run_circuit)


IG_STEPS_CAP = 1000  # integrated-gradient points of the screen (EAP-IG converges within tens)

# The options --quick sets when they are not given: (default, quick).
PRESETS = {"samples": (0, 10), "edge_precision": (0.1, 0.1), "seeds": (1, 1), "minimality": (5, 0), "edges": (5, 0),
           "verify": (30, 20), "edge_seeds": (0, 0),
           "edge_minimality": (4, 0)}


def run_circuit(args: argparse.Namespace) -> int:
    from gna_interp.experiments.sufficiency_run import ScanSnapshot, SufficiencySettings, check_resume, run_sufficiency

    given = args.samples
    for name, (full, light) in PRESETS.items():
        if getattr(args, name) is None:
            setattr(args, name, light if args.quick else full)
    folder = claim_out(args, "circuit")  # before the model loads
    scan = ScanSnapshot.read(args.scan)
    task = scan.circuit.load_task()
    if given and given > len(task):  # --quick's 10 on a smaller scan measures them all
        raise InputError(f"--samples {args.samples}: the scan {args.scan!r} has {len(task)} prompts; pass at most "
                         f"{len(task)} (0: all of them)")
    settings = SufficiencySettings(**{f: getattr(args, f) for f in (
        "method", "threshold", "samples", "seeds", "minimality", "edges", "verify", "ig_steps", "edge_seeds",
        "edge_precision", "edge_minimality", "batch_size", "dtype")}, sizes=tuple(args.sizes) if args.sizes else None,
        model=args.model or scan.circuit.model)
    check_resume(folder.path, scan, settings, args.resume)
    model = load_for(args, settings.model)
    if args.sizes and max(args.sizes) > len(model.heads()):  # before --fresh deletes anything
        raise InputError(f"--sizes {max(args.sizes)}: {model.name} has {len(model.heads())} heads; a circuit holds at "
                         f"most all of them")
    with folder.hold(args.fresh):
        res = run_sufficiency(model, _first_samples(task, args.samples), scan, folder.path, settings,
                              resume=args.resume, say=lambda text: print(text, flush=True), stage=_stage)
    if res.edges is not None and res.roles is not None:
        print(_edge_report(res.edges, res.roles))
    if res.screen is not None:
        print(_screen_report(res.screen, 20))
    if res.resumed:
        print(f"resumed: {', '.join(res.resumed)} read from {folder.path} (finished by an earlier run)")
    print(f"wrote {', '.join(str(p) for p in res.written) or 'nothing new'}")
    return 0


def _first_samples(task: "Task", n: int) -> "Task":
    """The task's first ``n`` samples (all of them for 0), saying so when it is cut."""
    if not n or n >= len(task):
        return task
    from gna_interp.tasks.base import Task

    print(f"measuring on the first {n} of the task's {len(task)} prompts (--samples)")
    return Task(task.name, task.samples[:n])


def _edge_report(edges: "pd.DataFrame", roles: "pd.DataFrame") -> str:
    """The causal roles and the ten strongest edges whose interval lies above 0, as Markdown."""
    held = edges[(edges["low"] > 0) & (edges["effect"] > 1e-3)].sort_values("effect", ascending=False).head(10)
    lines = ["## Edges among the top heads (path patching)", "",
             f"{len(edges)} edges measured; the strongest whose interval lies above 0 (effect above 0.001):",
             ""]
    lines += [f"- {r.edge}: {r.effect:+.3f} [{r.low:+.3f}, {r.high:+.3f}]" for r in held.itertuples()]
    lines += ["", "| head | causal role | measured |", "|---|---|---|"]
    lines += [f"| {r.name} | {r.causal_role} | {r.causal_reason} |" for r in roles.itertuples()]
    return "\n".join(lines) + "\n"


def _screen_report(screen: "EdgeScreen", top: int) -> str:
    """The whole-graph screen's strongest edges (exact effect beside the estimate) and its agreement per edge kind,
    as Markdown."""
    from gna_interp.html_repr import counted
    from gna_interp.models.graph import node_kind

    t = screen.table
    a = screen.agreement()
    senders = set(t["sender"])
    mlps = sum(1 for s in senders if node_kind(s) == "mlp")
    lines = ["## The whole graph (edge attribution, a sample verified exactly)", "",
             f"{len(t)} edges screened (senders: the embeddings, {counted(len(senders) - mlps - 1, 'head')}, "
             f"{counted(mlps, 'MLP')}); "
             f"{a.loc['all', 'n']} verified: the strongest by |score|, the strongest of each kind and "
             f"{a.loc['all', 'random']} drawn at random", "",
             "| kind | verified (random) | abs. error median, max | random draws' median | rank corr. of abs. |",
             "|---|---|---|---|---|"]
    for kind, r in a.iterrows():
        if r["n"]:
            lines.append(f"| {kind} | {int(r['n'])} ({int(r['random'])}) | {r['median_error']:.3f}, {r['max_error']:.3f} | "
                         f"{_num(r['random_median_error'])} | {_num(r['rank_abs'], '.2f')} |")
    lines += ["", "| edge | screen | exact [95 % interval] |", "|---|---|---|"]
    for r in t.head(top + 10).itertuples():
        recv = r.receiver if r.receiver == "logits" else f"{r.receiver}.{r.input}@{r.positions}"
        exact = f"{r.effect:+.3f} [{r.low:+.3f}, {r.high:+.3f}]" if r.effect == r.effect else "not verified"
        lines.append(f"| {r.sender} -> {recv} | {r.score:+.3f} | {exact} |")
    return "\n".join(lines) + "\n"


def _num(value: float, spec: str = ".3f") -> str:
    """``value`` formatted, or an en dash where it was not measured (NaN)."""
    return format(value, spec) if value == value else "–"


@contextmanager
def _stage(label: str) -> Iterator[None]:
    """Print ``label`` when a stage starts, a line while it runs (:func:`heartbeat`) and its time when it ends."""
    from gna_interp.cli.stages import heartbeat

    start = time.perf_counter()
    print(f"[{label}] ...", flush=True)
    with heartbeat(lambda line: print(line, flush=True), label):
        yield
    print(f"[{label}]: {time.perf_counter() - start:.1f} s", flush=True)
