"""Scoring cost and accuracy: one-forward scoring vs the official per-candidate scorer; layer pruning.

One command (defaults: tiny Llama, tiny Mamba-2 and SmolLM2 when installed; 64 KV prompts, 10 pairs):

    python benchmarks/scoring.py
    python benchmarks/scoring.py --models smollm2 --templates completion,official --prune-ks 0,2,4,8,15

For every model and template it reports, for each scorer, the forward passes, the tokens fed, the wall
time, the largest score difference from the official scorer, and accuracy / logit diff / gold prob.
Scorers (``--scorers``): ``per_candidate`` (official: one forward of prompt + candidate per
candidate), ``rows`` (all teacher-forced rows batched, prompt repeated per row) and ``shared``
(prompts once, rows continued from the KV cache; attention-only models). ``--prune-ks`` adds a
``prune_curve`` run. Use ``--threads 1`` (default) on a shared CPU: more threads than free cores
make PyTorch's thread pool spin and run many times slower.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from gna_interp import load_model
from gna_interp.circuits import prune_curve
from gna_interp.models import smollm2_gguf_path
from gna_interp.models.tiny import build_tiny
from gna_interp.tasks import KVRetrieval
from gna_interp.engine import plan_scoring, run_plan



def load(name: str, tmp: Path):
    if name.startswith("tiny-"):
        return load_model(build_tiny(name.removeprefix("tiny-"), tmp / name), device=args.device)
    return load_model(name, device=args.device)


def measure(model, task, scorer: str, batch_size: int) -> dict:
    method = "per_candidate" if scorer == "per_candidate" else "auto"
    plan = plan_scoring(model, task.samples, method)
    share = {"shared": True, "rows": False}.get(scorer)
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    scores = run_plan(model, plan, batch_size=batch_size, share_prefix=share, progress=args.progress,
                      desc=f"{scorer}")
    if model.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = plan.n_shared_tokens if scorer == "shared" else plan.n_row_tokens
    return {"scorer": scorer, "forwards": scores.n_forwards, "tokens_fed": tokens, "seconds": round(seconds, 2),
            **{k: round(v, 4) for k, v in scores.metrics.items()}, "_scores": scores.scores}


def table(rows: list[dict], cols: list[str]) -> str:
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    torch.set_num_threads(args.threads)
    models = args.models.split(",") if args.models else \
        ["tiny-llama", "tiny-mamba2"] + (["smollm2-135m"] if smollm2_gguf_path() else [])
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            model = load(name, Path(tmp))
            for template in args.templates.split(","):
                task = KVRetrieval(args.pairs, args.n, args.seed, template)  # type: ignore[arg-type]
                scorers = [s for s in args.scorers.split(",") if s != "shared" or model.splits_prefix_cache]
                runs = [measure(model, task, s, args.batch_size) for s in scorers]
                ref = runs[0]["_scores"] if scorers[0] == "per_candidate" else None
                for r in runs:
                    got = r.pop("_scores")
                    r["max_abs_diff_vs_official"] = "" if ref is None else f"{(got - ref).abs().max().item():.1e}"
                    r.update(model=name, template=template, device=str(model.device))
                    results.append(r)
                print(f"\n## {name}, KV {args.pairs} pairs, {template} template, {args.n} prompts, "
                      f"batch {args.batch_size}, {model.device}")
                print(table(runs, ["scorer", "forwards", "tokens_fed", "seconds", "max_abs_diff_vs_official",
                                   "accuracy", "chance", "logit_diff", "gold_prob"]))
            if args.prune_ks:
                ks = [int(k) for k in args.prune_ks.split(",")]
                task = KVRetrieval(args.pairs, args.prune_n, args.seed, "completion")
                start = time.perf_counter()
                df = prune_curve(model, task, mode="from_end", ks=ks, batch_size=args.batch_size,
                                 progress=args.progress)
                print(f"\n## prune_curve(from_end) on {name}, {task.name}, {args.prune_n} prompts "
                      f"({time.perf_counter() - start:.0f}s)")
                print(table(df.round(3).to_dict("records"),
                            ["k", "skipped_kinds", "accuracy", "chance", "logit_diff", "gold_prob", "accuracy_drop"]))
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="", help="comma list: tiny-<family>, smollm2-135m, a path or hub id")
    p.add_argument("--templates", default="completion")
    p.add_argument("--n", type=int, default=64, help="prompts")
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=64, help="sequences per forward")
    p.add_argument("--scorers", default="per_candidate,rows,shared",
                   help="which of per_candidate (official, slow), rows, shared to run; the first is the reference")
    p.add_argument("--prune-ks", default="", help="e.g. 0,2,4,8: also run prune_curve(from_end) with these k")
    p.add_argument("--prune-n", type=int, default=16, help="prompts for prune_curve")
    p.add_argument("--device", default=None)
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1 is fastest on a shared, oversubscribed machine)")
    p.add_argument("--progress", action="store_true")
    p.add_argument("--out", default="", help="write all rows as JSON here")
    args = p.parse_args()
    main()
