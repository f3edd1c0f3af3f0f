"""``gna circuit``: whether a scanned circuit suffices -- its faithfulness curve, the smallest circuit keeping a
threshold of the intact logit difference, and each of its heads' own contribution
(:func:`~gna_interp.circuits.sufficiency.faithfulness`)."""

from __future__ import annotations

import argparse
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator

from gna_interp.constants import EDGES_CSV, EDGE_GRAPH_HTML, EDGE_SCREEN_CSV, FAITHFULNESS_HTML, ROLES_CSV
from gna_interp.cli import command
from gna_interp.constants import CIRCUIT_JSON, CONTROL_CKPT, EDGE_FAITHFULNESS, SCAN_CKPT, WHOLE_DIR
from gna_interp.cli.args import at_least, claim_out, compute_args, load_for, model_arg, seeds_arg

if TYPE_CHECKING:
    from pathlib import Path

    import pandas as pd

    from gna_interp.circuits.edge_screen import EdgeScreen
    from gna_interp.tasks.base import Task


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 0:
        raise argparse.ArgumentTypeError(f"sizes must be integers >= 0, got {text!r}")
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
                        "one random series, no minimality, the scan's own edge table, 20 verified edges")
    p.add_argument("--samples", type=at_least(0), default=None,
                   help="measure on the first N of the scan's prompts (default 0: all of them; --quick 10, which cuts the "
                        "default task's forwards by about 60%% and widens its intervals by about 1.5x)")
    p.add_argument("--seeds", type=seeds_arg(0), default=None, help="random circuits at each size (default 3; --quick 1)")
    p.add_argument("--minimality", type=at_least(0), default=None,
                   help="measure the own contribution of the smallest circuit's first N heads, each replayed from its "
                        "layer (default 30; --quick 0)")
    p.add_argument("--edges", type=at_least(0), default=None,
                   help="measure the edge table among the first N heads of the circuit (the ranking without its generic "
                        "heads) by path patching (k/v at the lines and at the decision, q at the decision, each head's "
                        "direct path), with each head's causal role (default 5; 0, the --quick default: the scan's own "
                        "edge table and roles)")
    p.add_argument("--verify", type=at_least(0), default=None,
                   help="screen every edge of the whole graph (embeddings, heads, MLPs -> heads' q/k/v, MLPs, logits) "
                        "by edge attribution and measure the N strongest by exact path patching (default 40, --quick 20; "
                        "the top-20 overlap of screen and exact is read among them; 0: no screen)")
    p.add_argument("--ig-steps", type=at_least(0), default=0,
                   help="score the screen's edges with integrated gradients along the ablation path at N points "
                        "(EAP-IG; default 0: the gradient of the intact model, plain EAP)")
    p.add_argument("--edge-seeds", type=seeds_arg(0), default=None,
                   help="random edge circuits at each size of the edge curve (default 1; --quick 0)")
    p.add_argument("--edge-precision", type=_share, default=None,
                   help="stop the search for the smallest edge circuit once it is known to within this share of its "
                        "size (default 0.05; --quick 0.1)")
    p.add_argument("--edge-minimality", type=at_least(0), default=None,
                   help="measure the own contribution of the smallest edge circuit's first N edges, one run each "
                        "(default 8; --quick 0)")
    compute_args(p)
    p.add_argument("--out", default="gna_circuit", help="output folder (default gna_circuit)")
    p.add_argument("--fresh", action="store_true", help="--out may hold another command's results: delete them first")
    p.set_defaults(run=run_circuit)


# The options --quick sets when they are not given: (default, quick).
PRESETS = {"samples": (0, 10), "edge_precision": (0.05, 0.1), "seeds": (3, 1), "minimality": (30, 0), "edges": (5, 0),
           "verify": (40, 20), "edge_seeds": (1, 0),
           "edge_minimality": (8, 0)}


