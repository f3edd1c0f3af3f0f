"""One peer tool's per-head ablation scan, in a process of its own (run by ``benchmarks/peers.py``).

    python benchmarks/peers_worker.py JOB.json OUT.json [JOB.json OUT.json ...]

Imports no gna_interp: the tools that cannot share the project's environment run here from their own virtual
environment, on a Hugging Face model folder and the task's token ids written by ``peers.py``. ``JOB.json`` holds
``model_dir``, ``samples`` (each ``prompt`` ids, ``cands`` lists of ids, ``gold``), ``heads`` ``[[layer, head],
...]``, ``tool`` (one of :data:`TOOLS`), ``threads``, ``device``, ``batch`` (rows a forward), ``stack`` (heads a
forward, for the forms that stack them) and ``prompts`` (prompts a forward in those forms). ``OUT.json`` gets ``clean`` (the intact metric), ``drops`` (``{"L1H2":
drop}``), ``wall_s``, ``cpu_s`` and ``peak_mib`` (resident-set growth during the scan) and the tool's version.

The task is the one ``gna scan`` scores: a candidate's score is the sum of its tokens' log-probabilities after the
prompt, the metric the mean over prompts of the gold candidate's score minus the best other one's, a head's drop the
intact metric minus the metric with that head's output (the input of the attention output projection, its
``head_dim`` columns) set to zero at every position.

Two forms of each tool (see ``docs/peers.md``):

- **plain**: what each tool's documentation shows -- one forward per head over every (prompt + candidate) row,
  the logits of every position, log-softmax over the whole vocabulary;
- **best**: what a skilled user of the tool writes -- the prompt run once per ablation and its key/value cache
  continued by the candidates' tokens (Hugging Face ``past_key_values``, passed through the tool), logits only at
  the positions the metric reads (``logits_to_keep``), and ``stack`` heads per forward (the batch copied, each copy
  with another head removed) where the tool allows.
"""

from __future__ import annotations

import copy
import json
import os
import sys
import time
from typing import Any, Callable

import torch

# models whose heads are columns of their layer's output projection input, with no key/value cache for the candidates
# to continue: a Mamba-2 head, Mamba-1 channels, and a hybrid's heads of either kind (Bamba: attention's o_proj, the
# Mamba-2 mixer's out_proj)
SSM_KINDS = ("ssm2", "ssm1", "hybrid")


def decoder(hf: Any) -> Any:
    """The decoder of a Hugging Face causal LM: ``backbone`` (Mamba-1/2) or ``model`` (transformers, Bamba); the same
    name on an nnsight ``LanguageModel``."""
    return hf.backbone if hasattr(hf, "backbone") else hf.model


def out_path(layer: Any) -> tuple[str, str]:
    """``(mixer, projection)``: where decoder layer ``layer`` keeps the output projection whose input holds its heads'
    columns -- ``mixer.out_proj`` (Mamba-1/2), ``mamba.out_proj`` or ``self_attn.o_proj`` (Bamba, Llama)."""
    for mixer in ("mixer", "mamba", "self_attn"):
        m = getattr(layer, mixer, None)
        if m is not None:
            return mixer, "out_proj" if hasattr(m, "out_proj") else "o_proj"
    raise ValueError(f"no mixer with an output projection in {type(layer).__name__}")


def out_proj(layer: Any) -> Any:
    """Decoder layer ``layer``'s output projection (:func:`out_path`), as a module or as an nnsight envoy."""
    mixer, proj = out_path(layer)
    return getattr(getattr(layer, mixer), proj)

TOOLS = ("tl-plain", "tl-best", "tl-patching", "tl-attr", "tl-attr-best", "nnsight-plain", "nnsight-best",
         "nnsight-attr", "nnsight-attr-best", "pyvene-plain", "pyvene-best")


# ---- shared plumbing (tokens, padding, reading scores) ------------------------------------------------------------
def rss_mib() -> tuple[float, float]:
    """(current, peak) resident set in MiB (Linux ``/proc/self/status``)."""
    cur = peak = 0.0
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                cur = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                peak = int(line.split()[1]) / 1024
    return cur, peak


def reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


class Timer:
    """Started by a tool once its model is wrapped (the wrapping is not timed): wall and CPU seconds and the
    resident-set growth from there."""

    def start(self) -> None:
        self.base, _ = rss_mib()
        reset_peak()
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self) -> dict:
        wall, cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu
        _, peak = rss_mib()
        return {"wall_s": wall, "cpu_s": cpu, "peak_mib": max(0.0, peak - self.base)}


TIMER = Timer()


def metric(scores: list[list[float]], golds: list[int]) -> float:
    """Mean over prompts of gold score minus the best other candidate's score."""
    out = []
    for s, g in zip(scores, golds):
        other = max(v for j, v in enumerate(s) if j != g)
        out.append(s[g] - other)
    return sum(out) / len(out)


def sample_groups(samples: list[dict], rows: int) -> list[list[int]]:
    """Consecutive prompts grouped so that a group's prompt + candidate rows number at most ``rows`` (one prompt at
    least)."""
    groups: list[list[int]] = [[]]
    n = 0
    for i, s in enumerate(samples):
        if groups[-1] and n + len(s["cands"]) > rows:
            groups.append([])
            n = 0
        groups[-1].append(i)
        n += len(s["cands"])
    return groups


def full_rows(samples: list[dict]) -> list[tuple[int, int, list[int], int]]:
    """``(sample, cand, ids, prompt_len)`` for every prompt + candidate row (the plain form)."""
    return [(i, j, s["prompt"] + c, len(s["prompt"])) for i, s in enumerate(samples) for j, c in enumerate(s["cands"])]


def right_padded(seqs: list[list[int]], pad: int) -> torch.Tensor:
    n = max(len(s) for s in seqs)
    return torch.tensor([s + [pad] * (n - len(s)) for s in seqs])


