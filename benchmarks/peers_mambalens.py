"""mamba-lens's per-head zero-ablation scan of a Mamba-1 model, in a process of its own (run by
``benchmarks/peers.py`` with the interpreter of the environment it builds for mamba-lens: its ``HookedMamba``
subclasses TransformerLens 2's ``HookedTransformer``, which TransformerLens 4 no longer has).

    python benchmarks/peers_mambalens.py JOB.json OUT.json [JOB.json OUT.json ...]

Imports no gna_interp. ``JOB.json`` is a ``peers_worker.py`` job (``model_dir``: a Hugging Face
``MambaForCausalLM`` folder; ``samples``; ``heads`` ``[[layer, channel], ...]``, each head the ``head_dim``
channels from ``channel`` on of the mixer's inner dimension; ``tool`` one of :data:`TOOLS`; ``threads``, ``device``,
``batch``, ``stack``, ``prompts``). ``OUT.json`` as ``peers_worker.py``'s, plus ``conversion_max_abs_diff``: the
largest |logit difference| of the converted ``HookedMamba`` and the folder's ``MambaForCausalLM`` (transformers'
sequential PyTorch path) on every prompt + candidate row of the task, checked below :data:`CONVERSION_TOL`.

The model: the folder's safetensors renamed to the original ``mamba_ssm`` names (``embeddings`` -> ``embedding``,
the tied ``lm_head`` from the embedding), mamba-lens's ``convert_original_state_dict_to_hooked_state_dict`` (which
splits ``in_proj`` into ``in_proj`` / ``skip_proj`` and ``x_proj`` into ``W_delta_1`` / ``W_B`` / ``W_C``) into a
``HookedMamba`` built from a ``MambaCfg`` of the folder's numbers (no vocabulary padding, each RMSNorm given the
folder's epsilon); mamba-lens's own PyTorch conv and scan (``fast_conv`` / ``fast_ssm`` need CUDA kernels).

A head is zeroed at ``blocks.{l}.hook_after_skip`` (``y * silu(z)``, the input of ``out_proj``: the project's
``blocks.{l}.mixer.out_proj.hook_in``). Tools:

- ``ml-plain``: per head ``model.run_with_hooks(ids, fwd_hooks=[(hook, zero the channels)])`` over every prompt +
  candidate row, right-padded, the full logits;
- ``ml-best``: each prompt once where every candidate is one token (read at the prompt's last token; else every
  prompt + candidate row), right-padded (``HookedMamba`` takes no attention mask; the model is causal), one clean
  ``run_with_cache`` keeping each scanned layer's ``hook_resid_pre``, then the heads of a layer stacked ``stack`` to a
  forward over copies of the batch, replayed from that layer through ``model.blocks`` under ``model.hooks(...)``
  (mamba-lens's ``start_at_layer`` unpacks its input as ``[batch, pos]`` token ids and fails on a residual), the final
  norm and unembedding at the reads only;
- ``ml-attr``: gradient attribution, ``Σ z · ∂metric/∂z`` over each head's channels at every position: a forward hook
  keeping ``hook_after_skip``, a backward hook keeping its gradient (``model.hooks(fwd_hooks, bwd_hooks)``), the graph
  from ``hook_embed``, over every prompt + candidate row;
- ``ml-attr-best``: the same estimate over ``ml-best``'s rows, the graph from the first scanned layer's
  ``hook_resid_pre``, ``stop_at_layer`` and the unembedding at the reads, ``torch.autograd.grad`` at the kept values.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers_worker import (TIMER, _version, attribution, chunks, hooked_grads, metric, plain_scores,  # noqa: E402
                          right_padded, serve)

TOOLS = ("ml-plain", "ml-best", "ml-attr", "ml-attr-best")
CONVERSION_TOL = 1e-4


def hooked_mamba(job: dict) -> tuple[Any, float]:
    """The folder's ``MambaForCausalLM`` as a ``HookedMamba`` (float32, parameters frozen), and the largest |logit
    difference| of the two on the task's rows (ValueError above :data:`CONVERSION_TOL`)."""
    from mamba_lens import HookedMamba, MambaCfg, convert_original_state_dict_to_hooked_state_dict
    from safetensors.torch import load_file
    from transformers import MambaConfig, MambaForCausalLM

    c = MambaConfig.from_pretrained(job["model_dir"])
    if c.use_bias or not c.use_conv_bias or c.hidden_act != "silu":
        raise ValueError(f"HookedMamba has no in/out projection bias, always a conv bias and silu: this folder has "
                         f"use_bias={c.use_bias}, use_conv_bias={c.use_conv_bias}, hidden_act={c.hidden_act}")
    cfg = MambaCfg(d_model=c.hidden_size, n_layers=c.num_hidden_layers, vocab_size=c.vocab_size,
                   d_state=c.state_size, d_inner=c.intermediate_size, dt_rank=c.time_step_rank, d_conv=c.conv_kernel,
                   pad_vocab_size_multiple=1, device=job["device"])
    state: dict = {}
    for f in sorted(Path(job["model_dir"]).glob("*.safetensors")):
        state.update({k.replace("backbone.embeddings.", "backbone.embedding."): v for k, v in load_file(str(f)).items()})
    state.setdefault("lm_head.weight", state["backbone.embedding.weight"])  # tied
    model = HookedMamba(cfg, tokenizer=None)
    model.load_state_dict(convert_original_state_dict_to_hooked_state_dict(cfg, state), strict=True)
    for m in model.modules():
        if hasattr(m, "eps"):  # RMSNorm's
            m.eps = c.layer_norm_epsilon
    model = model.to(job["device"]).eval().requires_grad_(False)
    # the check: the same rows through transformers' own model (its sequential PyTorch path)
    hf = MambaForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, use_mambapy=False).eval()
    seqs = [s["prompt"] + c for s in job["samples"] for c in s["cands"]]
    ids = right_padded(seqs, 0)
    real = torch.tensor([[t < len(s) for t in range(ids.shape[1])] for s in seqs])
    with torch.no_grad():
        diff = float((model(ids.to(job["device"])).cpu() - hf(ids).logits)[real].abs().max())
    if not diff <= CONVERSION_TOL:
        raise ValueError(f"HookedMamba's logits differ from MambaForCausalLM's by {diff:.2e} (> {CONVERSION_TOL})")
    return model, diff