def run_circuit(args: argparse.Namespace) -> int:
    from gna_interp.circuits import Circuit, faithfulness
    from gna_interp.progress import quiet

    for name, (full, light) in PRESETS.items():
        if getattr(args, name) is None:
            setattr(args, name, light if args.quick else full)
    folder = claim_out(args, "circuit")  # before the model loads
    circuit = Circuit.load(args.scan)
    model = load_for(args, args.model or circuit.model)
    task = _first_samples(circuit.load_task(), args.samples)
    ranked = circuit.scan.top(len(circuit.scan.heads))
    with _stage("faithfulness: every head outside the first k of the ranking ablated"):
        fx = faithfulness(model, task, ranked, method=args.method, threshold=args.threshold,
                          sizes=args.sizes, seeds=args.seeds, minimality=args.minimality,
                          batch_size=args.batch_size)
    print(fx.report())
    edges = roles = None
    if args.edges:
        from gna_interp.circuits.causal import causal_roles, measure_edges

        with _stage(f"edges among the circuit's first {args.edges} heads (path patching)"):
            edges = measure_edges(model, task, circuit.heads[:args.edges], decision_kv=True,
                                  batch_size=args.batch_size)
        roles = causal_roles(edges, circuit.edge_drops())
        print(_edge_report(edges, roles))
    elif circuit.edges is not None and len(circuit.edges):
        from gna_interp.circuits.causal import causal_roles

        roles = causal_roles(circuit.edges, circuit.edge_drops())  # the scan's own edge table
    screen = None
    if args.verify:
        from gna_interp.circuits.edge_screen import screen_edges

        with _stage("the whole graph: edge attribution, then the strongest edges by path patching"):
            screen = screen_edges(model, task, args.method, task if args.method == "mean"
                                  else None, verify=args.verify, batch_size=args.batch_size, ig_steps=args.ig_steps,
                                  progress=None if quiet() else lambda line: print(line, flush=True))
        print(_screen_report(screen, 20))
    efx = None
    if screen is not None:
        efx = _edge_circuit(args, model, task, screen, fx.smallest)
    from gna_interp.viz.faithfulness import faithfulness_curve

    with folder.hold(args.fresh):
        written = fx.write(folder.path)
        if edges is not None and roles is not None:
            for name, frame in ((EDGES_CSV, edges), (ROLES_CSV, roles)):
                frame.to_csv(folder.path / name, index=False)
                written.append(folder.path / name)
        if screen is not None:
            from gna_interp.viz.edge_graph import edge_graph

            screen.table.to_csv(folder.path / EDGE_SCREEN_CSV, index=False)
            edge_graph(screen, title=f"{model.name}: the strongest edges of the whole graph").write_html(
                folder.path / EDGE_GRAPH_HTML, include_plotlyjs=True)
            written += [folder.path / EDGE_SCREEN_CSV, folder.path / EDGE_GRAPH_HTML]
        html = folder.path / FAITHFULNESS_HTML
        faithfulness_curve(fx, title=f"{model.name}: faithfulness of the scanned circuit").write_html(
            html, include_plotlyjs=True)
        written.append(html)
        if efx is not None:
            written += efx.write(folder.path, stem=EDGE_FAITHFULNESS)
            html = folder.path / f"{EDGE_FAITHFULNESS}.html"
            faithfulness_curve(efx, title=f"{model.name}: faithfulness of edge circuits").write_html(
                html, include_plotlyjs=True)
            written.append(html)
            written += _whole_report(args.scan, folder.path / WHOLE_DIR, efx, roles, model.n_layers)
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0


def _first_samples(task: "Task", n: int) -> "Task":
    """The task's first ``n`` samples (all of them for 0 or more than it has), saying so when it is cut."""
    if not n or n >= len(task):
        return task
    from gna_interp.tasks.base import Task

    print(f"measuring on the first {n} of the task's {len(task)} prompts (--samples)")
    return Task(task.name, task.samples[:n])


