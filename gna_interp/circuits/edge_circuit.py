"""Edge circuits: a task's scores when only a chosen set of edges of the model's whole graph carries the model's
activations, every other edge carrying its sender's ablated value -- the faithfulness of a circuit of edges.

**The graph** (the nodes of :mod:`gna_interp.circuits.edge_screen`). Senders: the embeddings (``embed``), every
head, every MLP (``MLP{l}``). Receiver inputs: each head's ``q``/``k``/``v``/``other``
(:meth:`~gna_interp.models.mixer.MixerAdapter.receiver_inputs`), where channels that several heads share are one
input read by all of them (a grouped-query KV group's ``k``/``v``, a Mamba-2 group's ``B``/``C``; named by its heads,
``L5H0+L5H1+L5H2.k``), every MLP's input (``MLP{l}``) and the answer ``logits``. An edge (:class:`Wire`) joins a
sender to a later receiver input at one class of positions: ``items`` (the tokens of the lines or options),
``decision`` (the last prompt token and the answer tokens), ``other`` (every other token); the three partition the
tokens. Edges into the logits are read at the decision (positions ``all``).

**Definition** (the circuit evaluation of ACDC and of the MIB benchmark, with mean or zero ablation). A sender
``S`` writes ``w_S`` into the residual stream in the run being made (a head ``z_S W_O[:, S]ᵀ``, an MLP its output,
the embeddings the first block's input) and ``w̄_S`` when ablated (the head's mean or zero replacement through
``W_O``; an MLP's or the embeddings' mean over the reference prompts' real tokens, or zero). With circuit ``C``, the
receiver input ``r`` reads at position ``p`` of class ``c`` ::

    x_r[p] = Σ_S ( w_S[p] if (S -> r @ c) ∈ C else w̄_S[p] )  (+ the biases, which every reader keeps)

i.e. ``B + Σ_{(S -> r @ c) ∈ C} (w_S - w̄_S)`` with ``B`` the stream with every sender ablated. Every node computes
its output from its own inputs so read, so a change flows on through every later edge the circuit keeps. All edges
kept is the intact model; no edge kept, the model with every head, MLP and the embeddings ablated.

How it runs: block by block from the clean prefix (:mod:`gna_interp.engine.replay`). For block ``l``: one run of the
block on stacked copies of the distinct receiver streams, stopped once the input projections have fired, gives
each receiver input its channels (receiver inputs that read the same senders at the same positions read the same
stream and share a copy: leaving one edge out runs two copies at its receiver's layer and one elsewhere); one run of
the block on the current stream overwrites them, records the heads' outputs and gives the MLP its own input at the
stream before it (``hook_resid_mid``, which feeds the MLP's norm and not the residual sum). This needs blocks that
add their mixer's output and their MLP's as is (Llama, GPT-2, Mamba-2, Bamba, ...); a block that normalises or
scales them first (Gemma-2/3, OLMo-2, Granite) is refused with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Collection, Sequence

import pandas as pd
import torch
from jaxtyping import Float
from torch import Tensor

from gna_interp.circuits.paths import PathPatcher, linear_write, read_block
from gna_interp.engine.unembed import head_logprobs, output_head
from gna_interp.engine.replay import replay
from gna_interp.errors import InputError, UnsupportedArchitectureError
from gna_interp.interventions.ablation import AblationMethod, flat_channels, replacements
from gna_interp.models.graph import (CLASSES, EMBED, LOGITS, Node, mlp_name, node_kind, read_order, receiver_nodes,
                                     write_order)
from gna_interp.models.heads import HeadRef
from gna_interp.models.mixer import InputSite
from gna_interp.models.model import Model
from gna_interp.tasks.base import Task
from gna_interp.engine.forward import ScoreTable
from gna_interp.engine.plan import CandidateScores

__all__ = ["EdgeCircuit", "Wire", "head_inputs", "whole_circuit"]

SCOPES: tuple[str, ...] = ("heads", "all")


@dataclass(frozen=True)
class Wire:
    """One edge of the whole graph: ``sender`` (``embed``, a head name, ``MLP{l}``) -> ``receiver`` (a receiver input
    of :class:`EdgeCircuit`: ``L5H2.q``, ``L5H0+L5H1.k``, ``MLP5``, ``logits``) at ``positions`` (one of
    :data:`CLASSES`; ``all`` for the logits)."""

    sender: str
    receiver: str
    positions: str

    @property
    def name(self) -> str:
        """``SENDER -> RECEIVER@POSITIONS``, e.g. ``L0H3 -> L1H3.k@items``; parses back with :meth:`parse`."""
        return f"{self.sender} -> {self.receiver}@{self.positions}"

    @classmethod
    def parse(cls, name: str) -> "Wire":
        """The wire of :attr:`name` (``L3H1 -> L5H0+L5H1.k@items``)."""
        sender, sep, rest = str(name).partition(" -> ")
        receiver, at, positions = rest.rpartition("@")
        if not (sep and at and sender and receiver and positions):
            raise InputError(f"not a wire name: {str(name)[:80]!r} (expected 'SENDER -> RECEIVER@POSITIONS')")
        return cls(sender, receiver, positions)


@dataclass(frozen=True)
class _Input:
    """One receiver input of a head layer: its name, layer, the heads that read it and where (sites)."""

    name: str
    layer: int
    heads: tuple[HeadRef, ...]
    input: str
    sites: tuple[InputSite, ...]


def head_inputs(model: Model, skip: bool = False) -> list[_Input]:
    """Every receiver input of every head of ``model``, in layer order; channels several heads read (a KV or B/C
    group) are one input, named by its heads. A head whose kind cannot receive, or a channel read by two different
    inputs, is refused (:class:`UnsupportedArchitectureError`); with ``skip`` such heads are left out and channels
    not checked."""
    groups: dict[tuple[int, str, tuple], list[HeadRef]] = {}
    for head in model.heads():
        spec = model.layer_spec(head.layer, head.kind)
        try:
            inputs = spec.adapter.receiver_inputs(model, spec, head)
        except UnsupportedArchitectureError as e:
            if skip:
                continue
            raise UnsupportedArchitectureError(f"an edge circuit needs every head to receive: {e}") from None
        for inp, sites in inputs.items():
            if sites:
                key = (head.layer, inp, tuple((x.hook, x.start, x.stop) for x in sites))
                groups.setdefault(key, []).append(head)
    out, owner = [], {}
    for (layer, inp, key), heads in groups.items():
        name = "+".join(h.name for h in heads) + f".{inp}"
        for hook, a, b in () if skip else key:
            for c in range(a, b):
                if owner.setdefault((hook, c), name) != name:
                    raise UnsupportedArchitectureError(
                        f"an edge circuit needs each input channel read by one receiver input, but channel {c} of "
                        f"{hook} feeds both {owner[(hook, c)]} and {name}")
        out.append(_Input(name, layer, tuple(heads), inp, tuple(InputSite(*x) for x in key)))
    return sorted(out, key=lambda i: (i.layer, i.name))


def _stream_key(keep: Tensor | None, filled: int) -> bytes:
    """What a receiver input's stream depends on at its layer: which of the first ``filled`` senders (those that
    have written) reach it at which position classes; receivers with equal keys read equal streams (no kept
    edge: ``base``; every edge kept: the run's own stream)."""
    return b"" if keep is None else b"k" + keep[:filled].to(torch.bool).numpy().tobytes()


class EdgeCircuit:
    """Scores of a task with only sets of :class:`Wire` kept (the rest ablated): :meth:`run`.

    ``method``: ``mean`` (the senders' mean over ``reference``'s prompts, default the task) or ``zero``.
    ``senders``: ``heads`` (default) -- a circuit is a set of edges out of heads, and the edges out of the
    embeddings and the MLPs always carry their activations, as in the node form of faithfulness, which keeps them --
    or ``all`` (every edge may be left out: with mean ablation every position class and the embeddings then matter
    at once, and small circuits keep little)."""

    def __init__(self, model: Model, task: Task, method: AblationMethod = "mean", reference: Any = None,
                 batch_size: int = 8, senders: str = "heads") -> None:
        from gna_interp.models.model import check_model

        check_model(model)
        if senders not in SCOPES:
            raise InputError(f"senders must be one of {SCOPES} (which edges a circuit may leave out), got {senders!r}")
        if method not in ("zero", "mean"):
            raise InputError(f"an edge circuit ablates the edges outside it by 'zero' or 'mean', got {method!r}")
        if method == "mean" and reference is None:
            reference = task
        self.model, self.method = model, method
        self.pp = PathPatcher(model, task, method, reference, batch_size)
        self.heads = model.heads()
        self._check_blocks()
        self.inputs = head_inputs(model)
        self._input_of = {(h.name, i.input): i.name for i in self.inputs for h in i.heads}
        self.senders = [EMBED] + [n for layer in range(model.n_layers)
                                  for n in [*(h.name for h in self.heads if h.layer == layer)]
                                  + ([mlp_name(layer)] if model.mlp_hook(layer, "out") else [])]
        self._index = {s: i for i, s in enumerate(self.senders)}
        self.scope = senders
        self._fixed = [] if senders == "all" else [i for i, n in enumerate(self.senders) if node_kind(n) != "head"]
        self.repl = {r.site.head: r for r in replacements(model, self.heads, method,
                                                           None if method == "zero" else reference)}
        self._means = self._stream_means(reference) if method == "mean" else {}

    # ---- the graph ------------------------------------------------------------------------
    def _check_blocks(self) -> None:
        model = self.model
        as_is = self.pp.adds_as_is()
        bad = sorted(layer for layer, ok in as_is.items() if not ok)
        if bad:
            raise UnsupportedArchitectureError(
                f"an edge circuit needs blocks that add their mixer's output to the residual stream as is, but block(s) "
                f"{', '.join(map(str, bad))} of {model.name} normalise or scale it first (a post-norm or a multiplier): "
                f"there a sender's write along one edge is not separable from the others'; use the node form "
                f"(gna.faithfulness) or path patching")
        for layer in range(model.n_layers):
            if model.mlp_hook(layer, "out") and model.mixed_stream_hook(layer) == model.block_output_hook(layer):
                raise UnsupportedArchitectureError(
                    f"an edge circuit gives each MLP its own input at the stream before it, but block {layer} of "
                    f"{model.name} has no hook there (its MLP reads the block's input): the MLP input cannot be "
                    f"separated from the mixer's")

    def receivers(self) -> list[str]:
        """Every receiver input's name, in layer order (MLP inputs after their block's heads, the logits last)."""
        if not hasattr(self, "_receivers"):
            names = [(i.layer, 0, i.name) for i in self.inputs]
            names += [(layer, 1, mlp_name(layer)) for layer in range(self.model.n_layers)
                      if self.model.mlp_hook(layer, "in")]
            self._receivers = [n for _, _, n in sorted(names)] + [LOGITS]
            self._reads_at = {r: self._receiver_layer(r) for r in self._receivers}
            self._writes_at = {s: write_order(s) for s in self.senders}
        return list(self._receivers)

    def _receiver_layer(self, receiver: str) -> float:
        return read_order(receiver, self.model.n_layers)

    def wires(self) -> list[Wire]:
        """Every edge of the graph: each sender -> each later receiver input, at each position class."""
        out = []
        for r in self.receivers():
            rl = self._reads_at[r]
            for s in self.senders:
                if self._writes_at[s] < rl and self._index[s] not in self._fixed:
                    out += [Wire(s, r, "all")] if r == LOGITS else [Wire(s, r, c) for c in CLASSES]
        return out

    def check(self, wire: Wire) -> Wire:
        """``wire`` if it is an edge of this model's graph, else :class:`InputError` saying why."""
        if not isinstance(wire, Wire):
            raise InputError(f"an edge circuit is a collection of Wire(sender, receiver, positions), got "
                             f"{type(wire).__name__}")
        if wire.sender not in self._index:
            raise InputError(f"unknown sender {wire.sender!r} in {wire.name}; senders are 'embed', head names and "
                             f"'MLP<layer>'")
        if self._index[wire.sender] in self._fixed:
            raise InputError(f"{wire.name}: with senders={self.scope!r} the edges out of the embeddings and the MLPs "
                             f"are always kept; EdgeCircuit(..., senders='all') lets a circuit leave them out")
        self.receivers()
        if wire.receiver not in self._reads_at:
            raise InputError(f"unknown receiver input {wire.receiver!r} in {wire.name}; e.g. "
                             f"{', '.join(self.receivers()[:3])} (EdgeCircuit.receivers() lists them)")
        want = ("all",) if wire.receiver == LOGITS else CLASSES
        if wire.positions not in want:
            raise InputError(f"{wire.name}: positions must be one of {want}")
        if self._writes_at[wire.sender] >= self._reads_at[wire.receiver]:
            raise InputError(f"{wire.name}: the sender must write before the receiver reads")
        return wire

    def from_screen(self, table: pd.DataFrame) -> pd.DataFrame:
        """The screened edges (:class:`~gna_interp.circuits.edge_screen.EdgeScreen` rows) as wires with their
        scores (``wire``, ``sender``, ``receiver``, ``positions``, ``score``), largest ``|score|`` first (an edge
        whose first-order estimate is negative can still be one the circuit needs once the rest is ablated: ordered
        by ``|score|``, the zoo Mamba-2's smallest edge circuit is 58 edges, by signed score the whole graph); the
        rows of the heads that share an input (a KV group) add up, as the gradient through a shared input is the sum
        over its readers."""
        rows = []
        for r in table.itertuples():
            if self._index[r.sender] in self._fixed:
                continue
            if r.receiver == LOGITS:
                rec, pos = LOGITS, "all"
            elif r.input == "mlp":
                rec, pos = r.receiver, r.positions
            else:
                rec, pos = self._input_of[(r.receiver, r.input)], r.positions
            rows.append((r.sender, rec, pos, float(r.score)))
        df = pd.DataFrame(rows, columns=["sender", "receiver", "positions", "score"])
        df = df.groupby(["sender", "receiver", "positions"], as_index=False, sort=False)["score"].sum()
        df["wire"] = [Wire(s, r, p) for s, r, p in zip(df.sender, df.receiver, df.positions)]
        order = df["score"].abs().sort_values(ascending=False, kind="stable").index
        return df.loc[order].reset_index(drop=True)

    # ---- running --------------------------------------------------------------------------
    def _stream_means(self, reference: Any) -> dict[str, Tensor]:
        """The embeddings' and every MLP's mean output over the reference prompts' real tokens."""
        model = self.model
        names = {EMBED: model.block_input_hook(0)}
        names.update({mlp_name(l): model.mlp_hook(l, "out") for l in range(model.n_layers) if model.mlp_hook(l, "out")})
        prompts = getattr(reference, "prompts", None)
        batch = model.as_batch(list(prompts) if prompts is not None else reference)
        wanted = set(names.values())
        _, cache = model.run_with_cache(batch, names_filter=lambda n: n in wanted)
        mask = batch.attention_mask.bool()
        return {k: cache[h][mask].float().mean(0) for k, h in names.items()}

    def _removed(self, sender: str, y: Tensor) -> Tensor:
        """``w_S - w̄_S`` of an MLP or the embeddings."""
        return y - self._means[sender].to(y.device, y.dtype) if self.method == "mean" else y

    def _keep(self, kept: Collection[Wire]) -> dict[str, Tensor]:
        """Per receiver input: ``[senders, 3]`` (which position classes each sender reaches it at); the senders
        that are always kept reach every receiver."""
        keep: dict[str, Tensor] = {}
        if self._fixed:
            for r in self.receivers():
                keep[r] = torch.zeros(len(self.senders), len(CLASSES))
                keep[r][self._fixed] = 1.0
        for w in kept:
            self.check(w)
            k = keep.setdefault(w.receiver, torch.zeros(len(self.senders), len(CLASSES)))
            if w.positions == "all":
                k[self._index[w.sender]] = 1.0
            else:
                k[self._index[w.sender], CLASSES.index(w.positions)] = 1.0
        return keep

    @staticmethod
    def _stream(keep: Tensor | None, base: Float[Tensor, "b p d"], deltas: Float[Tensor, "senders b p d"],
                classes: Float[Tensor, "3 b p"], full: Float[Tensor, "b p d"] | None = None) -> Float[Tensor, "b p d"]:
        """``B + Σ_{kept} m_c ⊙ (w_S - w̄_S)`` for one receiver input (``deltas``: every sender's ``w_S - w̄_S``
        so far, in sender order), or, where few edges are left out, ``full - Σ_{left out} m_c ⊙ (w_S - w̄_S)``
        (``full``: the stream as the run wrote it, every edge kept)."""
        if keep is None:
            return base
        n = deltas.shape[0]
        keep = keep[:n].to(classes.dtype)
        rows = keep.any(dim=1).nonzero().flatten()
        if full is not None:
            gone = (keep < 1).any(dim=1).nonzero().flatten()
            if len(gone) < len(rows):
                if not len(gone):
                    return full
                coef = torch.einsum("sc,cbp->sbp", 1 - keep[gone], classes)
                return full - torch.einsum("sbp,sbpd->bpd", coef, deltas[gone].to(coef.dtype)).to(full.dtype)
        if len(rows) * 4 < n:  # few senders kept: gather them
            coef = torch.einsum("sc,cbp->sbp", keep[rows], classes)
            return base + torch.einsum("sbp,sbpd->bpd", coef, deltas[rows].to(coef.dtype)).to(base.dtype)
        coef = torch.einsum("sc,cbp->sbp", keep, classes)
        return base + torch.einsum("sbp,sbpd->bpd", coef, deltas.to(coef.dtype)).to(base.dtype)

    def chunk_logprobs(self, index: int, kept: Collection[Wire]) -> Float[Tensor, " n_reads"]:
        """Log-probabilities at the reads of batch ``index`` (``self.pp.chunks[index]``) with only ``kept``
        carrying activations."""
        return self._chunk(index, self._keep(kept))

    def _chunk(self, index: int, keep: dict[str, Tensor]) -> Tensor:
        """Read log-probs of chunk ``index`` with only the kept wires carrying activations."""

        model, pp = self.model, self.pp
        chunk, prefix = pp.chunks[index], pp.prefixes.get(index)
        masks = pp.masks(chunk)
        classes = torch.stack([masks["items"], masks["decision"] & ~masks["items"], masks["other"]]).float()
        x = prefix.hidden(0)
        buf = torch.zeros(len(self.senders), *x.shape, dtype=torch.float32, device=x.device)
        filled = 1  # senders 0..filled-1 have written: the embeddings first
        buf[0] = self._removed(EMBED, x)
        base = x - buf[0].to(x.dtype)
        b = prefix.batch_size
        for layer in range(model.n_layers):
            inputs = [i for i in self.inputs if i.layer == layer]
            streams: list[Tensor] = []
            slot: dict[str, int] = {}
            key_of = {i.name: _stream_key(keep.get(i.name), filled) for i in inputs}
            for i in inputs:  # receivers that read the same senders at the same positions share one copy
                if key_of[i.name] not in slot:
                    slot[key_of[i.name]] = len(streams)
                    streams.append(self._stream(keep.get(i.name), base, buf[:filled], classes, x))
            hooks = sorted({s.hook for i in inputs for s in i.sites})
            got = read_block(model, prefix, layer, hooks, len(streams), hidden=torch.cat(streams)) if hooks else {}
            put: dict[str, list[tuple[InputSite, Tensor]]] = {}
            for i in inputs:
                j = slot[key_of[i.name]]
                for s in i.sites:
                    put.setdefault(s.hook, []).append((s, got[s.hook][j * b:(j + 1) * b, :, s.start:s.stop]))
            layer_heads = [h for h in self.heads if h.layer == layer]
            zs: dict[HeadRef, Tensor] = {}
            state: dict[str, Tensor] = {}

            def overwrite(entries: list[tuple[InputSite, Tensor]]) -> Any:
                def hook(v: Tensor, hook: Any = None) -> Tensor:
                    out = v.clone(memory_format=torch.contiguous_format)
                    flat = out.flatten(2) if out.dim() == 4 else out
                    for s, value in entries:
                        flat[..., s.start:s.stop] = value.to(flat.dtype)
                    return out
                return hook

            def record(head: HeadRef) -> Any:
                site = model.head_site(head)

                def hook(v: Tensor, hook: Any = None) -> Tensor:
                    zs[head] = flat_channels(v.detach(), site)[..., site.columns]
                    return v
                return hook

            def heads_written(like: Tensor) -> Tensor:
                """Fill the layer's heads' ``w_S - w̄_S`` into ``buf``; their sum."""
                for h in layer_heads:
                    buf[self._index[h.name]] = linear_write(model, self.repl[h], zs[h])
                rows = [self._index[h.name] for h in layer_heads]
                return buf[rows].sum(0).to(like.dtype) if rows else torch.zeros_like(like)

            def mid(v: Tensor, hook: Any = None) -> Tensor:
                state["base"] = base + (v - x) - heads_written(v)
                n = max(self._index[h.name] for h in layer_heads) + 1 if layer_heads else filled
                return self._stream(keep.get(mlp_name(layer)), state["base"], buf[:n], classes, v).to(v.dtype)

            def mlp_out(v: Tensor, hook: Any = None) -> Tensor:
                state["mlp"] = v.detach()
                return v

            fns = [(name, overwrite(entries)) for name, entries in put.items()]
            fns += [(model.head_site(h).hook, record(h)) for h in layer_heads]
            has_mlp = model.mlp_hook(layer, "out") is not None
            if has_mlp:
                fns += [(model.mixed_stream_hook(layer), mid), (model.mlp_hook(layer, "out"), mlp_out)]
            with model.hooks(fns):
                y = replay(model, prefix, layer, 1, hidden=x, stop=layer + 1)
            if has_mlp:
                name = mlp_name(layer)
                buf[self._index[name]] = self._removed(name, state["mlp"])
                base = state["base"] + (self._means[name].to(base.dtype) if self.method == "mean" else 0)
                filled = self._index[name] + 1
            else:
                base = base + (y - x) - heads_written(y)
                filled = max((self._index[h.name] + 1 for h in layer_heads), default=filled)
            x = y
        rows, pos, inverse = chunk.reads
        rows, pos = rows.to(x.device), pos.to(x.device)
        final = self._stream(keep.get(LOGITS), base, buf[:filled], classes, x)
        return head_logprobs(output_head(model), final[rows, pos], chunk.read_tok, inverse.to(x.device))

    @torch.no_grad()
    def run(self, sets: Sequence[Collection[Wire]]) -> list[CandidateScores]:
        """Scores of the task with only each element of ``sets`` (a collection of wires) kept."""
        if isinstance(sets, (Wire, str)) or not isinstance(sets, Sequence):
            raise InputError(f"sets must be a list of wire collections, got {type(sets).__name__}")
        out = []
        for kept in sets:
            keep = self._keep(kept)
            table = ScoreTable(self.pp.plan)
            for i, chunk in enumerate(self.pp.chunks):
                table.add(chunk, self._chunk(i, keep))
            out.append(table.result())
        return out

    @torch.no_grad()
    def run_without(self, sets: Sequence[Collection[Wire]]) -> list[CandidateScores]:
        """Scores of the task with every edge kept except those of each element of ``sets``: the exact effect of
        leaving out one edge (or a few), any sender and receiver (an MLP's, the embeddings')."""
        out = []
        for gone in sets:
            keep = {r: torch.ones(len(self.senders), len(CLASSES)) for r in self.receivers()}
            for w in gone:
                self.check(w)
                if w.positions == "all":
                    keep[w.receiver][self._index[w.sender]] = 0.0
                else:
                    keep[w.receiver][self._index[w.sender], CLASSES.index(w.positions)] = 0.0
            table = ScoreTable(self.pp.plan)
            for i, chunk in enumerate(self.pp.chunks):
                table.add(chunk, self._chunk(i, keep))
            out.append(table.result())
        return out

    def clean(self) -> CandidateScores:
        """Scores of the intact model."""
        return self.pp.clean()



def whole_circuit(fx: Any, scores: dict[Wire, float] | None = None, roles: dict[str, str] | None = None,
                  n_layers: int | None = None) -> dict[str, Any] | None:
    """The smallest edge circuit of an edge faithfulness curve (:func:`~gna_interp.circuits.sufficiency.edge_faithfulness`)
    as the report's graph reads it (``circuit.json``'s ``whole``): ``kept`` with its interval ``low``-``high``,
    ``nodes`` (``name``, ``kind`` head / mlp / embed / logits, ``layer``, ``role``) and ``edges`` (``sender``,
    ``receiver`` a node, ``input`` q / k / v / other / mlp / logits, ``positions``, ``score`` each wire's screen
    score (``fx.scores``), ``effect`` the edge's own contribution within the circuit where measured
    (minimality), ``low``/``high`` None). An input shared by several heads (a KV group) is drawn into each of them
    that the circuit keeps as a sender (else into the first). None when no ranked circuit keeps the threshold."""
    if fx.smallest is None:
        return None
    res = next(r for s, _, _, r in fx.points if s == "smallest")
    lo, hi = fx.interval(res)
    scores = scores or {}
    alive = {w.sender for w in fx.smallest}
    roles = roles or {}
    edges = []
    for w in fx.smallest:
        names, inp = receiver_nodes(w.receiver)
        targets = [(h, inp) for h in ([h for h in names if h in alive] or names[:1])]
        effect = fx.minimality.get(w)
        for receiver, inp in targets:
            edges.append({"sender": w.sender, "receiver": receiver, "input": inp, "positions": w.positions,
                          "score": _finite(scores.get(w)), "effect": _finite(effect), "low": None, "high": None})
    nodes = {n: Node.parse(n) for e in edges for n in (e["sender"], e["receiver"])}
    last = n_layers if n_layers is not None else 1 + max(
        [x.layer for x in nodes.values() if x.layer is not None], default=0)

    def node(name: str) -> dict[str, Any]:
        x = nodes[name]
        return {"name": name, "kind": x.kind, "layer": last if x.layer is None else x.layer,
                "role": roles.get(name, "") if x.kind == "head" else ""}

    names = list(dict.fromkeys(n for e in edges for n in (e["sender"], e["receiver"])))
    return {"metric": fx.metric, "method": fx.method, "threshold": fx.threshold, "kept": _finite(fx.fraction(res)),
            "low": _finite(lo), "high": _finite(hi), "n_edges": len(fx.smallest),
            "nodes": [node(n) for n in names], "edges": edges}


def _finite(v: Any) -> float | None:
    """``v`` as a float, or None where it is missing or not finite (JSON has no NaN)."""
    if v is None:
        return None
    f = float(v)
    return f if f == f and abs(f) != float("inf") else None