def reads(samples: list[dict], per: int, pad: int) -> list[tuple[torch.Tensor, list[tuple[int, int, int, int, int]]]]:
    """Batches of at most ``per`` right-padded rows, each with its reads ``(row, position, token, sample, cand)``:
    each prompt once where every candidate is one token (all read at the prompt's last token), else every prompt +
    candidate row (its candidate's tokens read after the prompt)."""
    rows: list[tuple[list[int], list[tuple[int, int, int, int]]]] = []
    if all(len(c) == 1 for s in samples for c in s["cands"]):
        rows = [(s["prompt"], [(len(s["prompt"]) - 1, c[0], i, j) for j, c in enumerate(s["cands"])])
                for i, s in enumerate(samples)]
    else:
        rows = [(s["prompt"] + c, [(len(s["prompt"]) - 1 + t, c[t], i, j) for t in range(len(c))])
                for i, s in enumerate(samples) for j, c in enumerate(s["cands"])]
    out = []
    for k in range(0, len(rows), per):
        part = rows[k:k + per]
        out.append((right_padded([seq for seq, _ in part], pad),
                    [(r, *rd) for r, (_, rs) in enumerate(part) for rd in rs]))
    return out


def read_logp(model: Any, resid: torch.Tensor, at: list, n_copies: int) -> torch.Tensor:
    """The log-probabilities of the read tokens ``[copies, reads]`` from the last layer's output ``resid`` of
    ``n_copies`` copy-major copies of a batch: the final norm and the unembedding at the read positions only."""
    rows, pos, toks = (torch.tensor([a[k] for a in at]) for k in range(3))
    n = resid.shape[0] // n_copies
    idx = torch.cat([rows + c * n for c in range(n_copies)])
    logp = torch.log_softmax(model.lm_head(model.norm(resid[idx, pos.repeat(n_copies)])).float(), -1)
    return logp[torch.arange(len(idx)), toks.repeat(n_copies)].view(n_copies, len(at))


def add_scores(scores: list[list[list[float]]], logp: torch.Tensor, at: list) -> None:
    """Each copy's read log-probabilities added to its candidates' scores."""
    vals = logp.tolist()
    for c, sc in enumerate(scores):
        for v, (_, _, _, i, j) in zip(vals[c], at):
            sc[i][j] += v


def zero_cols(cols: list[tuple[int, int]]) -> Callable:
    """A hook zeroing, in copy ``c`` of a copy-major batch, the channels ``cols[c]`` (``(start, stop)``)."""
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
        size = x.shape[0] // len(cols)
        for c, (a, b) in enumerate(cols):
            x[c * size:(c + 1) * size, :, a:b] = 0.0
        return x
    return hook