def left_padded(samples: list[dict], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples' prompts left-padded, with their attention mask (1 at real tokens)."""
    n = max(len(s["prompt"]) for s in samples)
    ids = torch.tensor([[pad] * (n - len(s["prompt"])) + s["prompt"] for s in samples])
    mask = torch.tensor([[0] * (n - len(s["prompt"])) + [1] * len(s["prompt"]) for s in samples])
    return ids, mask


def plain_scores(samples: list[dict], batch: int, pad: int, forward: Callable[[torch.Tensor], torch.Tensor]
                 ) -> list[list[float]]:
    """Scores of every candidate from full rows, right-padded (causal: the padding after a row's tokens changes
    nothing before it), ``forward(ids) -> logits [rows, pos, vocab]`` with the tool's ablation active."""
    rows = full_rows(samples)
    scores = [[0.0] * len(s["cands"]) for s in samples]
    for k in range(0, len(rows), batch):
        part = rows[k:k + batch]
        ids = right_padded([r[2] for r in part], pad)
        logp = torch.log_softmax(forward(ids).float(), -1)
        for b, (i, j, seq, p) in enumerate(part):
            toks = torch.tensor(seq[p:])
            pos = torch.arange(p - 1, len(seq) - 1)
            scores[i][j] = float(logp[b, pos, toks].sum())
    return scores


class Layout:
    """The best form's batches: prompts left-padded (one row per prompt), then the continuation rows -- every
    candidate with more than one token fed after its prompt's cache, right-padded -- with where each read is."""

    def __init__(self, samples: list[dict], pad: int) -> None:
        self.samples = samples
        self.prompt_ids, self.prompt_mask = left_padded(samples, pad)
        self.cont = [(i, j, c) for i, s in enumerate(samples) for j, c in enumerate(s["cands"]) if len(c) > 1]
        self.cont_src = torch.tensor([i for i, _, _ in self.cont], dtype=torch.long)
        if self.cont:
            m = max(len(c) - 1 for _, _, c in self.cont)
            self.cont_ids = torch.tensor([c[:-1] + [pad] * (m - len(c) + 1) for _, _, c in self.cont])
            fed = torch.tensor([[1] * (len(c) - 1) + [0] * (m - len(c) + 1) for _, _, c in self.cont])
            self.cont_mask = torch.cat([self.prompt_mask[self.cont_src], fed], 1)

    def scores(self, first: torch.Tensor, cont: torch.Tensor | None) -> list[list[float]]:
        """From the log-probs at the prompts' last position ``[prompts, vocab]`` and at the continuation positions
        ``[rows, fed, vocab]``."""
        out = []
        for i, s in enumerate(self.samples):
            out.append([float(first[i, c[0]]) for c in s["cands"]])
        for r, (i, j, c) in enumerate(self.cont):
            out[i][j] += float(sum(cont[r, t, c[t + 1]] for t in range(len(c) - 1)))
        return out


def best_scores(lay: Layout, n_copies: int, run: Callable[..., Any]) -> list[list[list[float]]]:
    """Scores of ``n_copies`` copies of the task (copy ``k`` under the ablation the tool gives it) from one prompt
    forward and one continuation forward: ``run(ids, mask, past, keep, position_ids)`` returns ``(logits at the last
    ``keep`` positions, cache)`` (the batch is copy-major)."""
    k = n_copies
    ids, mask = lay.prompt_ids.repeat(k, 1), lay.prompt_mask.repeat(k, 1)
    # explicit positions, counted from each prompt's first real token, continued by its candidates: every tool then
    # places the tokens alike (nnsight derives such positions for a left-padded batch by itself; HF's default counts
    # the padding, which a continuation after a cache would contradict)
    logits, cache = run(ids, mask, None, 1, (mask.cumsum(-1) - 1).clamp(min=0))
    first = torch.log_softmax(logits[:, -1].float(), -1)
    cont = None
    if lay.cont:
        n = lay.prompt_ids.shape[0]
        src = torch.cat([lay.cont_src + c * n for c in range(k)])
        cache.batch_select_indices(src)
        real = lay.prompt_mask.sum(-1)[lay.cont_src]
        pos = (real[:, None] + torch.arange(lay.cont_ids.shape[1])[None]).repeat(k, 1)
        cl, _ = run(lay.cont_ids.repeat(k, 1), lay.cont_mask.repeat(k, 1), cache, lay.cont_ids.shape[1], pos)
        cont = torch.log_softmax(cl.float(), -1)
    n, r = lay.prompt_ids.shape[0], len(lay.cont)
    return [lay.scores(first[c * n:(c + 1) * n], None if cont is None else cont[c * r:(c + 1) * r]) for c in range(k)]


def best_all(samples: list[dict], pad: int, per: int, n_copies: int, run: Callable[..., Any]) -> list[list[list[float]]]:
    """:func:`best_scores` over the prompts ``per`` at a time (the continuation rows each hold a copy of their
    prompt's cache: the memory of a forward grows with copies x prompts x candidates)."""
    out: list[list[list[float]]] = [[] for _ in range(n_copies)]
    for k in range(0, len(samples), per):
        for c, s in enumerate(best_scores(Layout(samples[k:k + per], pad), n_copies, run)):
            out[c] += s
    return out


def copies_scores(samples: list[dict], batch: int, pad: int, n_copies: int, forward: Callable[[torch.Tensor], Any]
                  ) -> list[list[list[float]]]:
    """Scores of ``n_copies`` copies of the task from full rows, each batch of rows repeated copy-major in one forward
    (copy ``k`` under the ablation the tool gives it): :func:`ssm_scores` where a candidate has more than one token."""
    rows = full_rows(samples)
    out = [[[0.0] * len(s["cands"]) for s in samples] for _ in range(n_copies)]
    for k in range(0, len(rows), batch):
        part = rows[k:k + batch]
        ids = right_padded([r[2] for r in part], pad)
        logp = torch.log_softmax(forward(ids.repeat(n_copies, 1)).float(), -1)
        for c in range(n_copies):
            for b, (i, j, seq, p) in enumerate(part):
                toks, pos = torch.tensor(seq[p:]), torch.arange(p - 1, len(seq) - 1)
                out[c][i][j] = float(logp[c * len(part) + b, pos, toks].sum())
    return out


def ssm_scores(samples: list[dict], batch: int, pad: int, n_copies: int,
               forward: Callable[[torch.Tensor, torch.Tensor | None], Any]) -> list[list[list[float]]]:
    """:func:`copies_scores` for a state-space model, each prompt run once where every candidate is one token:
    the prompts left-padded (``forward(ids, mask)``, the mask zeroing the padding's inputs) and every candidate read
    at the prompt's last position; full rows (``mask`` None) where a candidate has more tokens."""
    if any(len(c) != 1 for s in samples for c in s["cands"]):
        return copies_scores(samples, batch, pad, n_copies, lambda ids: forward(ids, None))
    out: list[list[list[float]]] = [[] for _ in range(n_copies)]
    for k in range(0, len(samples), batch):
        part = samples[k:k + batch]
        ids, mask = left_padded(part, pad)
        logp = torch.log_softmax(forward(ids.repeat(n_copies, 1), mask.repeat(n_copies, 1))[:, -1].float(), -1)
        for c in range(n_copies):
            out[c] += [[float(logp[c * len(part) + b, cand[0]]) for cand in s["cands"]] for b, s in enumerate(part)]
    return out



def hooked_grads(model: Any, hook_of: Callable[[int], str], layers: list[int], by: Callable[[torch.Tensor], Any]
                 ) -> Callable[[torch.Tensor, Callable], dict]:
    """:func:`attribution`'s forward-backward in TransformerLens's own idiom (its bridge, or a ``HookedTransformer``
    such as mamba-lens's): a forward hook keeps each layer's ``hook_of(layer)`` value, a backward hook its gradient,
    the graph from ``hook_embed``; per layer ``(by(value), by(gradient))``."""
    def fb(ids: torch.Tensor, objective: Callable) -> dict:
        keep: dict = {}
        fwd = [(hook_of(l), lambda z, hook, l=l: keep.__setitem__(("z", l), z.detach())) for l in layers]
        bwd = [(hook_of(l), lambda g, hook, l=l: keep.__setitem__(("g", l), g.detach())) for l in layers]
        leaf = [("hook_embed", lambda x, hook: x.detach().requires_grad_(True))]  # the graph starts here
        with torch.enable_grad(), model.hooks(fwd_hooks=leaf + fwd, bwd_hooks=bwd):
            objective(model(ids)).backward()
        return {l: (by(keep[("z", l)]), by(keep[("g", l)])) for l in layers}
    return fb

def attribution(samples: list[dict], batch: int, pad: int, heads: list, forward_backward: Callable[..., dict]
                ) -> tuple[float, dict[str, float]]:
    """Gradient attribution of every head's zero ablation from one forward and one backward per batch of full rows:
    the estimated drop ``Σ z · ∂metric/∂z`` over the head's ``head_dim`` columns at every position (the change of
    the metric when ``z`` goes to zero, negated), the metric's best other candidate frozen at the one this forward
    picks. ``forward_backward(ids, objective) -> {layer: (z, grad)}`` runs the tool: ``objective(logits)`` is the
    scalar to differentiate; ``z``/``grad`` are ``[rows, pos, heads, head_dim]``. Batches hold whole prompts."""
    rows = full_rows(samples)
    by_sample: dict[int, list[int]] = {}
    for k, r in enumerate(rows):
        by_sample.setdefault(r[0], []).append(k)
    groups, cur = [], []
    for i in range(len(samples)):
        if cur and len(cur) + len(by_sample[i]) > batch:
            groups.append(cur)
            cur = []
        cur += by_sample[i]
    groups.append(cur)
    est = {f"L{l}H{h}": 0.0 for l, h in heads}
    clean_scores = [[0.0] * len(s["cands"]) for s in samples]
    for g in groups:
        part = [rows[k] for k in g]
        ids = right_padded([r[2] for r in part], pad)
        real = torch.zeros(ids.shape, dtype=torch.bool)
        for b, r in enumerate(part):
            real[b, :len(r[2])] = True

        def objective(logits: torch.Tensor) -> torch.Tensor:
            logp = torch.log_softmax(logits.float(), -1)
            sc: dict[tuple[int, int], torch.Tensor] = {}
            for b, (i, j, seq, p) in enumerate(part):
                sc[(i, j)] = logp[b, torch.arange(p - 1, len(seq) - 1), torch.tensor(seq[p:])].sum()
                clean_scores[i][j] = float(sc[(i, j)])
            total = torch.zeros(())
            for i in sorted({r[0] for r in part}):
                gold = samples[i]["gold"]
                other = max((j for j in range(len(samples[i]["cands"])) if j != gold), key=lambda j: float(sc[(i, j)]))
                total = total + sc[(i, gold)] - sc[(i, other)]
            return total / len(samples)

        got = forward_backward(ids, objective)
        for l, h in heads:
            z, grad = got[l]
            est[f"L{l}H{h}"] += float((z[..., h, :] * grad[..., h, :])[real].sum())
    golds = [s["gold"] for s in samples]
    return metric(clean_scores, golds), est


def attribution_prompts(samples: list[dict], batch: int, pad: int, heads: list, forward_backward: Callable[..., dict]
                        ) -> tuple[float, dict[str, float]]:
    """:func:`attribution` with each prompt run once (every candidate one token, read at the prompt's last position;
    the prompts left-padded): ``forward_backward(ids, mask, objective) -> {layer: (z, grad)}``, ``[rows, pos, heads,
    head_dim]``; the estimate sums over the real positions."""
    if any(len(c) != 1 for s in samples for c in s["cands"]):
        raise ValueError("attribution_prompts reads one-token candidates at the prompt's last position")
    est = {f"L{l}H{h}": 0.0 for l, h in heads}
    scores: list[list[float]] = []
    for k in range(0, len(samples), batch):
        part = samples[k:k + batch]
        ids, mask = left_padded(part, pad)

        def objective(logits: torch.Tensor, part: list = part) -> torch.Tensor:
            logp = torch.log_softmax(logits[:, -1].float(), -1)
            total = torch.zeros(())
            for b, s in enumerate(part):
                vals = [logp[b, c[0]] for c in s["cands"]]
                scores.append([float(v) for v in vals])
                other = max((j for j in range(len(vals)) if j != s["gold"]), key=lambda j: float(vals[j]))
                total = total + vals[s["gold"]] - vals[other]
            return total / len(samples)

        got = forward_backward(ids, mask, objective)
        for l, h in heads:
            z, grad = got[l]
            est[f"L{l}H{h}"] += float((z[..., h, :] * grad[..., h, :])[mask.bool()].sum())
    return metric(scores, [s["gold"] for s in samples]), est


def attribution_best(samples: list[dict], pad: int, per: int, heads: list, run: Callable[..., Any],
                     zs: list, by_head: Callable[[torch.Tensor], torch.Tensor] = lambda z: z
                     ) -> tuple[float, dict[str, float]]:
    """The same estimate as :func:`attribution`, as a skilled user writes it: per ``per`` prompts, the prompt run once
    and its key/value cache continued by the candidates' tokens (:class:`Layout`), logits only at the positions the
    metric reads, the graph starting at the first scanned layer and the gradient taken at the heads' ``z`` alone
    (``torch.autograd.grad``). ``run(ids, mask, past, keep, position_ids)`` returns ``(logits, cache)`` with gradients
    on; the tool's hooks append each scanned layer's ``(layer, z)`` to ``zs`` as the forwards run (``by_head(z)``:
    ``[rows, pos, heads, head_dim]``; the gradient is taken at ``z`` itself, the tensor the forward computed)."""
    est = {f"L{l}H{h}": 0.0 for l, h in heads}
    scores: list[list[float]] = []
    for k in range(0, len(samples), per):
        lay = Layout(samples[k:k + per], pad)
        zs.clear()
        with torch.enable_grad():
            mask = lay.prompt_mask
            logits, cache = run(lay.prompt_ids, mask, None, 1, (mask.cumsum(-1) - 1).clamp(min=0))
            first = torch.log_softmax(logits[:, -1].float(), -1)
            part = [[first[i, c[0]] for c in s["cands"]] for i, s in enumerate(lay.samples)]
            if lay.cont:
                cache.batch_select_indices(lay.cont_src)
                real = lay.prompt_mask.sum(-1)[lay.cont_src]
                pos = real[:, None] + torch.arange(lay.cont_ids.shape[1])[None]
                cl, _ = run(lay.cont_ids, lay.cont_mask, cache, lay.cont_ids.shape[1], pos)
                cont = torch.log_softmax(cl.float(), -1)
                for r, (i, j, c) in enumerate(lay.cont):
                    part[i][j] = part[i][j] + sum(cont[r, t, c[t + 1]] for t in range(len(c) - 1))
            total = torch.zeros(())
            for i, s in enumerate(lay.samples):
                vals = [float(v) for v in part[i]]
                other = max((j for j in range(len(vals)) if j != s["gold"]), key=lambda j: vals[j])
                total = total + part[i][s["gold"]] - part[i][other]
            grads = torch.autograd.grad(total / len(samples), [z for _, z in zs], allow_unused=True)
        scores += [[float(v) for v in p] for p in part]
        for (layer, z), g in zip(zs, grads):
            if g is None:
                continue
            prod = by_head(z.detach() * g).sum(dim=(0, 1, 3))  # per head
            for l, h in heads:
                if l == layer:
                    est[f"L{l}H{h}"] += float(prod[h])
    return metric(scores, [s["gold"] for s in samples]), est


def chunks(heads: list, size: int) -> list[list]:
    return [heads[i:i + size] for i in range(0, len(heads), size)]


# ---- the tools ---------------------------------------------------------------------------------------------------
def run_tl(job: dict, hf: Any, tok: Any, form: str) -> tuple[float, dict[str, float], str]:
    """TransformerLens 4: the bridge's ``run_with_hooks`` with a hook on ``blocks.{l}.attn.hook_z`` (plain), the
    ``patching`` module's generic patcher (``tl-patching``), or hooks under ``bridge.hooks(...)`` stacking heads over
    copies of the batch with the prompt cache passed through (best; Mamba-2: its heads' columns of the mixer's
    ``out_proj.hook_in``, copies over full rows)."""
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(job["model_dir"], device=job["device"], hf_model=hf, tokenizer=tok)
    samples, pad = job["samples"], tok.pad_token_id or 0
    golds = [s["gold"] for s in samples]
    TIMER.start()

    def zero(head: int, rows: slice = slice(None)) -> Callable:
        def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
            z[rows, :, head] = 0.0
            return z
        return hook

    def zero_cols(a: int, b: int) -> Callable:
        def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
            columns(x)[..., a:b] = 0.0
            return x
        return hook

    ssm, hd = job.get("kind") in SSM_KINDS, job["head_dim"]

    def z_hook(layer: int) -> str:  # a head's output channels: attention's z, else its output projection's input
        if not ssm:
            return f"blocks.{layer}.attn.hook_z"
        mixer, _ = out_path(decoder(hf).layers[layer])
        return f"blocks.{layer}.attn.o.hook_in" if mixer == "self_attn" else f"blocks.{layer}.mixer.out_proj.hook_in"

    def by_head(z: torch.Tensor) -> torch.Tensor:  # [rows, pos, heads, head_dim]
        return z.reshape(*z.shape[:2], -1, hd) if ssm else z

    drops: dict[str, float] = {}
    if form.startswith("attr"):  # gradients at the activations only
        hf.requires_grad_(False)
    if form == "plain":
        clean = metric(plain_scores(samples, job["batch"], pad, lambda ids: bridge(ids)), golds)
        for l, h in job["heads"]:
            if ssm:  # a Mamba-2 head: its head_dim columns of the mixer's out_proj input
                hooks = [(z_hook(l), zero_cols(h * hd, (h + 1) * hd))]
            else:
                hooks = [(f"blocks.{l}.attn.hook_z", zero(h))]
            s = plain_scores(samples, job["batch"], pad, lambda ids: bridge.run_with_hooks(ids, fwd_hooks=hooks))
            drops[f"L{l}H{h}"] = clean - metric(s, golds)
    elif form == "attr":
        layers = sorted({l for l, _ in job["heads"]})

        clean, drops = attribution(samples, job["batch"], pad, job["heads"], hooked_grads(bridge, z_hook, layers, by_head))
    elif form == "attr-best" and ssm:
        layers = sorted({l for l, _ in job["heads"]})

        # the bridge hands a hybrid's attention o.hook_in over as a view its forward does not differentiate through:
        # there the gradient is a backward hook's, elsewhere torch.autograd.grad at the hooked value
        view = job.get("kind") == "hybrid"

        def fb(ids: torch.Tensor, mask: torch.Tensor, objective: Callable) -> dict:
            # each prompt once, the graph from the first scanned layer's input, the gradient at z alone
            keep: dict = {}
            leaf = [(f"blocks.{layers[0]}.hook_resid_pre", lambda x, hook: x.detach().requires_grad_(True))]
            fwd = [(z_hook(l), lambda z, hook, l=l: keep.__setitem__(("z", l), z)) for l in layers]
            bwd = [(z_hook(l), lambda g, hook, l=l: keep.__setitem__(("g", l), g.detach())) for l in layers]
            with torch.enable_grad(), bridge.hooks(fwd_hooks=leaf + fwd, bwd_hooks=bwd if view else []):
                loss = objective(bridge(ids, attention_mask=mask))
                if view:
                    loss.backward()
                else:
                    grads = torch.autograd.grad(loss, [keep[("z", l)] for l in layers])
                    keep.update({("g", l): g for l, g in zip(layers, grads)})
            return {l: (by_head(keep[("z", l)].detach()), by_head(keep[("g", l)])) for l in layers}

        clean, drops = attribution_prompts(samples, job["batch"], pad, job["heads"], fb)
    elif form == "attr-best":
        layers = sorted({l for l, _ in job["heads"]})
        zs: list = []

        def keep_z(layer: int) -> Callable:
            def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
                zs.append((layer, z))
                return z
            return hook

        # the graph starts at the first scanned layer's input: nothing before it is differentiated
        leaf = [(f"blocks.{layers[0]}.hook_resid_pre", lambda x, hook: x.detach().requires_grad_(True))]
        hooks = leaf + [(f"blocks.{l}.attn.hook_z", keep_z(l)) for l in layers]

        def run(ids, mask, past, keep, pos):
            with bridge.hooks(fwd_hooks=hooks):
                return bridge(ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=keep,
                              position_ids=pos, return_type="logits_and_cache")

        clean, drops = attribution_best(samples, pad, job["prompts"], job["heads"], run, zs)
    elif form == "patching":
        from transformer_lens import patching
        import pandas as pd

        # generic_activation_patch over hook_z with an index_df of (layer, head): its patch setter zeroes the head
        # (the "clean cache" it would patch from is unused), the metric reads the candidates from the logits. One
        # call per group of whole prompts (full rows; a group's metric is its share of the mean), results summed.
        def setter(corrupted: torch.Tensor, index: list, clean_act: Any) -> torch.Tensor:
            corrupted[:, :, index[1]] = 0.0
            return corrupted

        index_df = pd.DataFrame({"layer": [l for l, _ in job["heads"]], "head": [h for _, h in job["heads"]]})
        cache = {f"blocks.{l}.attn.hook_z": None for l, _ in job["heads"]}
        total = torch.zeros(len(job["heads"]))
        clean = 0.0
        for group in sample_groups(samples, job["batch"]):
            rows = [r for r in full_rows(samples) if r[0] in group]
            ids = right_padded([r[2] for r in rows], pad)

            def share(logits: torch.Tensor) -> torch.Tensor:
                logp = torch.log_softmax(logits.float(), -1)
                scores = {i: [0.0] * len(samples[i]["cands"]) for i in group}
                for b, (i, j, seq, p) in enumerate(rows):
                    scores[i][j] = float(logp[b, torch.arange(p - 1, len(seq) - 1), torch.tensor(seq[p:])].sum())
                return torch.tensor(metric([scores[i] for i in group], [golds[i] for i in group]) * len(group)
                                    / len(samples))

            clean += float(share(bridge(ids)))
            total += patching.generic_activation_patch(bridge, ids, cache, share, setter, "z", index_df=index_df)
        for (l, h), v in zip(job["heads"], total.tolist()):
            drops[f"L{l}H{h}"] = clean - v
    else:
        hooks_now: list = []

        def run(ids, mask, past, keep, pos):
            with bridge.hooks(fwd_hooks=hooks_now):
                return bridge(ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=keep,
                              position_ids=pos, return_type="logits_and_cache")

        per = job["prompts"]
        if ssm:  # each prompt once (one-token candidates), or full rows
            def forward(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
                with bridge.hooks(fwd_hooks=hooks_now):
                    return bridge(ids) if mask is None else bridge(ids, attention_mask=mask)

            clean = metric(ssm_scores(samples, job["batch"], pad, 1, forward)[0], golds)
            for group in chunks(job["heads"], job["stack"]):
                hooks_now[:] = [(z_hook(l), _copy_zero_cols(c, h * hd, (h + 1) * hd, len(group)))
                                for c, (l, h) in enumerate(group)]
                for (l, h), s in zip(group, ssm_scores(samples, job["batch"], pad, len(group), forward)):
                    drops[f"L{l}H{h}"] = clean - metric(s, golds)
            return clean, drops, _tl_version()
        clean = metric(best_all(samples, pad, per, 1, run)[0], golds)
        for group in chunks(job["heads"], job["stack"]):
            hooks_now[:] = [(f"blocks.{l}.attn.hook_z", _copy_zero(c, h, len(group))) for c, (l, h) in enumerate(group)]
            for (l, h), s in zip(group, best_all(samples, pad, per, len(group), run)):
                drops[f"L{l}H{h}"] = clean - metric(s, golds)
    return clean, drops, _tl_version()


def _tl_version() -> str:
    import transformer_lens

    return f"transformer-lens {getattr(transformer_lens, '__version__', None) or _version('transformer-lens')}"


def _copy_zero_cols(c: int, a: int, b: int, n_copies: int) -> Callable:
    """A TransformerLens hook zeroing columns ``a:b`` in copy ``c`` of a copy-major batch."""
    def hook(x: torch.Tensor, hook: Any) -> torch.Tensor:
        size = x.shape[0] // n_copies
        columns(x)[c * size:(c + 1) * size, ..., a:b] = 0.0
        return x
    return hook


def columns(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, pos, channels]``, a view: the bridge hands attention's ``o.hook_in`` over as
    ``[rows, pos, heads, head_dim]``, and a head's columns count over the flattened heads."""
    return x.view(*x.shape[:2], -1) if x.dim() == 4 else x


def _copy_zero(c: int, head: int, n_copies: int) -> Callable:
    """A TransformerLens hook zeroing ``head`` in copy ``c`` of a copy-major batch (the copy size from the batch)."""
    def hook(z: torch.Tensor, hook: Any) -> torch.Tensor:
        size = z.shape[0] // n_copies
        z[c * size:(c + 1) * size, :, head] = 0.0
        return z
    return hook


def _version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


def run_nnsight(job: dict, hf: Any, tok: Any, form: str) -> tuple[float, dict[str, float], str]:
    """nnsight: inside ``model.trace(...)`` the head's columns of ``self_attn.o_proj.input`` set to zero; plain: one
    trace per head and row batch; best: one trace per forward stacking heads over copies of the batch (each copy's
    slice assigned), the prompt cache passed through and logits only at the reads."""
    from nnsight import LanguageModel

    lm = LanguageModel(hf, tokenizer=tok)
    TIMER.start()
    samples, pad = job["samples"], tok.pad_token_id or 0
    golds = [s["gold"] for s in samples]
    ssm, d = job.get("kind") in SSM_KINDS, job["head_dim"]
    drops: dict[str, float] = {}

    def layers_of() -> Any:  # the decoder layers
        return decoder(lm).layers

    def z_of(layer: int) -> Any:  # a head's output channels: its layer's output projection's input
        mixer, proj = out_path(decoder(hf).layers[layer])
        return getattr(getattr(layers_of()[layer], mixer), proj).input

    def plain_forward(ids: torch.Tensor, head: tuple[int, int] | None) -> torch.Tensor:
        with lm.trace(ids):
            if head is not None:
                l, h = head
                z_of(l)[:, :, h * d:(h + 1) * d] = 0
            logits = lm.output.logits.save()
        return logits

    if form.startswith("attr"):  # gradients at the activations only
        hf.requires_grad_(False)
    if form == "plain":
        clean = metric(plain_scores(samples, job["batch"], pad, lambda ids: plain_forward(ids, None)), golds)
        for l, h in job["heads"]:
            s = plain_scores(samples, job["batch"], pad, lambda ids: plain_forward(ids, (l, h)))
            drops[f"L{l}H{h}"] = clean - metric(s, golds)
    elif form == "attr":
        layers = sorted({l for l, _ in job["heads"]})

        def fb(ids: torch.Tensor, objective: Callable) -> dict:
            # the documented gradient idiom: capture o_proj's input, then read its .grad inside loss.backward()
            with torch.enable_grad():
                with lm.trace(ids):
                    embed = lm.backbone.embeddings if hasattr(hf, "backbone") else lm.model.embed_tokens
                    embed.output.requires_grad_(True)  # the graph starts at the embeddings
                    saved = [].save()  # collected values: the container saved, raw values appended
                    grads = [].save()
                    for l in layers:
                        saved.append(z_of(l))
                    loss = objective(lm.output.logits)
                    with loss.backward():
                        for a in reversed(saved):  # gradients arrive in reverse-forward order
                            grads.append(a.grad)
            shape = lambda t: t.detach().reshape(*t.shape[:2], -1, d)
            return {l: (shape(z), shape(g)) for l, z, g in zip(layers, saved, grads[::-1])}

        clean, drops = attribution(samples, job["batch"], pad, job["heads"], fb)
    elif form == "attr-best" and ssm:
        layers = sorted({l for l, _ in job["heads"]})

        def fb(ids: torch.Tensor, mask: torch.Tensor, objective: Callable) -> dict:
            # each prompt once, the graph from the first scanned layer's input, autograd.grad at z alone
            with torch.enable_grad():
                with lm.trace(ids, attention_mask=mask):
                    layers_of()[layers[0]].input.requires_grad_(True)
                    saved = [].save()
                    for l in layers:
                        saved.append(z_of(l))
                    logits = lm.output.logits.save()
                grads = torch.autograd.grad(objective(logits), list(saved))
            shape = lambda t: t.detach().reshape(*t.shape[:2], -1, d)
            return {l: (shape(z), shape(g)) for l, z, g in zip(layers, saved, grads)}

        clean, drops = attribution_prompts(samples, job["batch"], pad, job["heads"], fb)
    elif form == "attr-best":
        layers = sorted({l for l, _ in job["heads"]})
        zs: list = []

        def run(ids, mask, past, keep, pos):
            # the graph starts at the first scanned layer's input; o_proj's inputs saved, differentiated afterwards
            with lm.trace(ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=keep,
                          position_ids=pos):
                lm.model.layers[layers[0]].input.requires_grad_(True)
                saved = [].save()
                for l in layers:
                    saved.append(lm.model.layers[l].self_attn.o_proj.input)
                out = lm.output.save()
            zs.extend(zip(layers, saved))
            return out.logits, out.past_key_values

        clean, drops = attribution_best(samples, pad, job["prompts"], job["heads"], run, zs,
                                        lambda z: z.reshape(*z.shape[:2], -1, d))
    elif ssm:  # best: each prompt once (one-token candidates), or full rows
        stacked: list = []

        def forward(ids: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
            size = ids.shape[0] // max(1, len(stacked))
            with lm.trace(ids, **({} if mask is None else {"attention_mask": mask})):
                for c, (l, h) in enumerate(stacked):
                    z_of(l)[c * size:(c + 1) * size, :, h * d:(h + 1) * d] = 0
                logits = lm.output.logits.save()
            return logits

        clean = metric(ssm_scores(samples, job["batch"], pad, 1, forward)[0], golds)
        for group in chunks(job["heads"], job["stack"]):
            stacked[:] = group
            for (l, h), s in zip(group, ssm_scores(samples, job["batch"], pad, len(group), forward)):
                drops[f"L{l}H{h}"] = clean - metric(s, golds)
            stacked[:] = []
    else:
        group_now: list = []

        def run(ids, mask, past, keep, pos):
            size = ids.shape[0] // max(1, len(group_now))
            with lm.trace(ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=keep,
                          position_ids=pos):
                for c, (l, h) in enumerate(group_now):
                    lm.model.layers[l].self_attn.o_proj.input[c * size:(c + 1) * size, :, h * d:(h + 1) * d] = 0
                out = lm.output.save()
            return out.logits, out.past_key_values

        clean = metric(best_all(samples, pad, job["prompts"], 1, run)[0], golds)
        for group in chunks(job["heads"], job["stack"]):
            group_now[:] = group
            for (l, h), s in zip(group, best_all(samples, pad, job["prompts"], len(group), run)):
                drops[f"L{l}H{h}"] = clean - metric(s, golds)
            group_now[:] = []
    return clean, drops, f"nnsight {_version('nnsight')}"


def run_hf(job: dict, hf: Any, tok: Any, form: str) -> tuple[float, dict[str, float], str]:
    """A loop over the Hugging Face decoder layers from a cached clean prefix (plain PyTorch and transformers, no
    hooking library), prefix reuse as a skilled user writes it: per ``prompts`` prompts, one clean pass (the prompts,
    then the candidates on their cache) keeps every layer's input and the key/value cache; the heads of one layer,
    stacked over copies of the batch, run the prompts and then the candidates through the layers from theirs only, on
    the kept inputs there (a forward pre-hook on ``o_proj`` zeroes each copy's head; logits only where the metric
    reads), the clean cache serving the layers before."""
    import transformers
    from transformers.cache_utils import DynamicCache, DynamicLayer
    from transformers.masking_utils import create_causal_mask

    samples, pad, d = job["samples"], tok.pad_token_id or 0, job["head_dim"]
    golds = [s["gold"] for s in samples]
    if job.get("kind") in SSM_KINDS:
        TIMER.start()
        clean, drops = _ssm_prefix(job, hf, pad)
        return clean, drops, f"transformers {transformers.__version__}"
    inner = hf.model
    TIMER.start()
    zeroed: list = []  # (copy, head) of the copies now running

    def pre_hook(module: Any, args: tuple) -> tuple:
        x = args[0].clone()
        size = x.shape[0] // max(1, len(zeroed))
        for c, h in zeroed:
            x[c * size:(c + 1) * size, :, h * d:(h + 1) * d] = 0.0
        return (x, *args[1:])

    def blocks_from(layer: int, x: torch.Tensor, mask: torch.Tensor, cache: Any, pos: torch.Tensor, keep: int
                    ) -> torch.Tensor:
        """The logits at the last ``keep`` positions of ``x`` (the stream entering ``layer``) run through the layers from
        ``layer`` on, each adding its keys and values to ``cache``."""
        causal = create_causal_mask(config=hf.config, inputs_embeds=x, attention_mask=mask, past_key_values=cache,
                                    position_ids=pos)
        rope = inner.rotary_emb(x, position_ids=pos)
        for block in inner.layers[layer:]:
            x = block(x, attention_mask=causal, position_embeddings=rope, position_ids=pos, past_key_values=cache,
                      use_cache=True)
        return hf.lm_head(inner.norm(x[:, -keep:]))

    def from_layer(layer: int, k: int) -> Callable[..., Any]:
        """``run`` for :func:`best_scores`: the prompt, then the candidates, each from ``layer`` on, on the clean
        pass's stream there (the layers before it are clean: the prompt's keys and values there from the clean cache,
        once per copy)."""
        def run(ids, mask, past, keep, pos):
            if past is not None:
                x = kept["cont"][layer].repeat(k, 1, 1)
                return blocks_from(layer, x, mask, past, pos, keep), past
            cache = DynamicCache()
            logits = blocks_from(layer, kept["hidden"][layer].repeat(k, 1, 1), mask, cache, pos, keep)
            clean = kept["cache"]
            for i in range(layer):
                cache.layers[i] = DynamicLayer()
                cache.layers[i].update(clean.layers[i].keys.repeat(k, 1, 1, 1), clean.layers[i].values.repeat(k, 1, 1, 1))
            return logits, cache
        return run

    def clean_run(ids, mask, past, keep, pos):
        first = past is None
        if first:
            out = hf(ids, attention_mask=mask, use_cache=True, logits_to_keep=keep, position_ids=pos,
                     output_hidden_states=True)
            kept["hidden"], kept["cache"] = out.hidden_states, copy.deepcopy(out.past_key_values)
            return out.logits, out.past_key_values
        out = hf(ids, attention_mask=mask, past_key_values=past, use_cache=True, logits_to_keep=keep, position_ids=pos,
                 output_hidden_states=True)
        kept["cont"] = out.hidden_states  # the candidates' stream entering each layer
        return out.logits, out.past_key_values

    kept: dict = {}
    by_layer: dict[int, list[int]] = {}
    for l, h in job["heads"]:
        by_layer.setdefault(l, []).append(h)
    clean_scores: list = []
    scores: dict[tuple[int, int], list] = {(l, h): [] for l, h in job["heads"]}
    per = job["prompts"]
    for k in range(0, len(samples), per):
        lay = Layout(samples[k:k + per], pad)
        clean_scores += best_scores(lay, 1, clean_run)[0]
        for layer, heads in sorted(by_layer.items()):
            handle = inner.layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook)
            try:
                for group in chunks(heads, job["stack"]):
                    zeroed[:] = list(enumerate(group))
                    got = best_scores(lay, len(group), from_layer(layer, len(group)))
                    for h, s in zip(group, got):
                        scores[(layer, h)] += s
            finally:
                handle.remove()
                zeroed[:] = []
    clean = metric(clean_scores, golds)
    drops = {f"L{l}H{h}": clean - metric(s, golds) for (l, h), s in scores.items()}
    return clean, drops, f"transformers {transformers.__version__}"


def _ssm_prefix(job: dict, hf: Any, pad: int) -> tuple[float, dict[str, float]]:
    """The layer loop from a cached prefix on a model with no key/value cache to continue (Mamba-1/2, a hybrid): each
    prompt once, left-padded, every candidate read at its last position where all candidates are one token (else full
    rows, right-padded: the model is causal); one clean forward of each batch keeps every layer's input and the
    arguments the decoder gave it (its masks, position embeddings: forward pre-hooks); each head runs the layers from
    its own on the kept input with those arguments, a forward pre-hook on its layer's output projection zeroing the
    head's columns, and the final norm and unembedding run at the read positions only."""
    samples, d = job["samples"], job["head_dim"]
    inner = decoder(hf)
    norm = next(getattr(inner, n) for n in ("norm_f", "final_layernorm", "norm") if hasattr(inner, n))
    clean = [[0.0] * len(s["cands"]) for s in samples]
    scores = {(l, h): [[0.0] * len(s["cands"]) for s in samples] for l, h in job["heads"]}
    zeroed: list = []

    def pre_hook(module: Any, args: tuple) -> tuple:
        x = args[0].clone()
        for h in zeroed:
            x[..., h * d:(h + 1) * d] = 0.0
        return (x, *args[1:])

    def logp_at(x: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(hf.lm_head(norm(x)).float(), -1)

    units = []  # (ids, mask, reader(x after the last layer, scores))
    if all(len(c) == 1 for s in samples for c in s["cands"]):
        for k in range(0, len(samples), job["batch"]):
            part = list(enumerate(samples))[k:k + job["batch"]]
            ids, mask = left_padded([s for _, s in part], pad)

            def reader(x: torch.Tensor, out: list, part: list = part) -> None:
                logp = logp_at(x[:, -1])
                for b, (i, s) in enumerate(part):
                    out[i] = [float(logp[b, c[0]]) for c in s["cands"]]
            units.append((ids, mask, reader))
    else:
        rows = full_rows(samples)
        for k in range(0, len(rows), job["batch"]):
            part = rows[k:k + job["batch"]]

            def reader(x: torch.Tensor, out: list, part: list = part) -> None:
                for b, (i, j, seq, p) in enumerate(part):
                    pos = torch.arange(p - 1, len(seq) - 1)
                    out[i][j] = float(logp_at(x[b, pos])[torch.arange(len(pos)), torch.tensor(seq[p:])].sum())
            units.append((right_padded([r[2] for r in part], pad), None, reader))

    def run_from(layer: int, kept: dict) -> torch.Tensor:
        """The stream after the last layer, the layers from ``layer`` on run on the input kept there."""
        x = kept[layer][0]
        for i, block in enumerate(inner.layers[layer:], start=layer):
            _, args, kwargs = kept[i]
            x = block(x, *args, **kwargs)
            x = x[0] if isinstance(x, tuple) else x
        return x

    def keep(l: int, kept: dict) -> Callable:
        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            kw = dict(kwargs)
            x = args[0] if args else kw.pop("hidden_states")
            kept[l] = (x, args[1:], kw)
        return hook

    for ids, mask, reader in units:
        kept: dict = {}
        taps = [layer.register_forward_pre_hook(keep(l, kept), with_kwargs=True) for l, layer in enumerate(inner.layers)]
        taps.append(norm.register_forward_pre_hook(lambda m, a: kept.__setitem__("final", a[0])))
        try:
            inner(ids, attention_mask=mask, use_cache=False)
        finally:
            for t in taps:
                t.remove()
        reader(kept["final"], clean)
        for l, h in job["heads"]:
            zeroed[:] = [h]
            handle = out_proj(inner.layers[l]).register_forward_pre_hook(pre_hook)
            try:
                x = run_from(l, kept)
            finally:
                handle.remove()
            reader(x, scores[(l, h)])
    golds = [s["gold"] for s in samples]
    base = metric(clean, golds)
    return base, {f"L{l}H{h}": base - metric(sc, golds) for (l, h), sc in scores.items()}


def run_pyvene(job: dict, hf: Any, tok: Any, form: str) -> tuple[float, dict[str, float], str]:
    """pyvene: an ``IntervenableModel`` with a ``ZeroIntervention`` on ``head_attention_value_output`` (unit
    ``h.pos``: the head and the positions chosen per example by ``unit_locations``); plain: one config per head and a
    call per row batch; best: one config per layer with the copies' heads given per example, the prompt cache passed
    through and logits only at the reads."""
    import pyvene as pv

    if job.get("kind") in SSM_KINDS:
        raise NotImplementedError(f"pyvene {_version('pyvene')} maps no component of {type(hf).__name__} (its model "
                                  "cards cover attention models only)")
    samples, pad = job["samples"], tok.pad_token_id or 0
    golds = [s["gold"] for s in samples]
    drops: dict[str, float] = {}
    TIMER.start()  # (building an IntervenableModel is part of pyvene's scan: one per head or layer)

    def intervenable(layer: int) -> Any:
        cfg = pv.IntervenableConfig(representations=[pv.RepresentationConfig(
            layer=layer, component="head_attention_value_output", unit="h.pos", max_number_of_units=1)],
            intervention_types=pv.ZeroIntervention)
        m = pv.IntervenableModel(cfg, hf)
        m.disable_model_gradients()
        return m

    def locations(heads: list[int], n_pos: int) -> dict:
        # one intervention, two levels (heads, positions), each a list over the batch of the units it takes
        return {"base": [[[[h] for h in heads], [list(range(n_pos)) for _ in heads]]]}

    if form == "plain":
        clean = metric(plain_scores(samples, job["batch"], pad, lambda ids: hf(ids).logits), golds)
        for l, h in job["heads"]:
            m = intervenable(l)

            def forward(ids: torch.Tensor) -> torch.Tensor:
                _, out = m(base={"input_ids": ids}, unit_locations=locations([h] * ids.shape[0], ids.shape[1]))
                return out.logits
            s = plain_scores(samples, job["batch"], pad, forward)
            drops[f"L{l}H{h}"] = clean - metric(s, golds)
    else:
        now: dict = {}

        def run(ids, mask, past, keep, pos):
            base = {"input_ids": ids, "attention_mask": mask, "past_key_values": past, "use_cache": True,
                    "logits_to_keep": keep, "position_ids": pos}
            if not now:
                out = hf(**base)
            else:
                per = ids.shape[0] // len(now["heads"])
                heads = [h for h in now["heads"] for _ in range(per)]
                _, out = now["model"](base=base, unit_locations=locations(heads, ids.shape[1]))
            return out.logits, out.past_key_values

        clean = metric(best_all(samples, pad, job["prompts"], 1, run)[0], golds)
        by_layer: dict[int, list[int]] = {}
        for l, h in job["heads"]:
            by_layer.setdefault(l, []).append(h)
        for l, hs in by_layer.items():
            now["model"] = intervenable(l)  # one layer a config: the copies' heads are per-example locations
            for group in chunks(hs, job["stack"]):
                now["heads"] = group
                for h, s in zip(group, best_all(samples, pad, job["prompts"], len(group), run)):
                    drops[f"L{l}H{h}"] = clean - metric(s, golds)
        now.clear()
    return clean, drops, f"pyvene {_version('pyvene')}"


def serve(argv: list[str], run: Callable[[dict], dict]) -> int:
    """A worker's life: for each pair ``JOB.json OUT.json`` of ``argv`` in turn, read the job, set its threads,
    ``run`` it, and write what it returned, with the timers, torch and Python versions, as JSON."""
    for job_path, out_path in zip(argv[::2], argv[1::2]):
        job = json.loads(open(job_path).read())
        torch.set_num_threads(job["threads"])
        out = {"tool": job["tool"], **run(job)}
        out.update(**TIMER.stop(), torch=torch.__version__, python=sys.version.split()[0])
        with open(out_path, "w") as fh:
            json.dump(out, fh)
    return 0


def run_job(job: dict) -> dict:
    """One scan by TransformerLens, nnsight or pyvene on the job's Hugging Face model."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32)
    hf = hf.to(job["device"]).eval()
    tok = AutoTokenizer.from_pretrained(job["model_dir"])
    tool, form = job["tool"].split("-", 1)
    fn = {"tl": run_tl, "nnsight": run_nnsight, "pyvene": run_pyvene, "hf": run_hf}[tool]
    with torch.no_grad():
        # a warm-up on two prompts and one head (the first calls of a tool's forward and backward), then the timed run
        fn({**job, "samples": job["samples"][:2], "heads": job["heads"][:1]}, hf, tok, form)
        clean, drops, version = fn(job, hf, tok, form)
    return {"version": version, "clean": clean, "drops": drops}


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(serve(sys.argv[1:], run_job))
