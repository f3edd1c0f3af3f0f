"""The whole graph at once: edge attribution patching (EAP) over every sender -> every later receiver input, then the
strongest edges verified by exact path patching (:mod:`gna_interp.circuits.edges.paths`).

**Nodes.** Senders: the embeddings (``embed``), every head of every kind, every MLP (``MLP{l}``). Receivers: every
head's inputs (:meth:`~gna_interp.models.mixer.MixerAdapter.receiver_inputs`: ``q``/``k``/``v``/``other``), every
MLP's input and the answer logits.

**Score** (Syed, Rager & Conmy 2023). Removing sender ``S`` takes its write ``W_S`` out of the residual stream
(``o_S = (z_S - z'_S) W_O[:, S]ᵀ`` for a head, ``z'`` its zero or mean replacement; the MLP's output minus its
replacement; the embeddings); the effect of the edge ``S -> R.input @ positions`` is estimated as ::

    score = Σ_{rows, positions} W_S · ∂metric/∂x  (x: the residual stream as R's input alone reads it)

from one forward and one backward per batch, the metric the mean logit difference. ``∂metric/∂x`` through one input
of one receiver head is two vector-Jacobian products over the block as the forward ran it: from the head's own output
channels (cotangent: the metric's gradient there) back to its input channels -- along the head's own path only, as
the exact patch keeps every other head of the layer clean (a grouped-query KV group, a Mamba-2 group's ``B``/``C``
and gated norm) -- then from those channels through the block's pre-norm and projection back to the stream. Positions
are the lines' tokens (``items``), the decision (the last prompt token and the answer tokens) and every other token
(``other``: the instructions, the query before the decision), which together cover every token; edges into the
logits are read at the decision. The estimate is first order: it is exact for a metric linear in the receiver's
input, and where a block normalises its mixer's output (Gemma-2/3, OLMo-2) it uses the linear write ``o_S``. A
sample of edges of every kind is then measured exactly by path patching (:mod:`gna_interp.circuits.edges.paths`: the
one receiver input alone reads its stream less the sender's write, as the gradient above is taken), and the screen's
error against them reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from gna_interp.circuits.edges.block_io import flat
from gna_interp.circuits.edges.paths import PathEffects, PathPatcher, write_of
from gna_interp.engine.attribution import inputs_only_grad
from gna_interp.errors import InputError
from gna_interp.interventions.ablation import AblationMethod, flat_channels
from gna_interp.models.graph import (CLASSES, EMBED, LOGITS, RECEIVES, Edge, ReceiverInput, mlp_name, node_kind,
                                     receiver_inputs, sender_names, write_order)
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import InputSite
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.engine.forward import ScoreTable
from gna_interp.engine.metrics import LOGIT_DIFF, results
from gna_interp.engine.unembed import read_logprobs

__all__ = ["EDGE_KINDS", "EDGE_SCREEN_COLUMNS", "EdgeScreen", "edge_kind", "screen_edges", "verify_sample"]

EDGE_SCREEN_COLUMNS = ["sender", "receiver", "input", "positions", "kind", "score", "abs_rank", "verifiable", "sample",
                       "effect", "low", "high"]
EDGE_KINDS = ("head -> head", "head -> logits", "MLP", "embeddings")  # the kinds the agreement is reported by
SAMPLE_SEED = 0  # the seed of the randomly drawn verified rows
VJP_BATCH = 16  # receivers whose products back to their stream run as one batched product


@dataclass
class EdgeScreen:
    """The screened edge table and its exact check.

    Attributes:
        table: one row per edge (columns :data:`EDGE_SCREEN_COLUMNS`): ``kind`` (:func:`edge_kind`), ``score`` the
            EAP estimate of the metric's drop, ``abs_rank`` its rank by ``|score|``, ``verifiable`` whether it can be
            measured exactly, ``sample`` why it was (``top``, ``kind``, ``random``; empty when not),
            ``effect``/``low``/``high`` the exact effect with its interval where measured.
        intact: the intact model's mean logit difference.
    """

    table: pd.DataFrame
    intact: float

    def verified(self) -> pd.DataFrame:
        """The rows measured exactly."""
        return self.table[self.table["effect"].notna()]

    def agreement(self) -> pd.DataFrame:
        """The screen against the exact effects, per edge kind (:data:`EDGE_KINDS`) and ``all``: ``n`` rows
        verified (``random`` of them drawn at random among the verifiable rows, the rest the strongest by
        ``|score|`` overall and per kind), ``median_error`` / ``max_error`` of ``|score - effect|`` over them,
        ``random_median_error`` over the random draws alone (an unbiased sample of the screen's error), and
        ``rank_abs`` the rank correlation of ``|score|`` and ``|effect|`` (strong negative edges count as strong)."""
        v = self.verified()
        rows = []
        for kind in (*EDGE_KINDS, "all"):
            part = v if kind == "all" else v[v["kind"] == kind]
            err = (part["score"] - part["effect"]).abs()
            rand = err[part["sample"] == "random"]
            rank = (float(part["score"].abs().rank().corr(part["effect"].abs().rank())) if len(part) > 2
                    else math.nan)
            rows.append({"kind": kind, "n": int(len(part)), "random": int(len(rand)),
                         "median_error": float(err.median()) if len(part) else math.nan,
                         "max_error": float(err.max()) if len(part) else math.nan,
                         "random_median_error": float(rand.median()) if len(rand) else math.nan,
                         "rank_abs": rank})
        return pd.DataFrame(rows).set_index("kind")


def edge_kind(sender: str, receiver_input: str) -> str:
    """The kind of a screened edge (:data:`EDGE_KINDS`): out of the embeddings, out of or into an MLP, a head into
    the logits, or a head into a head's input."""
    kind = node_kind(sender)
    if kind == "embed":
        return "embeddings"
    if kind == "mlp" or receiver_input == "mlp":
        return "MLP"
    return "head -> logits" if receiver_input == LOGITS else "head -> head"


def verify_sample(table: pd.DataFrame, verify: int, seed: int = SAMPLE_SEED) -> pd.Series:
    """Which verifiable rows to measure exactly, and why (``top`` / ``kind`` / ``random``; ``""`` for the rest):
    half of ``verify`` the strongest rows by ``|score|``; a quarter (at least one row of every kind the strongest
    left out) the strongest rows of each kind not yet taken, in turn, so every kind is checked; the rest drawn at
    random among the rows not taken, so the error is also read on rows the screen does not rank high."""
    why = pd.Series("", index=table.index, dtype=object)
    if verify <= 0:
        return why
    cand = table[table["verifiable"]].sort_values("abs_rank")
    n_top = min(verify - verify // 2, len(cand))
    why[cand.index[:n_top]] = "top"
    left = cand.drop(cand.index[:n_top])
    seen = set(cand.loc[cand.index[:n_top], "kind"])
    queues = sorted((list(left[left["kind"] == k].index) for k in EDGE_KINDS),  # kinds not yet checked first
                    key=lambda q: bool(q) and table.loc[q[0], "kind"] in seen)
    n_kind = min(max(verify // 4, sum(1 for q in queues if q and table.loc[q[0], "kind"] not in seen)),
                 verify - n_top)
    while n_kind > 0 and any(queues):
        for q in queues:
            if q and n_kind > 0:
                why[q.pop(0)] = "kind"
                n_kind -= 1
    rest = list(cand.index[(why[cand.index] == "").to_numpy()])
    n_random = min(verify - int((why != "").sum()), len(rest))
    if n_random > 0:
        picks = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:n_random]
        why[[rest[int(i)] for i in picks]] = "random"
    return why


def _edge(row: Any) -> Edge:
    """The edge of a screened row."""
    return Edge(row["sender"], row["receiver"], row["input"], row["positions"])


def screen_edges(model: Model, task: Task, method: AblationMethod = "zero", reference: Any = None,
                 verify: int = 20, batch_size: int = 16,
                 progress: Callable[[str], None] | None = None, ig_steps: int = 0) -> EdgeScreen:
    """Score every edge of the model's graph on ``task`` by edge attribution, then measure ``verify`` verifiable
    ones exactly (:func:`verify_sample`: the strongest by ``|score|``, the strongest of each edge kind, and a random
    draw) by exact path patching (``method``: the ablation that removes a sender, ``zero``
    or ``mean`` with ``reference``; default for ``mean``: the task).

    ``ig_steps > 0``: integrated gradients along the ablation path -- the gradient at each receiver input is the
    mean over ``ig_steps`` points ``α = (k + ½) / ig_steps`` of the model in which every sender's write is
    ``w̄_S + α (w_S - w̄_S)`` (α = 0: every sender ablated, the empty circuit; α = 1: the intact model)."""
    from gna_interp.models.model import check_model
    check_model(model)
    if method not in ("zero", "mean"):
        raise InputError(f"the edge screen removes senders by 'zero' or 'mean' ablation, got {method!r}")
    if method == "mean" and reference is None:
        reference = task
    if isinstance(ig_steps, bool) or not isinstance(ig_steps, int) or ig_steps < 0:
        raise InputError(f"ig_steps must be an integer >= 0, got {ig_steps!r}")
    pp = PathPatcher(model, task, method, reference, batch_size)
    graph = _Graph.of(model, pp, method, ig_steps)
    scores = torch.zeros(len(graph.senders), len(graph.recv) + 1, len(CLASSES), dtype=torch.float64)  # +1: logits
    for ci, chunk in enumerate(pp.chunks):
        _chunk_scores(model, pp.masks(chunk), chunk, graph, scores)
        if progress is not None:
            progress(f"edge screen: batch {ci + 1} of {len(pp.chunks)}")
    table = _table(graph, scores)
    streams = pp.stream_refusal() == ""  # whether edges out of the embeddings and out of or into MLPs can be measured
    table["verifiable"] = table["kind"].isin(("head -> head", "head -> logits")).to_numpy() | streams
    table["effect"] = table["low"] = table["high"] = math.nan
    table["sample"] = verify_sample(table, verify)
    _verify(pp, table, progress)
    table = table.sort_values("abs_rank").reset_index(drop=True)[EDGE_SCREEN_COLUMNS]
    return EdgeScreen(table, LOGIT_DIFF.value(results(graph.intact.result())))


def _table(graph: "_Graph", scores: Tensor) -> pd.DataFrame:
    """The screen's rows from its scores (``[senders, receiver inputs + logits, classes]``): every sender into every
    receiver input read after it writes, at each position class, then into the logits; with ``kind`` and
    ``abs_rank``."""
    recv = graph.recv
    reads = np.array([r.order for r in recv])
    nodes = np.array([r.node for r in recv], dtype=object)
    inputs = np.array([r.input for r in recv], dtype=object)
    n_cls = len(CLASSES)
    parts: dict[str, list] = {k: [] for k in ("sender", "receiver", "input", "positions", "score")}
    for si, (sender, order) in enumerate(zip(graph.senders, graph.orders)):
        idx = np.flatnonzero(order < reads)
        parts["sender"].append(np.full(len(idx) * n_cls + 1, sender, dtype=object))
        parts["receiver"].append(np.append(np.repeat(nodes[idx], n_cls), LOGITS))
        parts["input"].append(np.append(np.repeat(inputs[idx], n_cls), LOGITS))
        parts["positions"].append(np.append(np.tile(np.array(CLASSES, dtype=object), len(idx)), "all"))
        parts["score"].append(np.append(scores[si, idx].numpy().reshape(-1), float(scores[si, len(recv), 1])))
    table = pd.DataFrame({k: np.concatenate(v) for k, v in parts.items()})
    table["abs_rank"] = table["score"].abs().rank(ascending=False, method="first").astype(int)
    kinds = {(s, i): edge_kind(s, i) for s in graph.senders for i in (*RECEIVES["head"], "mlp", LOGITS)}
    table["kind"] = [kinds[si] for si in zip(table["sender"], table["input"])]
    return table


def _verify(pp: PathPatcher, table: pd.DataFrame, progress: Callable[[str], None] | None) -> None:
    """Measure the rows of ``table`` whose ``sample`` is set exactly by path patching (on ``pp``), each edge alone,
    writing ``effect``/``low``/``high``."""
    todo = table[table["sample"] != ""].sort_values("abs_rank")
    if not len(todo):
        return
    sets = [[_edge(r)] for _, r in todo.iterrows()]
    if progress is not None:
        progress(f"edge screen: verifying {len(sets)} edges by path patching")
    fx = PathEffects(LOGIT_DIFF.name, results(pp.clean()), sets, [results(s) for s in pp.run(sets)])
    for idx, eff, (lo, hi) in zip(todo.index, fx.effects(), fx.intervals()):
        table.loc[idx, ["effect", "low", "high"]] = [eff, lo, hi]


def _before(sender: str, s_layer: float, r: ReceiverInput) -> bool:
    """Whether ``sender`` writes before receiver ``r`` reads (an MLP reads its own block's mixers' writes)."""
    return s_layer < r.order


@dataclass
class _Graph:
    """What the screen reads on every batch: the heads and their replacements (``repl``), the receiver inputs, the
    metric's weights, the senders in write order, the ablation method and the points ``alphas`` of the ablation path
    (``[1.0]``: plain EAP), the input sites that are plain linear projections' outputs
    (:meth:`~gna_interp.models.model.Model.linear_input`) and the hooks the screen reads, all read off the model once
    (the passes read the model through this alone)."""

    heads: list[HeadRef]
    repl: dict
    recv: list[ReceiverInput]
    weights: Tensor | None  # None: each chunk's own, from its intact forward (:meth:`weights_of`)
    senders: list[str]
    method: str
    alphas: list[float]
    linear: dict[str, tuple[str, torch.nn.Linear]]  # input site hook -> its projection's input hook and projection
    plan: Any
    intact: ScoreTable
    outputs: dict[str, str]  # the embeddings and each MLP: the hook of what it writes into the stream
    final: str  # the hook of the stream the final norm reads
    w_out: dict[HeadRef, Tensor]  # each head's columns of its output projection
    watch: list[str]  # every hook a pass records
    grad_at: list[str]  # the hooks the metric's gradient is read at
    orders: list[float]  # each sender's write order

    @classmethod
    def of(cls, model: Model, pp: PathPatcher, method: str, ig_steps: int) -> "_Graph":
        """The screen's graph of ``model`` on ``pp``'s task: the senders (the embeddings, then each layer's heads and
        MLP) and receiver inputs, the heads' replacements, the metric's weights (read off each chunk's own intact
        forward where every chunk holds whole samples, else off ``pp``'s clean pass) and ``ig_steps`` points of the
        ablation path (none: plain EAP)."""
        heads = model.heads()
        repl = {r.site.head: r for r in pp.replaced(heads)}
        recv = receiver_inputs(model)
        plan = pp.plan
        owners = [{plan.targets[t].sample for t in c.read_target.tolist()} for c in pp.chunks]
        whole = sum(len(o) for o in owners) == len(set().union(*owners))
        weights = None if whole else LOGIT_DIFF.target_weights(plan, pp.clean())
        senders = sender_names(model)
        alphas = [(k + 0.5) / ig_steps for k in range(ig_steps)] if ig_steps else [1.0]
        linear = {x.hook: got for r in recv for x in r.sites if (got := model.linear_input(x.hook)) is not None}
        outputs = {EMBED: model.block_input_hook(0), **{mlp_name(l): model.mlp_hook(l, "out")
                                                        for l in range(model.n_layers) if model.mlp_hook(l, "out")}}
        w_out = {h: model.output_projection(h)[:, repl[h].site.columns] for h in heads}
        sites = {x.hook for r in recv for x in r.sites}
        watch = {model.FINAL_NORM_INPUT, *outputs.values(), *(i for i, _ in linear.values()), *sites,
                 *(r.stream for r in recv), *(repl[h].site.hook for h in heads)}
        grad_at = sorted(sites | {repl[h].site.hook for h in heads} | {model.FINAL_NORM_INPUT})
        return cls(heads, repl, recv, weights, senders, method, alphas, linear, plan, ScoreTable(plan), outputs,
                   model.FINAL_NORM_INPUT, w_out, sorted(watch), grad_at, [write_order(n) for n in senders])

    def weights_of(self, chunk: Any) -> Tensor:
        """The metric's weight of each of ``chunk``'s reads (its intact forward recorded in :attr:`intact` first)."""
        w = self.weights if self.weights is not None else LOGIT_DIFF.target_weights(self.plan, self.intact.result())
        return w[chunk.read_target]


class _Sums:
    """Adds the receivers' gradients into ``scores`` as they come, in blocks of :attr:`BLOCK` receivers: per position
    class, the senders' writes at that class's positions times the block's gradients there -- one matrix product per
    block and class, never a tensor over every receiver at once. Writes and gradients are gathered once into the
    classes' positions one class after another (``order``), so each class's rows are a slice."""

    BLOCK = 64

    def __init__(self, scores: Tensor, writes: dict[str, Tensor], senders: list[str], pos_masks: Tensor) -> None:
        parts = [m.nonzero().flatten() for m in pos_masks.bool().flatten(1)]  # per class: its flat positions
        self.order = torch.cat(parts)
        self.bounds = [0, *np.cumsum([len(p) for p in parts]).tolist()]
        d = writes[senders[0]].shape[-1]
        w = torch.empty(len(senders), len(self.order), d, dtype=torch.float32, device=self.order.device)
        for row, name in enumerate(senders):
            torch.index_select(writes[name].reshape(-1, d).float(), 0, self.order, out=w[row])
        self.w = [w[:, lo:hi].reshape(len(senders), -1) for lo, hi in zip(self.bounds, self.bounds[1:])]
        self.scores = scores
        self.pending: dict[int, list[tuple[int, Tensor]]] = {}

    def add(self, n: int, col: int, g: Tensor) -> None:
        """Receiver column ``col``'s gradient ``g`` (``[batch, pos, d]``), read by the first ``n`` senders."""
        items = self.pending.setdefault(n, [])
        items.append((col, g.reshape(-1, g.shape[-1])[self.order]))
        if len(items) >= self.BLOCK:
            self.flush(n)

    def flush(self, n: int | None = None) -> None:
        """Add the pending gradients (of senders' prefix ``n``, or all) into ``scores``."""
        for k in [n] if n is not None else list(self.pending):
            items = self.pending.pop(k, [])
            if not items:
                continue
            cols = [c for c, _ in items]
            for c, (lo, hi, w) in enumerate(zip(self.bounds, self.bounds[1:], self.w)):
                if hi > lo:
                    g = torch.stack([x[lo:hi] for _, x in items]).reshape(len(items), -1)  # [block, X_c * d]
                    self.scores[:k, cols, c] += (w[:k] @ g.T).double().cpu()


def _chunk_scores(model: Model, masks: dict[str, Tensor], chunk: Any, graph: _Graph, scores: Tensor) -> None:
    """Add one chunk's EAP terms to ``scores``: each sender's write (from the intact forward) times the metric's
    gradient at each receiver input, averaged over the points ``graph.alphas`` of the ablation path (``masks``: the
    chunk's positions by class)."""
    recv, senders, alphas = graph.recv, graph.senders, graph.alphas
    pos_masks = torch.stack([masks[p] for p in CLASSES])  # [P, b, p]
    real = chunk.batch.attention_mask.bool()
    writes: dict[str, Tensor] | None = None
    means: dict[str, Tensor] = {}
    if alphas != [1.0]:  # the writes and the means of the intact model first
        with torch.no_grad():
            acts = _forward(model, chunk, graph, [], grad=False)
        graph.intact.add(chunk, acts.pop("__logp"))
        on = real.to(acts[graph.outputs[EMBED]].device)
        writes = _writes(graph, acts, on)
        means = {k: (acts[h].detach()[on].mean(0) if graph.method == "mean" else torch.zeros(acts[h].shape[-1]))
                 for k, h in graph.outputs.items()}
    sums: _Sums | None = None
    for alpha in alphas:
        interp = [] if alpha == 1.0 else _interpolation(graph, means, alpha)
        with inputs_only_grad(model), torch.enable_grad():
            acts = _forward(model, chunk, graph, interp, grad=True)
            logp = acts.pop("__logp")
            if alpha == 1.0:
                graph.intact.add(chunk, logp)
            objective = (logp * graph.weights_of(chunk).to(logp.device)).sum()
            grads = dict(zip(graph.grad_at, torch.autograd.grad(objective, [acts[h] for h in graph.grad_at],
                                                                retain_graph=True, allow_unused=True)))
            if writes is None:
                writes = _writes(graph, acts, real.to(objective.device))
            if sums is None:
                sums = _Sums(scores, writes, senders, pos_masks)
            for ri, gx in _receiver_grads(graph, grads, acts):
                r = recv[ri]
                before = [_before(name, lay, r) for name, lay in zip(senders, graph.orders)]
                n = sum(before)
                assert all(before[:n]), "senders are listed in layer order: those before a receiver are a prefix"
                sums.add(n, ri, gx.detach().float() / len(alphas))
            gfinal = grads[graph.final]
            if gfinal is not None:
                sums.add(len(senders), len(recv), gfinal.detach().float() / len(alphas))
            sums.flush()


def _forward(model: Model, chunk: Any, graph: _Graph, before: list[tuple[str, Callable[..., Tensor]]], grad: bool
             ) -> dict[str, Tensor]:
    """One forward of ``chunk`` with the hooks ``before`` first, recording every activation the screen reads (the
    stream entering block 0 made a leaf that requires grad when ``grad``) and ``__logp``, the log-probability of each
    of the chunk's reads."""
    acts: dict[str, Tensor] = {}
    leaf = graph.outputs[EMBED]

    def keep(name: str) -> Callable[..., Tensor]:
        def hook(x: Tensor, hook: Any = None) -> Tensor:
            if grad and name == leaf:
                x = x.detach().requires_grad_(True)
            acts[name] = x
            return x
        return hook

    rows, pos, inverse = chunk.reads
    logits = model.read_logits(chunk.batch, rows, pos, [*before, *((h, keep(h)) for h in graph.watch)], grad=grad)
    acts["__logp"] = read_logprobs(logits, chunk.read_tok, inverse)
    return acts


def _interpolation(graph: _Graph, means: dict[str, Tensor], alpha: float) -> list[tuple[str, Callable[..., Tensor]]]:
    """Hooks that put every sender at ``α`` of the way from its ablated to its intact output: a head's channels
    ``z̄ + α (z - z̄)``, an MLP's output and the embeddings ``ȳ + α (y - ȳ)`` (``ȳ``: ``means``, the intact
    batch's mean over real tokens, or zero)."""
    by_hook: dict[str, list[Any]] = {}
    for h in graph.heads:
        by_hook.setdefault(graph.repl[h].site.hook, []).append(graph.repl[h])

    def heads_hook(rs: list[Any]) -> Callable[..., Tensor]:
        def hook(v: Tensor, hook: Any = None) -> Tensor:
            out = v.clone(memory_format=torch.contiguous_format)
            for r in rs:
                chans = flat_channels(out, r.site)
                z = chans[..., r.site.columns]
                bar = r.like(z)
                chans[..., r.site.columns] = bar + alpha * (z - bar)
            return out
        return hook

    def stream_hook(name: str) -> Callable[..., Tensor]:
        def hook(v: Tensor, hook: Any = None) -> Tensor:
            bar = means[name].to(v.device, v.dtype)
            return bar + alpha * (v - bar)
        return hook

    return [(hook, heads_hook(rs)) for hook, rs in by_hook.items()] + [(hook, stream_hook(name))
                                                                         for name, hook in graph.outputs.items()]


def _receiver_grads(graph: _Graph, grads: dict[str, Tensor | None], acts: dict[str, Tensor]
                    ) -> Iterator[tuple[int, Tensor]]:
    """``(index, ∂metric/∂x)`` through each receiver input of ``graph.recv`` alone (``x``: the stream it reads),
    stream by stream: the heads' own paths first (:func:`_through_heads`), then each input back to its stream
    (:func:`_stream_cotangents`, :func:`_to_stream`: one batched product for the inputs that start at the same
    hooks)."""
    recv = graph.recv
    by_stream: dict[str, list[int]] = {}
    for ri, r in enumerate(recv):
        by_stream.setdefault(r.stream, []).append(ri)
    for stream, idx in by_stream.items():
        heads = list(dict.fromkeys(recv[i].head for i in idx if recv[i].head is not None))
        through = _through_heads(graph, heads, grads, acts)
        same: dict[tuple[str, ...], list[tuple[int, dict[str, Tensor]]]] = {}  # by the hooks their products start at
        for i in idx:
            r = recv[i]
            cots = _stream_cotangents(r, through[r.head] if r.head is not None else grads, graph.linear)
            if cots:
                same.setdefault(tuple(sorted(cots)), []).append((i, cots))
        for hooks, items in same.items():
            for k in range(0, len(items), VJP_BATCH):
                part = items[k:k + VJP_BATCH]
                for (i, _), gx in zip(part, _to_stream(acts, hooks, [c for _, c in part], stream)):
                    if gx is not None:
                        yield i, gx


def _through_heads(graph: _Graph, heads: list[HeadRef], grads: dict[str, Tensor | None], acts: dict[str, Tensor]
                   ) -> dict[HeadRef, dict[str, Tensor | None]]:
    """The metric's gradient at each head's input sites along the paths through that head's own output alone (the
    vector-Jacobian product from its output channels, cotangent the metric's gradient there): what the exact patch,
    which keeps every other head of the layer clean, differentiates. Heads whose outputs depend on their own inputs
    alone (:attr:`~gna_interp.models.mixer.MixerAdapter.separate_heads`: attention) and whose input channels do not
    overlap (one query head of each KV group) share one product: each head's channels of the result are its own
    path's."""
    sites = {h: [x for r in graph.recv if r.head == h for x in r.sites] for h in heads}
    packs: list[list[HeadRef]] = []
    for h in heads:
        fits = [p for p in packs if h.adapter.separate_heads
                and all(q.adapter.separate_heads and not _overlap(sites[h], sites[q]) for q in p)]
        if fits:
            fits[0].append(h)
        else:
            packs.append([h])
    out: dict[HeadRef, dict[str, Tensor | None]] = {}
    for pack in packs:
        got = _through_pack(graph, pack, sites, grads, acts)
        out.update({h: got for h in pack})
    return out


def _overlap(a: list[InputSite], b: list[InputSite]) -> bool:
    """Whether two lists of input sites share a channel."""
    return any(x.hook == y.hook and x.start < y.stop and y.start < x.stop for x in a for y in b)


def _through_pack(graph: _Graph, pack: list[HeadRef], sites: dict[HeadRef, list[InputSite]],
                  grads: dict[str, Tensor | None], acts: dict[str, Tensor]) -> dict[str, Tensor | None]:
    """One vector-Jacobian product from the output channels of the heads of ``pack`` back to their input sites."""
    outs: dict[str, Tensor] = {}
    for h in pack:
        site = graph.repl[h].site
        g = grads.get(site.hook)
        if g is None or not sites[h]:
            continue
        cot = outs.setdefault(site.hook, torch.zeros_like(g))
        flat(cot)[..., site.columns] = flat(g)[..., site.columns]
    hooks = sorted({x.hook for h in pack for x in sites[h]})
    if not outs or not hooks:
        return {}
    got = torch.autograd.grad([acts[k] for k in outs], [acts[k] for k in hooks], list(outs.values()),
                              retain_graph=True, allow_unused=True)
    return dict(zip(hooks, got))


def _stream_cotangents(r: ReceiverInput, grads: dict[str, Tensor | None], linear: dict[str, tuple[str, torch.nn.Linear]]
                       ) -> dict[str, Tensor]:
    """The cotangents whose vector-Jacobian product back to the stream is ``∂metric/∂x`` through receiver ``r``'s
    input alone: its sites' channels (``grads`` there, other channels zero), by the hook they start at. A site that is
    a plain projection's output (``linear``) is taken back through its rows of the weight first, so autograd runs only
    from the projection's input (the block's norm), never through the whole projection."""
    cots: dict[str, Tensor] = {}
    for x in r.sites:
        g = grads.get(x.hook)
        if g is None:
            continue
        if x.start < 0:  # an MLP input: all of it
            hook, cot = x.hook, g
        elif x.hook in linear:
            hook, proj = linear[x.hook]
            cot = flat(g)[..., x.start:x.stop] @ proj.weight[x.start:x.stop].to(g.dtype)
        else:
            hook, cot = x.hook, torch.zeros_like(g)
            flat(cot)[..., x.start:x.stop] = flat(g)[..., x.start:x.stop]
        cots[hook] = cots[hook] + cot if hook in cots else cot
    return cots


def _to_stream(acts: dict[str, Tensor], hooks: tuple[str, ...], cots: list[dict[str, Tensor]], stream: str
               ) -> list[Tensor | None]:
    """The vector-Jacobian products of the cotangents ``cots`` (each at ``hooks``) back to ``stream``: one batched
    product (the cotangents stacked, :func:`torch.autograd.grad`'s ``is_grads_batched``), or one product each where
    the backward cannot be batched."""
    outs, at = [acts[k] for k in hooks], [acts[stream]]
    if len(cots) > 1:
        try:
            (got,) = torch.autograd.grad(outs, at, [torch.stack([c[k] for c in cots]) for k in hooks],
                                         retain_graph=True, allow_unused=True, is_grads_batched=True)
            return list(got.unbind(0)) if got is not None else [None] * len(cots)
        except RuntimeError:  # a backward formula vmap cannot batch
            pass
    return [torch.autograd.grad(outs, at, [c[k] for k in hooks], retain_graph=True, allow_unused=True)[0]
            for c in cots]



def _writes(graph: _Graph, acts: dict[str, Tensor], real: Tensor) -> dict[str, Tensor]:
    """Each sender's write into the stream (``[b, p, d_model]``, detached), in layer order; the embeddings' and
    the MLPs' mean replacement is their mean over the batch's ``real`` (non-padding) tokens."""

    def removed(y: Tensor) -> Tensor:
        return y - y[real].mean(0) if graph.method == "mean" else y

    out: dict[str, Tensor] = {}
    with torch.no_grad():
        for h in graph.heads:
            r = graph.repl[h]
            z = flat_channels(acts[r.site.hook].detach(), r.site)[..., r.site.columns]
            out[h.name] = write_of(graph.w_out[h], r, z)
        for name, hook in graph.outputs.items():
            out[name] = removed(acts[hook].detach())
    return out