def run(job: dict, model: Any, form: str) -> tuple[float, dict[str, float]]:
    """``(clean metric, {"L{l}H{channel}": drop or estimate})`` of one mamba-lens form."""
    samples, w, pad = job["samples"], job["head_dim"], 0
    golds = [s["gold"] for s in samples]
    hook = "blocks.{}.hook_after_skip".format
    layers = sorted({l for l, _ in job["heads"]})
    n_layers = model.cfg.n_layers
    drops: dict[str, float] = {}
    if form == "plain":
        clean = metric(plain_scores(samples, job["batch"], pad, model), golds)
        for l, h in job["heads"]:
            hooks = [(hook(l), zero_cols([(h, h + w)]))]
            s = plain_scores(samples, job["batch"], pad, lambda ids: model.run_with_hooks(ids, fwd_hooks=hooks))
            drops[f"L{l}H{h}"] = clean - metric(s, golds)
        return clean, drops
    if form == "attr":
        fb = hooked_grads(model, hook, layers, lambda x: x.unsqueeze(-1))  # a channel a unit
        units = [(l, c) for l, h in job["heads"] for c in range(h, h + w)]
        clean, est = attribution(samples, job["batch"], pad, units, fb)
        return clean, {f"L{l}H{h}": sum(est[f"L{l}H{c}"] for c in range(h, h + w)) for l, h in job["heads"]}
    scores = [[0.0] * len(s["cands"]) for s in samples]
    if form == "attr-best":
        est = {f"L{l}H{h}": 0.0 for l, h in job["heads"]}
        for ids, at in reads(samples, job["prompts"], pad):
            zs: dict = {}
            leaf = [(f"blocks.{layers[0]}.hook_resid_pre", lambda x, hook: x.detach().requires_grad_(True))]
            keep = [(hook(l), lambda z, hook, l=l: zs.__setitem__(l, z)) for l in layers]
            with torch.enable_grad():
                with model.hooks(fwd_hooks=leaf + keep):
                    logp = read_logp(model, model(ids, stop_at_layer=n_layers), at, 1)
                part: dict[tuple[int, int], torch.Tensor] = {}
                for v, (_, _, _, i, j) in zip(logp[0], at):
                    part[(i, j)] = part[(i, j)] + v if (i, j) in part else v
                total = torch.zeros(())
                for i in sorted({i for i, _ in part}):
                    s = samples[i]
                    other = max((j for j in range(len(s["cands"])) if j != s["gold"]),
                                key=lambda j: float(part[(i, j)]))
                    total = total + part[(i, s["gold"])] - part[(i, other)]
                grads = torch.autograd.grad(total / len(samples), [zs[l] for l in layers])
            add_scores([scores], logp.detach(), at)
            prod = {l: (zs[l].detach() * g).sum(dim=(0, 1)) for l, g in zip(layers, grads)}  # per channel
            for l, h in job["heads"]:
                est[f"L{l}H{h}"] += float(prod[l][h:h + w].sum())
        return metric(scores, golds), est
    # best: each prompt once, one clean pass keeping each layer's input, the heads replayed from their layer
    per_head = {(l, h): [[0.0] * len(s["cands"]) for s in samples] for l, h in job["heads"]}
    names = [f"blocks.{l}.hook_resid_pre" for l in layers]
    for ids, at in reads(samples, job["prompts"], pad):
        resid, cache = model.run_with_cache(ids, names_filter=names, stop_at_layer=n_layers)
        add_scores([scores], read_logp(model, resid, at, 1), at)
        for l in layers:
            for group in chunks([h for hl, h in job["heads"] if hl == l], job["stack"]):
                x = cache[f"blocks.{l}.hook_resid_pre"].repeat(len(group), 1, 1)
                with model.hooks(fwd_hooks=[(hook(l), zero_cols([(h, h + w) for h in group]))]):
                    for block in model.blocks[l:]:
                        x = block(x)
                add_scores([per_head[(l, h)] for h in group], read_logp(model, x, at, len(group)), at)
    clean = metric(scores, golds)
    return clean, {f"L{l}H{h}": clean - metric(s, golds) for (l, h), s in per_head.items()}


def run_job(job: dict) -> dict:
    """One mamba-lens form's scan: the conversion and its check untimed, a warm-up on two prompts and one head, then
    the timed run."""
    model, diff = hooked_mamba(job)
    form = job["tool"].split("-", 1)[1]
    with torch.no_grad():
        run({**job, "samples": job["samples"][:2], "heads": job["heads"][:1]}, model, form)
        TIMER.start()
        clean, drops = run(job, model, form)
    return {"version": f"mamba-lens {_version('mamba_lens')} (transformer-lens {_version('transformer-lens')})",
            "clean": clean, "drops": drops, "conversion_max_abs_diff": diff}


if __name__ == "__main__":
    raise SystemExit(serve(sys.argv[1:], run_job))
