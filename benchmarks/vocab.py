"""What the vocabulary costs: one random Llama-shaped architecture at several vocabulary sizes, in one run.

    python benchmarks/vocab.py                                   # vocabularies 1,024 .. 262,144
    python benchmarks/vocab.py --vocabs 1024,262144 --json out/vocab.json
    python benchmarks/vocab.py --vocabs 1024,262144 --short       # short prompts (about 30 tokens)

For each vocabulary the same random architecture (``--d-model`` 640, ``--layers`` 4, 4 query heads, 1 KV head;
weights seeded alike, only the embedding and unembedding rows differ) reads the same byte-level prompts (the
tokenizer of :func:`gna_interp.models.tiny.byte_tokenizer`, whose ids are all below 257, so every model sees the
same token ids and the extra rows are paid only by the unembedding). Two KV tasks (10 pairs, ``--samples``
prompts): single-token values (0-9) and two-token values (0-99, one byte per digit).

``--short``: the word-level tokenizer of the zoo (:func:`gna_interp.zoo.tokenizer.build_tokenizer`: every key, value
and template word one token, ids below 200) in place of the byte-level one, and the official KV template, so a
10-pair prompt is about 30 tokens: the blocks are cheap and the unembedding's share of every pass is largest. The
two-token task is then the same single-token task (every value 0-99 is one token).

Printed per vocabulary, in CPU seconds (``time.process_time``):

- ``eval1`` / ``eval2``: one intact :func:`~gna_interp.tasks.evaluate` of the single- / two-token task;
- ``exact/head``: the exact scan of every head (:func:`~gna_interp.circuits.scan_heads`, ``strategy="exact"``)
  per head, over ``eval1``;
- ``attribution``: the attribution pass over all heads, over ``eval1``.

Then the two ratios that say whether a cost grows with the vocabulary: each of the two cost ratios at the largest vocabulary over the same ratio at the
smallest, and ``eval2`` at the largest vocabulary over ``eval2`` at 49,152 (when both are in the run).

``--stages``: instead, the default ``gna scan`` (wall clock, as a user runs it, one process after the other) on
SmolLM2-135M (49,152 tokens) and on a random-weight model of a large-vocabulary family at its real width:
Gemma-3-270M's shape (``Gemma3ForCausalLM``: d_model 640, 18 layers, 4 query heads, 1 KV head, head_dim 256,
262,144 tokens), saved with SmolLM2's tokenizer (its ids are valid rows; the unembedding still has 262,144),
run with ``--allow-chance`` (random weights cannot retrieve). Prints each run's stage times from its
``circuit.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gna_interp import KVRetrieval, evaluate, load_model  # noqa: E402
from gna_interp.circuits import scan_heads  # noqa: E402
from gna_interp.constants import CIRCUIT_JSON  # noqa: E402
from gna_interp.models.tiny import byte_tokenizer  # noqa: E402

VOCABS = (1024, 32_768, 49_152, 131_072, 262_144)


def random_llama(vocab: int, d_model: int, layers: int, seed: int = 0) -> Any:
    """A random ``LlamaForCausalLM`` (4 query heads, 1 KV head) with ``vocab`` rows; the same block weights for
    every ``vocab`` (the blocks are initialised from ``seed`` before the embeddings)."""
    import transformers as T

    cfg = T.LlamaConfig(vocab_size=vocab, hidden_size=d_model, intermediate_size=4 * d_model, num_hidden_layers=layers,
                        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=2048,
                        tie_word_embeddings=False, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    return T.LlamaForCausalLM(cfg).eval()


def cpu_seconds(fn: Callable[[], Any], repeat: int = 1) -> float:
    """The least CPU time of ``repeat`` calls of ``fn``."""
    best = float("inf")
    for _ in range(repeat):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def measure(vocab: int, args: argparse.Namespace) -> dict[str, float]:
    """The costs of one vocabulary (see the module docstring)."""
    model = load_model(random_llama(vocab, args.d_model, args.layers), args.tokenizer)
    if args.short:
        from gna_interp.zoo.tokenizer import zoo_keys

        one = KVRetrieval(n_pairs=10, n_samples=args.samples, max_value=9, template="official", seed=0,
                          words=zoo_keys())
        two = KVRetrieval(n_pairs=10, n_samples=args.samples, max_value=99, template="official", seed=0,
                          words=zoo_keys())
    else:
        one = KVRetrieval(n_pairs=10, n_samples=args.samples, max_value=9, template="completion", seed=0)
        two = KVRetrieval(n_pairs=10, n_samples=args.samples, max_value=99, template="completion", seed=0)
    bs = args.batch_size
    evaluate(model, one, batch_size=bs, progress=False)  # warm-up
    eval1 = cpu_seconds(lambda: evaluate(model, one, batch_size=bs, progress=False), args.repeat)
    eval2 = cpu_seconds(lambda: evaluate(model, two, batch_size=bs, progress=False), args.repeat)
    n = len(model.heads())
    exact = cpu_seconds(lambda: scan_heads(model, one, strategy="exact", batch_size=bs, progress=False))
    attr = cpu_seconds(lambda: scan_heads(model, one, strategy="attribution", batch_size=bs, progress=False),
                       args.repeat)
    row = {"vocab": vocab, "eval1": eval1, "eval2": eval2, "exact_per_head": exact / n, "attribution": attr,
           "exact_ratio": exact / n / eval1, "attribution_ratio": attr / eval1}
    print(f"{vocab:>9,} {eval1:8.2f} {eval2:8.2f} {exact / n:11.2f} {attr:12.2f} {row['exact_ratio']:12.2f}x "
          f"{row['attribution_ratio']:12.2f}x", flush=True)
    del model
    return row


def gemma3_270m_folder(path: Path, tokenizer: Any, seed: int = 0) -> Path:
    """A random-weight ``Gemma3ForCausalLM`` of Gemma-3-270M's shape (see the module docstring) saved with
    ``tokenizer`` to ``path``."""
    import transformers as T

    from gna_interp.models.tiny import save_tiny

    cfg = T.Gemma3TextConfig(vocab_size=262_144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                             num_attention_heads=4, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                             sliding_window=512, max_position_embeddings=32_768)
    return save_tiny(cfg, T.Gemma3ForCausalLM, tokenizer, path, seed)


def default_runs(threads: int) -> list[dict[str, Any]]:
    """The default ``gna scan`` on SmolLM2-135M and on a random Gemma-3-270M-shaped model (``--stages``)."""
    import subprocess

    from gna_interp import load_model as load

    tmp = Path(tempfile.mkdtemp(prefix="gna-stages-"))
    gemma = gemma3_270m_folder(tmp / "gemma3-270m-random", load("smollm2-135m").tokenizer)
    runs = [("smollm2-135m", "smollm2-135m", []), ("gemma3-270m-random", str(gemma), ["--allow-chance"])]
    out = []
    for name, spec, extra in runs:
        folder = tmp / f"scan-{name}"
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "gna_interp", "--quiet", "scan", "--model", spec, "--out", str(folder),
                        "--threads", str(threads), *extra], check=True)
        wall = time.perf_counter() - t
        doc = json.loads((folder / CIRCUIT_JSON).read_text())
        row = {"model": name, "wall_s": wall, "stages_s": doc.get("timings", {}),
               "top5": [h for h in doc.get("circuit", doc.get("heads", []))[:5]]}
        stages = ", ".join(f"{k} {v:.0f}" for k, v in row["stages_s"].items())
        print(f"{name}: {wall:.0f} s wall ({stages})", flush=True)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocabs", default=",".join(map(str, VOCABS)), help="comma-separated vocabulary sizes")
    ap.add_argument("--d-model", type=int, default=640)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=2, help="timings keep the least of this many runs")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--short", action="store_true", help="short prompts: the zoo's word-level tokenizer (see above)")
    ap.add_argument("--stages", action="store_true", help="the default gna scan's stage times instead (see above)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.stages:
        runs = default_runs(args.threads)
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(runs, indent=2))
        return 0
    tmp = tempfile.mkdtemp(prefix="gna-vocab-")  # a tokenizer read from a folder, as a user's would be
    if args.short:
        from gna_interp.zoo.tokenizer import build_tokenizer

        build_tokenizer().save_pretrained(tmp)
    else:
        byte_tokenizer().save_pretrained(tmp)
    args.tokenizer = AutoTokenizer.from_pretrained(tmp)
    vocabs = [int(v) for v in args.vocabs.split(",")]
    form = "official, word-level tokens (short prompts)" if args.short else "completion, byte-level tokens"
    print(f"random Llama d_model {args.d_model}, {args.layers} layers, 4 query heads / 1 KV head; KV {form}, "
          f"10 pairs, {args.samples} prompts; CPU seconds, threads {args.threads}")
    print(f"{'vocab':>9} {'eval1':>8} {'eval2':>8} {'exact/head':>11} {'attribution':>12} {'exact/eval1':>13} "
          f"{'attr/eval1':>13}")
    rows = [measure(v, args) for v in vocabs]
    lo, hi = rows[0], rows[-1]
    out: dict[str, Any] = {"rows": rows, "exact_growth": hi["exact_ratio"] / lo["exact_ratio"],
                           "attribution_growth": hi["attribution_ratio"] / lo["attribution_ratio"]}
    print(f"\nfrom {lo['vocab']:,} to {hi['vocab']:,} tokens: exact per head / eval grows {out['exact_growth']:.2f}x, "
          f"attribution / eval {out['attribution_growth']:.2f}x (target: at most 1.5x each; 1.3x for attribution with "
          f"short prompts)")
    at49 = [r for r in rows if r["vocab"] == 49_152]
    if at49 and hi["vocab"] > 49_152:
        out["eval2_growth_vs_49k"] = hi["eval2"] / at49[0]["eval2"]
        print(f"two-token evaluation at {hi['vocab']:,} over 49,152: {out['eval2_growth_vs_49k']:.2f}x (target: at most 2x)")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