def _edge_circuit(args: argparse.Namespace, model: Any, task: Any, screen: "EdgeScreen", heads: Any) -> Any:
    """The edge faithfulness curve -- the edges out of the smallest node circuit's ``heads`` first, each part in
    screen order -- and the smallest edge circuit (None, with a line saying why, where the model's blocks do not
    allow edge circuits)."""
    from gna_interp.circuits.sufficiency import edge_faithfulness
    from gna_interp.errors import UnsupportedArchitectureError

    with _stage("edge circuits: the strongest edges kept in screen order, every other edge ablated"):
        try:
            efx = edge_faithfulness(model, task, screen, method=args.method, threshold=args.threshold,
                                    seeds=args.edge_seeds, minimality=args.edge_minimality,
                                    precision=args.edge_precision, first=heads or None,
                                    batch_size=args.batch_size)
        except UnsupportedArchitectureError as e:
            print(f"no edge circuit: {e}")
            return None
    print(efx.report().split("\n\n| size")[0])
    return efx


def _whole_report(scan: str, out: "Path", efx: Any, roles: "pd.DataFrame | None", n_layers: int) -> list["Path"]:
    """``out``: the scan's circuit with the smallest edge circuit as ``whole`` in its circuit.json, and its report
    (the graph with every node and edge of the edge circuit); nothing where no edge circuit keeps the threshold."""
    import json
    import shutil
    from pathlib import Path

    from gna_interp.circuits.edge_circuit import whole_circuit

    role_of = dict(zip(roles["name"], roles["causal_role"])) if roles is not None else {}
    whole = whole_circuit(efx, efx.scores, role_of, n_layers)
    if whole is None:
        return []
    out.mkdir(exist_ok=True)
    src = Path(scan)
    for f in src.iterdir():
        if f.is_file() and f.suffix in (".json", ".pt", ".csv") and f.name not in (SCAN_CKPT, CONTROL_CKPT):
            shutil.copy2(f, out / f.name)
    doc = json.loads((src / CIRCUIT_JSON).read_text(encoding="utf-8"))
    doc["whole"] = whole
    (out / CIRCUIT_JSON).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    from gna_interp.report.build import build_report

    return [out / CIRCUIT_JSON, build_report(out, png=False)]


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
    """The whole-graph screen's strongest edges (exact effect beside the estimate) and its agreement, as Markdown."""
    t = screen.table
    a = screen.agreement(top)
    senders = set(t["sender"])
    mlps = sum(1 for s in senders if s.startswith("MLP"))
    lines = ["## The whole graph (edge attribution, the strongest verified by path patching)", "",
             f"{len(t)} edges screened (senders: the embeddings, {len(senders) - mlps - 1} heads, {mlps} MLPs); "
             f"{a['n']} verified, and among them the top {min(top, a['n'])} by screen and by exact effect overlap "
             f"{a['overlap']:.2f}; rank correlation "
             f"{a['spearman']:.2f}, |screen - exact| median {a['median_error']:.3f}, max {a['max_error']:.3f}", "",
             "| edge | screen | exact [95 % interval] |", "|---|---|---|"]
    for r in t.head(top + 10).itertuples():
        recv = r.receiver if r.receiver == "logits" else f"{r.receiver}.{r.input}@{r.positions}"
        exact = f"{r.effect:+.3f} [{r.low:+.3f}, {r.high:+.3f}]" if r.effect == r.effect else "not verified"
        lines.append(f"| {r.sender} -> {recv} | {r.score:+.3f} | {exact} |")
    return "\n".join(lines) + "\n"


@contextmanager
def _stage(label: str) -> Iterator[None]:
    """Print ``label`` when a stage starts, a line while it runs (:func:`heartbeat`) and its time when it ends."""
    from gna_interp.cli.stages import heartbeat

    start = time.perf_counter()
    print(f"[{label}] ...", flush=True)
    with heartbeat(lambda line: print(line, flush=True), label):
        yield
    print(f"[{label}]: {time.perf_counter() - start:.1f} s", flush=True)
